"""The gated delta rule in float64, in chunked (WY / UT-transform) form: the torch ground truth of
op_type `gdn` (decode, MTP, varlen prefill), written from the mathematics.

Per value head, with the state S in the definitions' k-last layout [V, K] (row v holds k-space):

    g_t    = exp(-exp(A_log) * softplus(a_t + dt_bias))         decay, in (0, 1]
    beta_t = sigmoid(b_t)                                       update strength
    u_t    = beta_t * (v_t - g_t S_{t-1} k_t)                   the corrected value (delta)
    S_t    = g_t S_{t-1} + u_t k_t^T
    o_t    = scale * S_t q_t

Query/key head h serves value heads h * (HV / H) .. (h + 1) * (HV / H) - 1 (consecutive).

Instead of stepping token by token (the references' loop), a chunk of C tokens is solved at once.
With gamma_i the decay accumulated from the chunk's start to token i (a cumulative sum of log g,
never a product of small numbers) and Gamma_ij = gamma_i / gamma_j, unrolling the recurrence gives

    S_i = gamma_i S_0 + sum_{j <= i} Gamma_ij u_j k_j^T
    u_i + beta_i sum_{j < i} Gamma_ij (k_i . k_j) u_j = beta_i (v_i - gamma_i S_0 k_i)

a unit lower-triangular system (I + diag(beta) L) U = diag(beta) (V - diag(gamma) K S_0^T), solved
with `torch.linalg.solve_triangular`; then O = scale (diag(gamma) Q S_0^T + tril(Gamma . Q K^T) U)
and the chunk's final state gamma_C S_0 + U^T diag(Gamma_Cj) K. Every sequence is cut into chunks
of CHUNK tokens. `recurrence` is the plain token-by-token form, used by the error model (it carries
the absolute values along) and by the unit tests, which hold the two forms together.

Semantics the definitions fix and this module follows: decode and prefill return the updated state
(prefill: one per sequence, in sequence order; a sequence with no token returns its initial state,
the state after zero tokens, where the public prefill reference leaves zeros), MTP returns the pool *unchanged*
(its reference runs with state updates disabled: a verification pass) and, where the definition
declares `intermediate_states_buffer` as an output (written in place), row i's state after each of
its tokens t at [i, t]: inside a chunk S_i = gamma_i S_0 + U^T diag(Gamma_ij) K, from the same solve.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

F64 = torch.float64
CHUNK = 16


def gates(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(log g, beta) in float64, shaped like `a` and `b`: log g = -exp(A_log) * softplus(a + dt_bias)."""
    log_g = -torch.exp(x["A_log"].to(F64)) * F.softplus(x["a"].to(F64) + x["dt_bias"].to(F64))
    return log_g, torch.sigmoid(x["b"].to(F64))


def scale_of(x: dict, head_size: int) -> float:
    s = x.get("scale")
    s = float(s) if s is not None else 0.0
    return s if s != 0.0 else 1.0 / math.sqrt(head_size)


