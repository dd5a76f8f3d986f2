"""Independent torch ground truth: runs anywhere, so CI checks every reference on a CPU.

Independent means a second computation of the same mathematics, never the definition's reference
under another name: library operators where torch has them (`F.rms_norm`, `F.linear`,
`F.scaled_dot_product_attention`, `F.silu`), complex multiplication for RoPE, this module's own
routing and block dequantisation for MoE, and float64 throughout, so that what is compared is
the reference's float32-then-round against a result whose own error is negligible.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from .. import semantics as sem
from . import torch_dsa
from .base import Adapter, Call

F64 = torch.float64


def _values(call: Call) -> dict:
    return call.inputs.values


# -- norms ------------------------------------------------------------------------------------------
def rmsnorm(call: Call) -> tuple:
    d, x = call.definition, _values(call)
    eps = sem.eps(d, x)
    h = x["hidden_states"].to(F64)
    if sem.is_fused_add(d):
        h = h + x["residual"].to(F64)  # the norm reads the unrounded sum
    out = F.rms_norm(h, (h.shape[-1],), x["weight"].to(F64), eps)
    return sem.norm_outputs(d, out, h)


# -- gemm -------------------------------------------------------------------------------------------
def gemm(call: Call) -> tuple:
    x = _values(call)
    return (F.linear(x["A"].to(F64), x["B"].to(F64)),)


# -- attention --------------------------------------------------------------------------------------
def _sdpa_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_offset: int | None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [Hq, Lq, D], k [Hk, Lk, D], v [Hk, Lk, Dv] (Hq a multiple of Hk, consecutive query heads
    sharing a kv head) -> output [Lq, Hq, Dv] and base-2 lse [Lq, Hq]. A query that sees no key
    gets output 0 and lse -inf (the definitions' convention for an empty softmax)."""
    hq, lq, _ = q.shape
    hk, lk, dv = v.shape
    if lk == 0:
        return (torch.zeros(lq, hq, dv, dtype=F64, device=q.device),
                torch.full((lq, hq), -math.inf, dtype=F64, device=q.device))
    group = hq // hk
    k = k.repeat_interleave(group, dim=0) if group > 1 else k
    v = v.repeat_interleave(group, dim=0) if group > 1 else v
    if causal_offset is None:
        visible = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    else:  # bottom-right aligned: query i sits at kv position causal_offset + i
        i = torch.arange(lq, device=q.device)[:, None]
        visible = torch.arange(lk, device=q.device)[None, :] <= i + causal_offset
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)
    scores = torch.einsum("hqd,hkd->hqk", q, k) * scale
    scores = scores.masked_fill(~visible, -math.inf)
    peak = scores.amax(dim=-1, keepdim=True)
    lse = peak.squeeze(-1) + torch.log(torch.exp(scores - peak.nan_to_num(neginf=0.0)).sum(dim=-1))
    seen = visible.any(dim=-1)[None, :]
    out = torch.where(seen[..., None], out, 0.0)
    lse = torch.where(seen, lse, -math.inf)
    return out.transpose(0, 1), (lse / math.log(2.0)).transpose(0, 1)


def _requests(call: Call):
    """Per request: (query rows, token slots or kv range). Decode is prefill with one query each."""
    d, x = call.definition, _values(call)
    kv_indptr = x["kv_indptr"].to(torch.int64)
    n = kv_indptr.numel() - 1
    if "qo_indptr" in x:
        qo = x["qo_indptr"].to(torch.int64).cpu().tolist()
    else:
        qo = list(range(n + 1))
    if "kv_indices" in x:  # paged
        page = sem.page_size(d)
        last = sem.last_page_lens(kv_indptr, page, x.get("kv_last_page_len"))
        slots = sem.request_token_slots(kv_indptr, x["kv_indices"], page, last)
    else:  # ragged: contiguous kv rows
        kv = kv_indptr.cpu().tolist()
        slots = [torch.arange(kv[b], kv[b + 1], device=kv_indptr.device) for b in range(n)]
    return [(qo[b], qo[b + 1], slots[b]) for b in range(n)]


