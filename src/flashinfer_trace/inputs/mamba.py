"""Mamba2 selective state update inputs (op_type `mamba_ssu`): one decode step of the SSM recurrence
over a paged state cache.

    state [state_cache_size, nheads, head_dim, dstate]   the cache; row `state_batch_indices[b]` is request b's
    x, dt [batch_size, nheads, head_dim]                 (z, when a definition has it: the same shape)
    A [nheads, head_dim, dstate], D, dt_bias [nheads, head_dim]
    B, C [batch_size, ngroups, dstate]                   group g serves heads g*r .. g*r + r - 1, r = nheads / ngroups

Values are drawn the way a Mamba2 model has them (Nemotron-H and the public definitions tie the
per-head parameters across head_dim, "TIE_HDIM": one value per head, broadcast), so the same case
runs through the reference, the torch ground truth and FlashInfer's kernel (which only takes tied
parameters, as stride-0 views):

* A = -(1 .. 16), one per head (A = -exp(A_log), A_log initialised to log U(1, 16)): always negative,
  so exp(dt * A) is a decay in (0, 1];
* dt_bias = softplus^-1(dt0), dt0 log-uniform in [0.001, 0.1] (Mamba2's time-step initialisation),
  and dt (the raw projection, per request and head) ~ 0.5 N(0, 1): softplus(dt + dt_bias) is a
  small positive step and a reference that skips the softplus gets negative steps (a growing state);
* D ~ 1 + 0.1 N(0, 1) per head; x, B, C, z ~ N(0, 1); the cached state ~ N(0, 1).

The slots are distinct rows of the cache in random order (two requests never share a state), so a
kernel that reads row b instead of row state_batch_indices[b] fails. The cache holds more rows than
requests; rows no request names must come back unchanged in `new_state`.

Edge cases:
  batch1: one request;
  padded: some requests (at least one, never all) carry PAD_SLOT_ID -1: the reference skips them
    (state untouched, output zeros);
  large_cache: the cache is four times the batch and more, the slots scattered over all of it;
  large_dt: dt ~ 12 + 6 N(0, 1), one (request, head) pinned at 40 and one at -4, so softplus runs in
    both regimes (above 20 torch's softplus returns its input) and exp(dt * A) underflows to 0: the
    old state is forgotten.
Boundary cases (docs/boundary/moe-gdn-mamba.md says why each exists):
  extreme_magnitudes: the step, the decay and the state at their limits. Per (request, head) one of three
    dt regimes: dt uniform in [90, 1000], past float32's exp overflow (88.7), where softplus must take its
    linear branch (log(1 + exp(dt)) is inf); dt + dt_bias uniform in [-30, -20], a step ~1e-13..1e-9 whose
    decay rounds to 1 (the state passes through); or the usual dt. Half the heads get A = -(1e5 .. 1e7):
    with the usual step (>= 1e-3) exp(step * A) underflows in one step, the old state forgotten. And the
    cached state ~ 2**14 N(0, 1): C . state reaches ~2e5, past float16's 65504, while bf16 holds it;
  all_padded: every request carries PAD_SLOT_ID: the output is all zeros and the cache comes back as it
    was (a batch of nothing but CUDA-graph padding).
"""

from __future__ import annotations

import math

import torch

from .common import Builder, log_uniform, normal, permutation, randint, uniform, unknown_inputs

OP_TYPES = ("mamba_ssu",)
CASES = ("batch1", "padded", "large_cache", "large_dt", "extreme_magnitudes", "all_padded")
PAD_SLOT_ID = -1

# (batch, state cache rows): medium keeps the float64 ground truth of a 128-head cache (2 MiB of bf16
# per row) well under a second on a CPU.
TIERS = {"small": (4, 7), "medium": (16, 24), "large": (128, 160)}
LARGE_CACHE = 4  # large_cache: rows = LARGE_CACHE * batch + 3