def expand_heads(t: torch.Tensor, hv: int, dim: int) -> torch.Tensor:
    """Query/key heads repeated to the value heads: head h serves hv / h consecutive value heads."""
    h = t.shape[dim]
    if hv % h:
        raise ValueError(f"{hv} value heads are not a multiple of {h} query/key heads")
    return t.repeat_interleave(hv // h, dim=dim) if hv != h else t


def chunk_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: torch.Tensor, beta: torch.Tensor,
               s0: torch.Tensor, scale: float, chunk: int = CHUNK, *, states: bool = False) -> tuple[torch.Tensor, ...]:
    """One sequence, every value head at once. q, k [L, HV, K]; v [L, HV, V]; log_g, beta [L, HV];
    s0 [HV, V, K]. Returns (o [L, HV, V], S_L [HV, V, K]), float64; with `states`, also the state after
    every token [L, HV, V, K] (MTP's intermediate states)."""
    length = q.shape[0]
    out = torch.empty(v.shape, dtype=F64, device=v.device)
    every = torch.empty(length, *s0.shape, dtype=F64, device=v.device) if states else None
    s = s0.to(F64)
    for c0 in range(0, length, chunk):
        sl = slice(c0, min(length, c0 + chunk))
        qc, kc, vc = (t[sl].to(F64).transpose(0, 1) for t in (q, k, v))  # [HV, C, *]
        lg = log_g[sl].to(F64).transpose(0, 1).cumsum(-1)  # [HV, C]: log gamma_i
        bc = beta[sl].to(F64).transpose(0, 1)  # [HV, C]
        c = qc.shape[1]
        diff = lg[:, :, None] - lg[:, None, :]  # log Gamma_ij
        lower = torch.ones(c, c, dtype=torch.bool, device=v.device).tril()
        gam = torch.where(lower, diff, -math.inf).exp()  # Gamma_ij for j <= i, 0 above
        gamma = lg.exp()
        strict = gam.tril(-1) * (kc @ kc.transpose(-1, -2))  # Gamma_ij (k_i . k_j), j < i
        system = torch.eye(c, dtype=F64, device=v.device) + bc[:, :, None] * strict
        rhs = bc[:, :, None] * (vc - gamma[:, :, None] * (kc @ s.transpose(-1, -2)))  # [HV, C, V]
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        o = gamma[:, :, None] * (qc @ s.transpose(-1, -2)) + (gam * (qc @ kc.transpose(-1, -2))) @ u
        out[sl] = (scale * o).transpose(0, 1)
        if every is not None:  # S_i = gamma_i S_0 + sum_j Gamma_ij u_j k_j^T, for each i of the chunk
            every[sl] = (gamma[:, :, None, None] * s[:, None] + torch.einsum("hij,hjv,hjk->hivk", gam, u, kc)
                         ).transpose(0, 1)
        tail = (lg[:, -1:] - lg).exp()  # Gamma_Cj
        s = gamma[:, -1, None, None] * s + u.transpose(-1, -2) @ (tail[:, :, None] * kc)
    return (out, s, every) if states else (out, s)


def recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: torch.Tensor, beta: torch.Tensor,
               s0: torch.Tensor, scale: float, *, absolute: bool = False,
               states: bool = False) -> tuple[torch.Tensor, ...]:
    """Token by token, batched over leading dims: q, k [..., T, HV, K]; v [..., T, HV, V]; log_g, beta
    [..., T, HV]; s0 [..., HV, V, K]. Returns (o [..., T, HV, V], S_T), float64; with `absolute`, also
    the same recurrence over absolute values (|S_0|, |u|, |k|, |q|): (o_abs, S_abs), the error scales;
    with `states`, last, the state after every token [..., T, HV, V, K] (with `absolute`: the |S_t|-like)."""
    s = s0.to(F64)
    sa = s.abs() if absolute else None
    outs, outs_abs, every = [], [], []
    for t in range(q.shape[-3]):
        qt, kt, vt = (x[..., t, :, :].to(F64) for x in (q, k, v))
        g = log_g[..., t, :].to(F64).exp()[..., None, None]
        bt = beta[..., t, :].to(F64)[..., None]
        s = g * s
        u = bt * (vt - (s @ kt[..., None])[..., 0])
        s = s + u[..., None] * kt[..., None, :]
        outs.append(scale * (s @ qt[..., None])[..., 0])
        if absolute:
            # the prediction g S k and the update u k^T each add their absolute terms
            pred = (g * sa) @ kt.abs()[..., None]
            ua = bt * (vt.abs() + pred[..., 0])
            sa = g * sa + ua[..., None] * kt.abs()[..., None, :]
            outs_abs.append(scale * (sa @ qt.abs()[..., None])[..., 0])
        if states:
            every.append(sa if absolute else s)
    o = torch.stack(outs, dim=-3)
    tail = (torch.stack(every, dim=-4),) if states else ()
    if absolute:
        return (o, s, torch.stack(outs_abs, dim=-3), sa, *tail)
    return (o, s, *tail)