def _attention(call: Call, queries, keys, values, num_rows: int, heads: int, dv: int) -> tuple:
    d, x = call.definition, _values(call)
    scale = sem.sm_scale(x, queries.shape[-1])
    causal = sem.is_causal(d)
    out = torch.zeros(num_rows, heads, dv, dtype=F64, device=queries.device)
    lse = torch.full((num_rows, heads), -math.inf, dtype=F64, device=queries.device)
    for q0, q1, slots in _requests(call):
        if q1 == q0:
            continue
        q = queries[q0:q1].transpose(0, 1)  # [H, Lq, D]
        k, v = keys(slots), values(slots)
        offset = k.shape[1] - (q1 - q0) if causal else None
        o, s = _sdpa_with_lse(q, k, v, scale, offset)
        out[q0:q1], lse[q0:q1] = o, s
    computed = {"output": out, "lse": lse}
    return tuple(computed[name] for name in d.outputs)  # what the definition declares, in its order


ATTENTION_OUTPUTS = ("output", "lse")


def _attention_applies(*names: str):
    """The inputs it reads, and outputs it computes: a definition that declares only `output` gets only
    that (a second, undeclared lse would be compared with nothing)."""
    def applies(d) -> str | None:
        extra = [o for o in d.outputs if o not in ATTENTION_OUTPUTS]
        computes = ", ".join(ATTENTION_OUTPUTS)
        return sem.missing_inputs(d, names) or (
            f"declares output(s) {', '.join(extra)}; it computes only {computes}" if extra else None)
    return applies


# Each request's keys and values are gathered first and widened to float64 after: a cache of 2**31
# elements (the large_offsets case) must not be copied whole, let alone at 4x its bytes.
def gqa(call: Call) -> tuple:
    x = _values(call)
    q = x["q"].to(F64)
    if "k_cache" in x:  # paged: [pages, page_size, Hk, D] -> flat token slots (a view)
        kc, vc = x["k_cache"].flatten(0, 1), x["v_cache"].flatten(0, 1)
    else:
        kc, vc = x["k"], x["v"]

    def keys(slots):
        return kc[slots].to(F64).transpose(0, 1)  # [Hk, Lk, D]

    def values(slots):
        return vc[slots].to(F64).transpose(0, 1)

    return _attention(call, q, keys, values, q.shape[0], q.shape[1], vc.shape[-1])


def mla(call: Call) -> tuple:
    """Absorbed MLA: keys are [ckv | kpe] (one latent head shared by all query heads), values ckv."""
    x = _values(call)
    q = torch.cat([x["q_nope"], x["q_pe"]], dim=-1).to(F64)
    ckv, kpe = x["ckv_cache"].flatten(0, 1), x["kpe_cache"].flatten(0, 1)

    def keys(slots):
        return torch.cat([ckv[slots], kpe[slots]], dim=-1).to(F64)[None]  # [1, Lk, 576]

    def values(slots):
        return ckv[slots].to(F64)[None]

    return _attention(call, q, keys, values, q.shape[0], q.shape[1], ckv.shape[-1])


def single(call: Call) -> tuple:
    """single_decode / single_prefill: the ragged case with one request (kv_indptr [0, kv_len], qo_indptr
    [0, qo_len]) through `gqa`; decode's q [heads, dim] is one query token, its outputs lose that axis again."""
    x = _values(call)
    q, k = x["q"], x["k"]
    decode = q.dim() == 2
    rows = 1 if decode else q.shape[0]
    ragged = {"q": q[None] if decode else q, "k": k, "v": x["v"],
              "qo_indptr": torch.tensor([0, rows], dtype=torch.int64, device=q.device),
              "kv_indptr": torch.tensor([0, k.shape[0]], dtype=torch.int64, device=q.device)}
    if "sm_scale" in x:
        ragged["sm_scale"] = x["sm_scale"]
    one = dataclasses.replace(call, inputs=dataclasses.replace(call.inputs, values=ragged))
    out = gqa(one)
    return tuple(t[0] for t in out) if decode else out


