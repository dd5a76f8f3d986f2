"""Float64 torch ground truth of chain speculative sampling (`flashinfer.sampling.chain_speculative_sampling`,
inputs/speculative.py, docs/boundary/speculative.md): the exact law of what one call returns, per request.

With draft tokens d_0..d_{n-1} fixed (inputs), draft rows q_i and target rows p_0..p_n, token i's test passes with
probability a_i = min(1, p_i[d_i] / q_i[d_i]) (the kernel's `u * q < p` with u uniform on (0, 1]: a draft
probability of 0 passes exactly when the target's is positive, a target probability of 0 never does). The chain
stops at the first failed test, L; P(L = l) = a_0 ... a_{l-1} (1 - a_l), P(L = n) = a_0 ... a_{n-1}. The token at
the stop is drawn from the residual max(0, p_l - q_l) normalised, or (L = n) from the bonus row p_n. So one call's
outcome is (L, token) with P(l, t) = P(L = l) R_l[t]: a distribution over (n + 1) * vocab outcomes, the code
l * vocab + t. Marginalised over draft tokens drawn from the draft rows, each emitted token is distributed as the
target row of its position (the theorem of speculative sampling; tests/unit/test_speculative.py checks it on this
law). The accepted count, as FlashInfer documents it ("the number of tokens that can be accepted if each token is
considered independently ... does not consider that rejection sampling stops at the first token"), is every
token's own test counted: given L = l < n, l plus a Bernoulli(a_i) for each i > l (a Poisson-binomial law, by
dynamic programming); n given L = n. Its code is l * (n + 1) + c.

The deterministic parts are checked on every draw, exactly (`encode`): the output [n + 1] is the draft tokens up to
the stop, one token in the vocabulary, then -1; the emitted count is the stop; the accepted count lies in [L, n].
A draw breaking any of them encodes as -1: outside every allowed set, a `bug` (verdict/speculative.py).

`allowed` is what a correct float32 kernel may return: where a_i = 1 only because p_i[d_i] and q_i[d_i] are equal
(or within TIE of each other), a float32 product u * q may round up to p and fail the test (u = 1 is possible), so
a stop there is allowed though its probability is 0; with nothing left in the residual, any token is (the kernel
then falls back to its `last_valid_id`). The frequency tests run on the outcomes of positive probability only.
"""

from __future__ import annotations

import torch

from ..inputs.speculative import DRAFT, IDS, TARGET, is_chain
from .base import Adapter, Call

F64 = torch.float64
TIE = 2.0 ** -22  # relative: a target probability this close above the draft's may fail the float32 test


def applies(d) -> str | None:
    return None if d.is_sampler and is_chain(d) else f"not chain speculative sampling ({', '.join(d.inputs)})"


def sizes(x: dict) -> tuple[int, int, int]:
    """(batch, n, vocab)."""
    b, n, v = x[DRAFT].shape
    return int(b), int(n), int(v)


def acceptance(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, may_fail), float64 / bool [batch, n]: each draft token's probability of passing its test, and whether a
    correct float32 kernel may fail it (a < 1, or the two probabilities tied within TIE)."""
    q = x[DRAFT].to("cpu", F64)
    p = x[TARGET].to("cpu", F64)
    ids = x[IDS].to("cpu", torch.int64)
    n = q.shape[1]
    pd = q.gather(2, ids[..., None]).squeeze(2)
    pt = p[:, :n].gather(2, ids[..., None]).squeeze(2)
    a = torch.where(pd > 0, (pt / pd.clamp(min=1e-300)).clamp(max=1.0), (pt > 0).to(F64))
    may_fail = (a < 1) | (pd > 0) & (pt <= pd * (1 + TIE))
    return a, may_fail


def stop_law(a: torch.Tensor) -> torch.Tensor:
    """float64 [batch, n + 1]: P(L = l)."""
    batch, n = a.shape
    ones = torch.ones(batch, 1, dtype=F64)
    reach = torch.cat([ones, a.cumprod(dim=1)], dim=1)  # P(L >= l)
    fail = torch.cat([1 - a, torch.zeros(batch, 1, dtype=F64)], dim=1)
    fail[:, n] = 1.0
    return reach * fail


def residuals(x: dict) -> torch.Tensor:
    """float64 [batch, n + 1, vocab]: max(0, p_l - q_l) per position (unnormalised), the bonus row p_n last."""
    q = x[DRAFT].to("cpu", F64)
    p = x[TARGET].to("cpu", F64)
    n = q.shape[1]
    return torch.cat([(p[:, :n] - q).clamp(min=0), p[:, n:]], dim=1)


def count_law(a: torch.Tensor) -> torch.Tensor:
    """float64 [batch, n + 1, n + 1]: P(C = c | L = l) (row l, column c), the documented accepted count."""
    batch, n = a.shape
    out = torch.zeros(batch, n + 1, n + 1, dtype=F64)
    out[:, n, n] = 1.0
    for stop in range(n):
        dist = torch.zeros(batch, n + 1, dtype=F64)
        dist[:, stop] = 1.0
        for i in range(stop + 1, n):  # one more independent test each
            ai = a[:, i:i + 1]
            dist = dist * (1 - ai) + torch.cat([torch.zeros(batch, 1, dtype=F64), dist[:, :-1]], dim=1) * ai
        out[:, stop] = dist
    return out


def laws(x: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q_out, allowed_out, q_count, allowed_count): float64 / bool [batch, (n + 1) * vocab] over the outcome
    codes l * vocab + t, and [batch, (n + 1) * (n + 1)] over the count codes l * (n + 1) + c."""
    batch, n, vocab = sizes(x)
    a, may_fail = acceptance(x)
    stop = stop_law(a)
    res = residuals(x)
    total = res.sum(dim=2, keepdim=True)
    r = torch.where(total > 0, res / total.clamp(min=1e-300), 0.0)
    q_out = (stop[:, :, None] * r).reshape(batch, -1)
    # reachable: every earlier test may pass; a stop at l < n: its test may fail
    may_pass = a > 0
    reach = torch.cat([torch.ones(batch, 1, dtype=torch.bool), may_pass.to(torch.int64).cumprod(dim=1).bool()], dim=1)
    stops = reach & torch.cat([may_fail, torch.ones(batch, 1, dtype=torch.bool)], dim=1)
    tokens = (res > 0) | (total == 0)  # an empty residual: the kernel's fallback may be any token
    allowed_out = (stops[:, :, None] & tokens).reshape(batch, -1) | (q_out > 0)
    cl = count_law(a)
    q_count = (stop[:, :, None] * cl).reshape(batch, -1)
    # the counts a float32 kernel may give after a stop at l: each later test may pass (a > 0) or fail (may_fail)
    lo = torch.zeros(batch, n + 1, dtype=torch.int64)
    hi = torch.zeros(batch, n + 1, dtype=torch.int64)
    for stop in range(n + 1):
        later = slice(stop + 1, n)
        lo[:, stop] = stop + (~may_fail[:, later]).sum(dim=1)
        hi[:, stop] = stop + may_pass[:, later].sum(dim=1)
    c = torch.arange(n + 1)
    allowed_count = (stops[:, :, None] & (c >= lo[:, :, None]) & (c <= hi[:, :, None])).reshape(batch, -1)
    return q_out, allowed_out, q_count, allowed_count | (q_count > 0)


