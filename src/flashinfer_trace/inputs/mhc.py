"""mHC post-mapping inputs (op_type `mhc_post`): FlashInfer's `flashinfer.mhc.mhc_post(x, residual, post_layer_mix,
comb_res_mix)`, out[t, n, h] = x[t, h] * post_layer_mix[t, n] + sum_o residual[t, o, h] * comb_res_mix[t, o, n],
with x [T, H] and residual [T, 4, H] bfloat16, post_layer_mix [T, 4] and comb_res_mix [T, 4, 4] float32 (the API's
only dtypes; its hc is 4). The definitions name the inputs as the API does.

Typical tokens are the model's: x and residual standard normal, post_layer_mix = 2 * sigmoid(N(0, 1)) (in (0, 2), as
DeepSeek-V4's post multiplier makes it) and comb_res_mix a doubly stochastic matrix (rows and columns summing to 1,
every entry > 0: 40 Sinkhorn steps in float64 on exp(N(0, 1)), as the model's pre-map makes it). Such a matrix is
not symmetric, so reading it [new, old] rather than [old, new] shows on every token.

The boundary cases (docs/boundary/mhc_post.md says why each exists and what the API promises):

* `single_token`: one token (one block of the kernel's grid; the coefficient loads of a multi-token block unused).
* `signed_mix`: post_layer_mix and comb_res_mix standard normal: any float32 values are the API's contract (its
  docstring states the sum, no normalisation), so a kernel that assumes the model's doubly stochastic matrix
  (columns summing to 1) or non-negative weights is wrong here, and the five-term sums cancel.
* `zero_post`: the model's mixes with post_layer_mix exactly 0 at every (token, stream) with (t + n) even, and the
  whole of the last token's mixes 0 (its output is exactly 0): a kernel that skips a stream whose x weight is 0
  (a gating shortcut) drops that stream's residual mix too.
* `permuted_mix`: post_layer_mix 0 and comb_res_mix a permutation matrix per token, a 4-cycle (no stream stays,
  the matrix is not its own transpose): each new stream is one old stream, bit for bit.
* `large_values`: x and residual of magnitude 2^112 to 2^122 (signs random) with the model's mixes: every product
  and every partial sum stays below 2^126, finite in float32 and bfloat16 whatever the order of the sum, but far
  past float16's 65504 (a float16 accumulator or output overflows to inf).
* `tiny_values`: x and residual of magnitude 2^-104 to 2^-96 with the model's mixes (whose entries stay above
  2^-16 here): products and sums are normal float32 (above 2^-126: no flush-to-zero touches them), far below
  float16's smallest subnormal 2^-24 (a float16 accumulator or output underflows to 0).

The hidden sizes a kernel treats apart (an odd one, one past its widest vector tile) are definitions of their own:
the axis is const, so no case can vary it.
"""

from __future__ import annotations

import torch

from .common import Builder, bind_rows, log_uniform, normal, permutation, randint, unknown_inputs

OP_TYPES = ("mhc_post",)
INPUTS = ("x", "residual", "post_layer_mix", "comb_res_mix")
HC = 4  # the API's streams per token (`_MHC_HC`, checked by its binding)
ROWS = {"small": 4, "medium": 64, "large": 2048}
BOUNDARY_ROWS = {"small": 4, "medium": 16, "large": 2048}
BOUNDARY_CASES = ("signed_mix", "zero_post", "permuted_mix", "large_values", "tiny_values")
CASES = ("single_token", *BOUNDARY_CASES)
SINKHORN_STEPS = 40
POST_SCALE = 2.0  # post_layer_mix = 2 * sigmoid(z): DeepSeek-V4's mhc_post_mult_value
LARGE_LOG2 = (112, 122)  # large_values: |x|, |residual| = 2^U(112, 122)
TINY_LOG2 = (-104, -96)  # tiny_values: |x|, |residual| = 2^U(-104, -96)
TINY_MIX_FLOOR = 2.0 ** -16  # tiny_values: mixes at least this, so every product stays a normal float32


def edge_cases(definition) -> list[str]:
    return list(CASES)