# -- rope / activation ------------------------------------------------------------------------------
def rope(call: Call) -> tuple:
    """A rotation by the angle whose cos/sin the cache row holds is a complex multiplication."""
    d, x = call.definition, _values(call)
    neox = sem.rope_is_neox(d)
    cache = x["cos_sin_cache"][x["positions"].to(torch.int64)].to(F64)  # the rows used, not the whole cache
    half = cache.shape[-1] // 2
    rot = torch.complex(cache[:, :half], cache[:, half:])[:, None, :]  # [T, 1, half]

    def apply(t: torch.Tensor) -> torch.Tensor:
        t = t.to(F64)
        rd = 2 * half
        if neox:  # pairs (i, i + half)
            z = torch.complex(t[..., :half], t[..., half:rd]) * rot
            rotated = torch.cat([z.real, z.imag], dim=-1)
        else:  # pairs (2i, 2i + 1)
            z = torch.view_as_complex(t[..., :rd].reshape(*t.shape[:-1], half, 2).contiguous()) * rot
            rotated = torch.view_as_real(z).flatten(-2)
        return torch.cat([rotated, t[..., rd:]], dim=-1)

    return tuple(apply(x[n]) for n in sem.rope_rotated(d))


def silu_and_mul(call: Call) -> tuple:
    x = _values(call)["input"].to(F64)
    half = x.shape[-1] // 2
    return (F.silu(x[..., :half]) * x[..., half:],)


# -- sampling ---------------------------------------------------------------------------------------
def _draws_tokens(d) -> str | None:
    """FlashInfer's fi_trace files renorm / softmax / masking ops under op_type `sampling` too: this
    ground truth draws token ids, so it applies only where the first output is integer ids."""
    first = next(iter(d.outputs.values()), None)
    if first is not None and first.dtype is not None and first.dtype.is_float:
        return f"the first output ({next(iter(d.outputs))}) is {first.dtype.value}, not sampled token ids"
    return None


def _not_top_k_top_p(d) -> str | None:
    """min-p, and the samplers inputs/samplers.py makes inputs for, are torch_samplers.py's (this one would
    read past a min_p input)."""
    from ..inputs.samplers import kind

    if "min_p" in d.inputs or kind(d):
        return "a min-p, plain or logits sampler (torch_samplers.py)"
    return None


def filtered_distribution(call: Call, *, top_p_shift: float | torch.Tensor = 0.0) -> torch.Tensor:
    """The distribution a sampling definition draws from, float64 [batch, vocab]: top-k, renormalise,
    then top-p on the renormalised mass (FlashInfer's top_k_first order), renormalise.

    Ties are decided by value, as FlashInfer's sampling kernels decide them (docs/boundary/sampling.md):
    top-k keeps every token at least as probable as the k-th most probable (all of a tie at the k-th
    value); top-p keeps a token when the mass of the tokens strictly more probable than it is below
    top_p, so tokens of equal probability are kept or dropped together. top_k <= 0 or >= vocab and
    top_p >= 1 disable their filter.

    `top_p_shift` (a float, or one per row) moves the top-p cut by that much mass: a positive shift gives a
    support that holds every token a correct float32 implementation may keep at the boundary, a negative
    one the tokens every such implementation keeps.
    """
    return filtered_distributions(call, [top_p_shift])[0]