def encode(tokens: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor, ids: torch.Tensor,
           vocab: int) -> torch.Tensor:
    """int64 [rows]: each call's (output [rows, n + 1], accepted [rows], emitted [rows]) for draft tokens ids
    [rows, n] as ((l * vocab + t) * (n + 1) + c), or -1 where it breaks the deterministic contract: the draft
    tokens up to the stop l (the emitted count), one token t in [0, vocab) at l, -1 after it, the accepted count
    c in [l, n]."""
    tokens, ids = tokens.to("cpu", torch.int64), ids.to("cpu", torch.int64)
    rows, n = ids.shape
    if tokens.shape != (rows, n + 1):
        return torch.full((rows,), -1, dtype=torch.int64)
    stop = emitted.to("cpu", torch.int64).reshape(rows)
    c = accepted.to("cpu", torch.int64).reshape(rows)
    ok = (stop >= 0) & (stop <= n) & (c >= stop) & (c <= n)
    lc = stop.clamp(0, n)
    pos = torch.arange(n + 1)[None, :]
    prefix = torch.cat([ids, torch.zeros(rows, 1, dtype=torch.int64)], dim=1)
    ok &= ((tokens == prefix) | (pos >= lc[:, None])).all(dim=1)
    ok &= ((tokens == -1) | (pos <= lc[:, None])).all(dim=1)
    t = tokens.gather(1, lc[:, None]).squeeze(1)
    ok &= (t >= 0) & (t < vocab)
    return torch.where(ok, (lc * vocab + t.clamp(0, vocab - 1)) * (n + 1) + c.clamp(0, n), -1)


def split(codes: torch.Tensor, n: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(outcome codes l * vocab + t, count codes l * (n + 1) + c); -1 stays -1 in both."""
    codes = codes.to(torch.int64)
    bad = codes < 0
    out = codes // (n + 1)
    count = (out // vocab) * (n + 1) + codes % (n + 1)
    return torch.where(bad, -1, out), torch.where(bad, -1, count)


def draw(x: dict, draws: int, generator: torch.Generator) -> torch.Tensor:
    """int64 [batch, draws] codes from the exact law: (L, token) jointly, then the count given L."""
    batch, n, vocab = sizes(x)
    q_out, _, q_count, _ = laws(x)
    outcome = torch.multinomial(q_out, draws, replacement=True, generator=generator)
    stop = outcome // vocab
    cond = q_count.reshape(batch, n + 1, n + 1)
    cond = cond / cond.sum(dim=2, keepdim=True).clamp(min=1e-300)
    cond = torch.where(cond.sum(dim=2, keepdim=True) > 0, cond, 1.0)  # unreachable stops: never indexed
    codes = torch.empty(batch, draws, dtype=torch.int64)
    for b in range(batch):
        c = torch.multinomial(cond[b][stop[b]], 1, generator=generator).squeeze(1)
        codes[b] = outcome[b] * (n + 1) + c
    return codes


def sampling(call: Call) -> tuple:
    x = call.inputs.values
    g = torch.Generator().manual_seed(call.inputs.seed + 0x5EED)
    return (draw(x, call.draws, g),)


ADAPTERS = [
    Adapter("torch", "sampling", "chain speculative sampling: exact law of (stop, token, count) (float64) "
            "+ torch.multinomial", sampling, applies=applies, kind="sampler"),
]