# -- the three stages, on a definition's inputs -------------------------------------------------------
def _expanded(x: dict, dim: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    hv = x["v"].shape[dim]
    return expand_heads(x["q"], hv, dim), expand_heads(x["k"], hv, dim), hv


def _state_input(x: dict) -> torch.Tensor:
    return x["state"] if "state" in x else x["initial_state"]


def _zeros_if_none(state, shape, device) -> torch.Tensor:
    return torch.zeros(shape, dtype=F64, device=device) if state is None else state.to(F64)


def prefill(x: dict, *, absolute: bool = False) -> tuple:
    q, k, hv = _expanded(x, 1)
    v, cu = x["v"], [int(c) for c in x["cu_seqlens"].tolist()]
    head_size = q.shape[-1]
    scale = scale_of(x, head_size)
    log_g, beta = gates(x)
    n = len(cu) - 1
    states = _zeros_if_none(_state_input(x), (n, hv, v.shape[-1], head_size), v.device)
    out = torch.zeros(v.shape, dtype=F64, device=v.device)
    new = torch.zeros_like(states)
    out_abs, new_abs = torch.zeros_like(out), torch.zeros_like(new)
    for i in range(n):
        sl = slice(cu[i], cu[i + 1])
        if cu[i + 1] <= cu[i]:  # an empty sequence: its state after no token is its initial state
            new[i] = states[i]
            if absolute:
                new_abs[i] = states[i].abs()
            continue
        if absolute:
            o, s, oa, sa = recurrence(q[sl], k[sl], v[sl], log_g[sl], beta[sl], states[i], scale, absolute=True)
            out_abs[sl], new_abs[i] = oa, sa
        else:
            o, s = chunk_scan(q[sl], k[sl], v[sl], log_g[sl], beta[sl], states[i], scale)
        out[sl], new[i] = o, s
    return (out_abs, new_abs) if absolute else (out, new)


def _rows(x: dict, states: torch.Tensor, *, absolute: bool, every: bool = False) -> tuple:
    """Decode / MTP rows: q, k [B, T, H, K]; v [B, T, HV, V]; states [B, HV, V, K]. Each row is a
    sequence of T tokens (chunked form; `absolute`: the recurrence with absolute values). Returns
    (o, S_T), and with `every` the state after each token [B, T, HV, V, K] last."""
    q, k, _ = _expanded(x, 2)
    v = x["v"]
    scale = scale_of(x, q.shape[-1])
    log_g, beta = gates(x)
    if absolute:
        _, _, oa, sa, *rest = recurrence(q, k, v, log_g, beta, states, scale, absolute=True, states=every)
        return (oa, sa, *rest)
    per_row = [chunk_scan(q[r], k[r], v[r], log_g[r], beta[r], states[r], scale, states=every)
               for r in range(q.shape[0])]
    return tuple(torch.stack(parts) for parts in zip(*per_row, strict=True))


def decode(x: dict, *, absolute: bool = False) -> tuple:
    v = x["v"]
    shape = (v.shape[0], v.shape[2], v.shape[3], x["q"].shape[-1])
    return _rows(x, _zeros_if_none(_state_input(x), shape, v.device), absolute=absolute)


BUFFER = "intermediate_states_buffer"


def mtp(x: dict, *, absolute: bool = False, buffer: bool = False) -> tuple:
    """(output, pool unchanged) and, with `buffer`, the intermediate-state buffer after the call: row i's
    state after its token t at [i, t] (by row, not pool slot), every other element as it came."""
    pool = x["initial_state"].to(F64)
    slots = x["initial_state_indices"].to(torch.int64)
    out, _, *every = _rows(x, pool[slots], absolute=absolute, every=buffer)
    # a verification pass: the pool comes back as it was (state updates disabled)
    result = (out, pool.abs() if absolute else pool.clone())
    if not buffer:
        return result
    written = x[BUFFER].to(F64)
    written = written.abs() if absolute else written.clone()
    steps = every[0].shape[1]
    written[: every[0].shape[0], :steps] = every[0]
    return (*result, written)


def stage(definition) -> str:
    from ..inputs.gdn import stage as input_stage

    return input_stage(definition)


def run(definition, x: dict, *, absolute: bool = False) -> tuple:
    st = stage(definition)
    if st == "mtp":
        return mtp(x, absolute=absolute, buffer=BUFFER in definition.outputs)
    return {"prefill": prefill, "decode": decode}[st](x, absolute=absolute)