def filtered_distributions(call: Call, shifts) -> list[torch.Tensor]:
    """filtered_distribution at several top-p shifts, sharing one sort."""
    x = _values(call)
    probs = x["probs"].to(F64)
    batch, vocab = probs.shape
    dist = probs.clone()
    if "top_k" in x:
        k = _per_row(x["top_k"], batch, probs.device).to(torch.int64)
        k = torch.where((k <= 0) | (k >= vocab), vocab, k)
        kth = torch.stack([torch.kthvalue(-probs[r], int(k[r])).values for r in range(batch)]).neg()
        dist = torch.where(probs >= kth[:, None], dist, 0.0)
        dist = dist / dist.sum(dim=-1, keepdim=True)
    if "top_p" not in x:
        return [dist for _ in shifts]
    p = _per_row(x["top_p"], batch, probs.device).to(F64)
    greater = mass_strictly_greater(dist)
    out = []
    for shift in shifts:
        cut = p + (shift.to(F64) if isinstance(shift, torch.Tensor) else shift)
        keep = (greater < cut[:, None]) | (greater == 0) | (p[:, None] >= 1)
        kept = torch.where(keep, dist, 0.0)
        out.append(kept / kept.sum(dim=-1, keepdim=True))
    return out


def mass_strictly_greater(dist: torch.Tensor) -> torch.Tensor:
    """[batch, vocab]: for each token, the total probability of the tokens of the row strictly more
    probable than it (suffix sums over the ascending sort; equal values share one)."""
    ascending = dist.sort(dim=-1).values
    suffix = torch.cat([ascending.flip(-1).cumsum(-1).flip(-1), torch.zeros_like(ascending[:, :1])], dim=-1)
    above = torch.searchsorted(ascending, dist, right=True)  # how many are <= each token's value
    return suffix.gather(1, above)


def _per_row(v, batch: int, device) -> torch.Tensor:
    if isinstance(v, torch.Tensor) and v.dim() > 0:
        return v.to(device)
    return torch.full((batch,), float(v) if not isinstance(v, torch.Tensor) else float(v.item()),
                      device=device)


def sampling(call: Call) -> tuple:
    """draws samples per row from the filtered distribution: [batch, draws] int64."""
    dist = filtered_distribution(call)
    g = torch.Generator(device=dist.device).manual_seed(call.inputs.seed + 0x5EED)
    return (torch.multinomial(dist, call.draws, replacement=True, generator=g),)


# -- moe --------------------------------------------------------------------------------------------
def _expand_blocks(scale: torch.Tensor, block: int, rows: int, cols: int) -> torch.Tensor:
    return scale.to(F64).repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)[..., :rows, :cols]