def sinkhorn(logits: torch.Tensor, steps: int = SINKHORN_STEPS) -> torch.Tensor:
    """exp(logits) [..., n, n] scaled to rows and columns summing to 1 (float64): a doubly stochastic matrix."""
    m = logits.to(torch.float64).exp()
    for _ in range(steps):
        m = m / m.sum(dim=-1, keepdim=True)
        m = m / m.sum(dim=-2, keepdim=True)
    return m


def four_cycles(rows: int, b: Builder) -> torch.Tensor:
    """[rows, 4, 4] float32 permutation matrices, each a random 4-cycle: entry [o, n] is 1 where new stream n takes
    old stream o, and no n takes itself."""
    order = permutation(HC, b.rng("mix:cycle"), rows=rows)  # [rows, 4]: the cycle p0 -> p1 -> p2 -> p3 -> p0
    src = torch.roll(order, shifts=1, dims=1)  # new stream order[i] takes old stream order[i - 1]
    m = torch.zeros(rows, HC, HC, dtype=torch.float32)
    m[torch.arange(rows)[:, None], src, order] = 1.0
    return m


def _signs(shape, b: Builder, tag: str) -> torch.Tensor:
    return (randint(0, 2, shape, b.rng(tag), device=b.device) * 2 - 1).to(torch.float32)


def _streams(b: Builder, name: str) -> torch.Tensor:
    shape, dtype = b.shape(name), b.torch_dtype(name)
    if b.case in ("large_values", "tiny_values"):
        lo, hi = LARGE_LOG2 if b.case == "large_values" else TINY_LOG2
        mag = log_uniform(shape, b.rng(f"{name}:mag"), lo, hi, device=b.device)
        return (mag * _signs(shape, b, f"{name}:sign")).to(dtype)
    return normal(shape, b.rng(name), device=b.device, dtype=dtype)


def _mixes(b: Builder, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    if b.case == "signed_mix":
        return (normal((rows, HC), b.rng("post"), dtype=torch.float32),
                normal((rows, HC, HC), b.rng("comb"), dtype=torch.float32))
    if b.case == "permuted_mix":
        return torch.zeros(rows, HC), four_cycles(rows, b)
    z = normal((rows, HC), b.rng("post"), dtype=torch.float32).to(torch.float64)
    post = POST_SCALE * torch.sigmoid(z)
    comb = sinkhorn(normal((rows, HC, HC), b.rng("comb"), dtype=torch.float32))
    if b.case == "tiny_values":
        post, comb = post.clamp_min(TINY_MIX_FLOOR), comb.clamp_min(TINY_MIX_FLOOR)
    post, comb = post.to(torch.float32), comb.to(torch.float32)
    if b.case == "zero_post":
        t, n = torch.meshgrid(torch.arange(rows), torch.arange(HC), indexing="ij")
        post = torch.where((t + n) % 2 == 0, 0.0, post)
        post[-1] = 0.0
        comb[-1] = 0.0
    return post, comb


def generate(b: Builder) -> None:
    unknown_inputs(b, INPUTS, "mhc_post")
    missing = [n for n in INPUTS if not b.has(n)]
    if missing:
        raise b.mismatch(f"mhc_post needs x, residual, post_layer_mix and comb_res_mix (missing {', '.join(missing)})")
    shapes = {n: len(b.spec(n).shape or ()) for n in INPUTS}
    if shapes != {"x": 2, "residual": 3, "post_layer_mix": 2, "comb_res_mix": 3}:
        raise b.mismatch("mhc_post takes x [T, H], residual [T, hc, H], post_layer_mix [T, hc], comb_res_mix "
                         "[T, hc, hc]")
    if b.case is not None and b.case not in CASES:
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(CASES)})")
    rows = 1 if b.case == "single_token" else (BOUNDARY_ROWS[b.size] if b.case in BOUNDARY_CASES
                                               else b.count(ROWS[b.size]))
    bind_rows(b, list(INPUTS), rows)
    b.set_dim("residual", 1, HC)
    post, comb = _mixes(b, rows)
    b.put("post_layer_mix", post)
    b.put("comb_res_mix", comb)
    b.put("x", _streams(b, "x"))
    b.put("residual", _streams(b, "residual"))