STATE, X, DT, A, B, C, D, Z, DT_BIAS, INDICES, SOFTPLUS = (
    "state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "state_batch_indices", "dt_softplus")
KNOWN = (STATE, X, DT, A, B, C, D, Z, DT_BIAS, INDICES, SOFTPLUS)
REQUIRED = (STATE, X, DT, A, B, C)

A_RANGE = (1.0, 16.0)  # -A
DT0_LOG2 = (math.log2(1e-3), math.log2(1e-1))  # the time step softplus(dt_bias) lands in
HUGE_DT = (90.0, 1000.0)  # extreme_magnitudes: past float32's exp overflow at 88.7
TINY_STEP_X = (-30.0, -20.0)  # extreme_magnitudes: dt + dt_bias here
STRONG_A_LOG2 = (math.log2(1e5), math.log2(1e7))  # extreme_magnitudes: -A log-uniform here (step * A < -100)
LARGE_STATE = 2.0**14  # extreme_magnitudes: the cache's scale


def edge_cases(definition) -> list[str]:
    cases = list(CASES)
    if INDICES not in definition.inputs:  # no slot indirection: no padding, the cache is the batch
        cases = [c for c in cases if c not in ("padded", "large_cache")]
    return cases


def _check_layout(b: Builder) -> None:
    missing = [n for n in REQUIRED if not b.has(n)]
    if missing:
        raise b.mismatch(f"a mamba_ssu definition needs input(s) {', '.join(missing)}")
    ranks = {STATE: 4, X: 3, DT: 3, A: 3, B: 3, C: 3, D: 2, DT_BIAS: 2, Z: 3, INDICES: 1}
    for name, rank in ranks.items():
        if b.has(name):
            shape = b.spec(name).shape
            if shape is None or len(shape) != rank:
                raise b.mismatch(f"input {name!r}: shape {shape}, the mamba_ssu generator expects {rank} dimensions "
                              "(state [cache, nheads, head_dim, dstate], x/dt/z [batch, nheads, head_dim], "
                              "A [nheads, head_dim, dstate], B/C [batch, ngroups, dstate], "
                              "D/dt_bias [nheads, head_dim], state_batch_indices [batch])")
    if b.has(SOFTPLUS) and b.spec(SOFTPLUS).shape is not None:
        raise b.error(f"input {SOFTPLUS!r}: expected a scalar (shape null), got shape {b.spec(SOFTPLUS).shape}")


def _bind_sizes(b: Builder) -> tuple[int, int]:
    batch, rows = TIERS[b.size]
    if b.case == "batch1":
        batch = 1
    if b.case == "large_cache":
        rows = LARGE_CACHE * batch + 3
    rows = max(rows, batch)
    b.set_dim(X, 0, batch)
    if b.has(INDICES):
        b.set_dim(STATE, 0, rows)
    else:
        b.set_dim(STATE, 0, batch)  # no indirection: request b owns row b
    heads, groups = b.dim(X, 1), b.dim(B, 1)
    if groups < 1 or heads % groups:
        raise b.error(f"nheads {heads} is not a multiple of ngroups {groups}")
    return heads, groups


def _slots(b: Builder, batch: int, rows: int) -> torch.Tensor:
    g = b.rng("slots")
    slots = permutation(rows, g)[:batch]
    if b.case == "all_padded":
        slots[:] = PAD_SLOT_ID
    if b.case == "padded":
        if batch < 2:
            raise b.error("the padded case needs a batch of at least 2 (one padded request, one real)")
        n_pad = 1 + int(randint(0, batch - 1, (1,), g))  # 1 .. batch - 1
        padded = permutation(batch, g)[:n_pad]
        slots[padded] = PAD_SLOT_ID
    return slots


def _per_head(b: Builder, name: str, values: torch.Tensor) -> None:
    """A [nheads] (or [batch, nheads]) float tensor broadcast over the input's trailing axes, stored
    contiguous in the input's dtype (the tie across head_dim is in the values, not in the strides)."""
    shape = b.shape(name)
    lead = values.dim()
    t = values.reshape(*values.shape, *([1] * (len(shape) - lead))).expand(shape)
    b.put(name, t.to(b.torch_dtype(name)).contiguous())


def generate(b: Builder) -> None:
    unknown_inputs(b, KNOWN, "mamba_ssu")
    _check_layout(b)
    heads, _ = _bind_sizes(b)
    batch, rows = b.axis(b.dim_axis(X, 0)), b.axis(b.dim_axis(STATE, 0))
    if rows < batch:
        raise b.error(f"state cache rows {rows} < batch {batch}")

    if b.has(INDICES):
        spec_dtype = b.torch_dtype(INDICES)
        b.put(INDICES, _slots(b, batch, rows).to(spec_dtype))
    b.put_random(STATE, scale=LARGE_STATE if b.case == "extreme_magnitudes" else 1.0)
    b.put_random(X)
    b.put_random(B)
    b.put_random(C)
    if b.has(Z):
        b.put_random(Z)

    # per-head parameters, tied across head_dim (and dstate for A)
    neg_a = uniform((heads,), b.rng(A)).mul_(A_RANGE[1] - A_RANGE[0]).add_(A_RANGE[0])
    if b.case == "extreme_magnitudes":  # half the heads (head 0 among them) decay to nothing in one step
        g = b.rng("strong")
        strong = permutation(heads, g)[: max(1, heads // 2)]
        if not bool((strong == 0).any()):
            strong[0] = 0
        neg_a[strong] = log_uniform((strong.numel(),), g, *STRONG_A_LOG2)
    _per_head(b, A, -neg_a)
    if b.has(D):
        _per_head(b, D, normal((heads,), b.rng(D), scale=0.1, mean=1.0))
    bias = torch.zeros(heads)
    if b.has(DT_BIAS):
        # softplus^-1(dt0) = dt0 + log(-expm1(-dt0)): transcendental, so on the CPU in float64, then copied
        dt0 = log_uniform((heads,), b.rng(DT_BIAS), *DT0_LOG2).to(torch.float64)
        bias = (dt0 + torch.log(-torch.expm1(-dt0))).to(torch.float32)
        _per_head(b, DT_BIAS, bias)
    if b.case == "large_dt":
        dt = normal((batch, heads), b.rng(DT), scale=6.0, mean=12.0)
        dt[0, 0], dt[-1, -1] = 40.0, -4.0  # both ends always present, whatever the draw
    elif b.case == "extreme_magnitudes":  # per (request, head): huge, tiny (dt + dt_bias in TINY_STEP_X) or usual
        g = b.rng(DT)
        huge = uniform((batch, heads), g).mul_(HUGE_DT[1] - HUGE_DT[0]).add_(HUGE_DT[0])
        tiny = uniform((batch, heads), g).mul_(TINY_STEP_X[1] - TINY_STEP_X[0]).add_(TINY_STEP_X[0]) - bias
        regime = randint(0, 3, (batch, heads), g)
        regime[0, 0], regime[-1, -1] = 1, 2  # both ends present, whatever the draw (one pair if batch 1)
        dt = torch.where(regime == 1, huge, torch.where(regime == 2, tiny, normal((batch, heads), g, scale=0.5)))
        dt[0, 0] = HUGE_DT[1]
    else:
        dt = normal((batch, heads), b.rng(DT), scale=0.5)
    _per_head(b, DT, dt)
    if b.has(SOFTPLUS):
        b.put_scalar(SOFTPLUS, True)