def deepseek_routing(logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int, topk_group: int,
                     scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 no-aux routing, written from its description: (expert ids [T, k], weights [T, k])."""
    scores = torch.sigmoid(logits.to(F64))
    biased = scores + bias.to(F64)[None, :]
    tokens, experts = biased.shape
    grouped = biased.reshape(tokens, n_group, experts // n_group)
    best_two = grouped.sort(dim=-1, descending=True).values[..., :2].sum(dim=-1)  # [T, n_group]
    chosen_groups = ranked_ids(best_two, topk_group)  # equal group scores: the lowest group id
    allowed = torch.zeros(tokens, n_group, dtype=torch.bool, device=logits.device)
    allowed[torch.arange(tokens, device=logits.device)[:, None], chosen_groups] = True
    candidates = torch.where(allowed[:, :, None], grouped, -math.inf).reshape(tokens, experts)
    ids = ranked_ids(candidates, top_k)
    w = scores.gather(1, ids)
    return ids, w / w.sum(dim=-1, keepdim=True) * scaling


def ranked_ids(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """The top_k ids per row by score; equal scores go to the lowest id (the definitions' convention,
    FlashInfer's routing kernels': a stable descending sort)."""
    return scores.argsort(dim=-1, descending=True, stable=True)[:, :top_k]


def renormalize_routing(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts, the top_k most probable, their probabilities renormalised to sum 1
    (Qwen-MoE with norm_topk_prob, Mixtral): (expert ids [T, k], weights [T, k]). Ranked by the logits,
    not the probabilities: float64 probabilities underflow to equal zeros where logits are 745 apart,
    and the ranking must not tie where the logits do not."""
    x = logits.to(F64)
    probs = torch.softmax(x, dim=-1)
    ids = ranked_ids(x, top_k)
    w = probs.gather(1, ids)
    return ids, w / w.sum(dim=-1, keepdim=True)


def unpack_routed(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids (int32: expert id << 16 | bfloat16 weight bits) -> (ids, float64 weights). A bfloat16
    is the high half of a float32, so the weight is the low 16 bits moved up and read as float32."""
    wide = packed.to(torch.int64)
    ids = torch.div(wide, 1 << 16, rounding_mode="floor")
    weights = ((wide % (1 << 16)) * (1 << 16)).to(torch.int32).view(torch.float32)
    return ids, weights.to(F64)


def route(definition, values: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ids and float64 weights for a MoE definition's routing (semantics.moe_routing)."""
    r = sem.moe_routing(definition)
    if r.kind == "precomputed":
        return unpack_routed(values["topk_ids"])
    if r.kind == "llama4":  # sigmoid scores, top-k (ranked by the logits: sigmoid saturates), unnormalised
        logits = values["routing_logits"].to(F64)
        ids = ranked_ids(logits, r.top_k)
        return ids, torch.sigmoid(logits).gather(1, ids)
    if r.kind == "deepseek":
        return deepseek_routing(values["routing_logits"], values["routing_bias"], r.top_k, r.n_group, r.topk_group,
                                float(values.get("routed_scaling_factor", 1.0)))
    ids, w = renormalize_routing(values["routing_logits"], r.top_k)
    return ids, w * float(values.get("routed_scaling_factor", 1.0))


def dequantized_activations(definition, values: dict) -> torch.Tensor:
    """hidden_states in float64: times its per-token 128-wide block scales (stored transposed) when fp8."""
    hs = values["hidden_states"]
    if "hidden_states_scale" not in values:
        return hs.to(F64)
    block = sem.moe_block(definition, values)
    return hs.to(F64) * values["hidden_states_scale"].to(F64).T.repeat_interleave(block, dim=1)[:, :hs.shape[1]]


def moe(call: Call) -> tuple:
    """Dequantise, route with this module's code, run each local expert that receives tokens:
    GEMM1 rows [up; gate], silu on the gate (second) half, GEMM2, weighted sum. Per-tensor fp8
    scales each expert's GEMM outputs instead (up and gate halves separately)."""
    return (_moe(call.definition, _values(call)),)


def moe_operand_scale(definition, values: dict) -> torch.Tensor:
    """The error model's scale of a MoE output (verdict/errormodel.py): the sum of the absolute terms of
    the sums that make each element, sum_e |w_e| sum_i |act_e,i| |W2_e,c,i|: GEMM2 and the weighted sum over
    experts, where the outputs cancel, with the true activation (GEMM1 and silu keep their signs)."""
    return _moe(definition, values, absolute=True)


def _moe(d, x: dict, absolute: bool = False) -> torch.Tensor:
    block = sem.moe_block(d, x)
    act = dequantized_activations(d, x)
    tokens, hidden = act.shape
    ids, weights = route(d, x)
    on_input = sem.moe_routing(d).scales_input  # Llama-4 scales each token's input, not its output
    offset = sem.expert_offset(d, x)
    w1, w2 = x["gemm1_weights"], x["gemm2_weights"]
    s1, s2 = x.get("gemm1_weights_scale"), x.get("gemm2_weights_scale")
    inter = w2.shape[-1]
    per_expert = [x[n].to(F64) if n in x else None for n in sem.MOE_OUTPUT_SCALES]
    out = torch.zeros(tokens, hidden, dtype=F64, device=act.device)
    for e in range(w1.shape[0]):
        token_idx, slot = (ids == offset + e).nonzero(as_tuple=True)
        if token_idx.numel() == 0:
            continue
        g1 = w1[e].to(F64) * (_expand_blocks(s1[e], block, *w1.shape[1:]) if s1 is not None else 1.0)
        g2 = w2[e].to(F64) * (_expand_blocks(s2[e], block, *w2.shape[1:]) if s2 is not None else 1.0)
        w = weights[token_idx, slot][:, None]
        h = (act[token_idx] * w if on_input else act[token_idx]) @ g1.T
        up, gate = h[:, :inter], h[:, inter:]
        if per_expert[0] is not None:
            up, gate = up * per_expert[0][e], gate * per_expert[1][e]
        inner = F.silu(gate) * up
        y = inner.abs() @ g2.abs().T if absolute else inner @ g2.T
        if per_expert[2] is not None:
            y = y * (per_expert[2][e].abs() if absolute else per_expert[2][e])
        out.index_add_(0, token_idx, y if on_input else y * (w.abs() if absolute else w))
    return out


# -- mamba ------------------------------------------------------------------------------------------
def _per_head(t: torch.Tensor, rank: int) -> torch.Tensor:
    """A parameter given with fewer trailing axes (A [nheads], D [nheads]) broadcast to `rank` dims."""
    t = t.to(F64)
    return t.reshape(*t.shape, *([1] * (rank - t.dim())))


def selective_state_update(call: Call) -> tuple:
    """One Mamba2 decode step, written from the SSM's zero-order-hold discretisation: per request b in
    cache row s_b, head h of group g(h) = h * ngroups // nheads, channel p and state n,
    step = softplus(dt + dt_bias), S'[p, n] = exp(step * A) S[p, n] + step x[p] B_g[n],
    y[p] = sum_n C_g[n] S'[p, n] + D x[p], times silu(z) when gated. Groups are gathered with an
    index, the recurrence is one einsum per term; padded requests keep their row and output 0."""
    d, v = call.definition, _values(call)
    x = v["x"].to(F64)  # [b, h, p]
    batch, heads, _ = x.shape
    groups = v["B"].shape[1]
    group_of = torch.div(torch.arange(heads, device=x.device) * groups, heads, rounding_mode="floor")
    b_h = v["B"].to(F64).index_select(1, group_of)  # [b, h, n]
    c_h = v["C"].to(F64).index_select(1, group_of)
    step = _per_head(v["dt"], 3)
    if "dt_bias" in v:
        step = step + _per_head(v["dt_bias"], 2)
    if sem.mamba_dt_softplus(d, v):
        step = F.softplus(step)
    step = step.expand(batch, heads, x.shape[2])
    decay = torch.exp(step[..., None] * _per_head(v["A"], 3))  # [b, h, p, n]
    state = v["state"]
    if "state_batch_indices" in v:
        rows = v["state_batch_indices"].to(torch.int64)
    else:
        rows = torch.arange(batch, device=x.device)
    live = rows != sem.MAMBA_PAD_SLOT_ID
    old = state[rows.clamp(min=0)].to(F64)  # [b, h, p, n]
    new = decay * old + torch.einsum("bhp,bhn->bhpn", step * x, b_h)
    y = torch.einsum("bhpn,bhn->bhp", new, c_h)
    if "D" in v:
        y = y + _per_head(v["D"], 2) * x
    if "z" in v:
        y = y * F.silu(v["z"].to(F64))
    y = torch.where(live[:, None, None], y, 0.0)
    if len(d.outputs) == 1:
        return (y,)
    cache = state.to(F64)  # rows no live request names come back as they were
    cache[rows[live]] = new[live]
    return (y, cache)


# -- gated delta net (chunked WY form, float64: torch_gdn.py) ------------------------------------------
def gdn(call: Call) -> tuple:
    from . import torch_gdn

    return torch_gdn.run(call.definition, call.inputs.values)


def _gdn_applies(d) -> str | None:
    missing = sem.missing_inputs(d, ("q", "k", "v", "A_log", "a", "dt_bias", "b"))
    if missing:
        return missing
    if ("state" in d.inputs) == ("initial_state" in d.inputs):
        return "needs one state input (state or initial_state)"
    return None


# -- the adapters -----------------------------------------------------------------------------------
def _needs(*names: str):
    return lambda d: sem.missing_inputs(d, names)


def _rope_applies(d) -> str | None:
    return sem.missing_inputs(d, ("positions", "cos_sin_cache")) or (
        None if len(d.outputs) == len(d.inputs) - 2 else "expects one output per rotated input")


ADAPTERS = [
    Adapter("torch", "mamba_ssu", "selective state update: exp(dt * A) decay + einsum (float64)",
            selective_state_update, applies=sem.mamba_applies, params=(sem.mamba_dt_softplus,)),
    Adapter("torch", "rmsnorm", "torch.nn.functional.rms_norm (float64)", rmsnorm,
            applies=lambda d: sem.gemma_norm(d) or _needs("hidden_states", "weight")(d), params=(sem.eps,)),
    Adapter("torch", "gemm", "torch.nn.functional.linear (float64)", gemm, applies=_needs("A", "B")),
    Adapter("torch", "gqa_paged", "torch.nn.functional.scaled_dot_product_attention (float64)", gqa,
            applies=_attention_applies("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "sm_scale")),
    Adapter("torch", "gqa_ragged", "torch.nn.functional.scaled_dot_product_attention (float64)", gqa,
            applies=_attention_applies("q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale")),
    Adapter("torch", "mla_ragged", "torch.nn.functional.scaled_dot_product_attention (float64)", gqa,
            applies=_attention_applies("q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale")),
    Adapter("torch", "mla_paged", "torch.nn.functional.scaled_dot_product_attention (float64)", mla,
            applies=_attention_applies("q_nope", "q_pe", "ckv_cache", "kpe_cache", "kv_indptr", "kv_indices",
                                           "sm_scale")),
    # one request of the ragged case (`single`): the same float64 computation
    Adapter("torch", "single_decode", "torch.nn.functional.scaled_dot_product_attention (float64)", single,
            applies=_attention_applies("q", "k", "v")),
    Adapter("torch", "single_prefill", "torch.nn.functional.scaled_dot_product_attention (float64)", single,
            applies=_attention_applies("q", "k", "v")),
    Adapter("torch", "rope", "complex rotation (float64)", rope, applies=_rope_applies, params=(sem.rope_is_neox,)),
    Adapter("torch", "activation", "torch.nn.functional.silu (float64)", silu_and_mul,
            applies=lambda d: None if "silu" in d.name else "only silu_and_mul"),
    Adapter("torch", "sampling", "filtered distribution (float64) + torch.multinomial", sampling,
            applies=lambda d: _needs("probs")(d) or _draws_tokens(d) or _not_top_k_top_p(d), kind="sampler"),
    Adapter("torch", "moe", "dequantise + routing (DeepSeek-V3 / renormalize) + float64 experts", moe,
            applies=sem.moe_applies, params=(sem.moe_routing,)),
    Adapter("torch", "gdn", "gated delta rule, chunked WY form (float64)", gdn, applies=_gdn_applies),
    # dsa_paged (DeepSeek-V3.2): the math is in torch_dsa.py
    Adapter("torch", "dsa_paged", "gather selected slots + torch.nn.functional.scaled_dot_product_attention (float64)",
            torch_dsa.sparse_attention, applies=torch_dsa.attention_applies),
    Adapter("torch", "dsa_paged", "fp8 codes . keys x scale, ReLU, weighted head sum, stable sort (float64)",
            torch_dsa.topk_indexer, applies=torch_dsa.indexer_applies),
]
