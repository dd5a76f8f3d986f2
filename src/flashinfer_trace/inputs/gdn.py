"""Gated Delta Net inputs (op_type `gdn`): decode, multi-token (MTP) verification and varlen prefill.

The stage is read from the inputs, never from the name: a `cu_seqlens` input makes a varlen
prefill (q/k/v `[total_seq_len, heads, head_size]`, one initial state per sequence), an
`initial_state_indices` input a pooled multi-token call (q/k/v `[batch, seq_len, heads, head_size]`,
each row reading its state from a pool slot), and anything else a decode (one state per row).

Var axes are derived from the shapes they name, so a definition that calls them otherwise still
works: the batch and seq_len axes from q's first dimensions, the number of sequences from the
state's first dimension (prefill), the pool from the initial state's first dimension (MTP), the
length of cu_seqlens from its own spec. A const seq_len (decode: 1) is kept; a var one gets the
tier's token count (MTP constraints ask for more than one).

Values follow what the kernels see in Qwen3-Next:

* q and k are L2-normalised per head (the model normalises them, `use_qk_l2norm_in_kernel`); the
  references do not normalise, and with an unnormalised key the delta rule's (I - beta k k^T) is no
  longer a contraction and the state explodes. The norm is a reduction, so these two are made on the
  CPU (in float64, then rounded to the definition's dtype) and moved, like rope's cos/sin cache;
* v normal; `b` normal (beta = sigmoid(b) spread over (0, 1));
* `A_log = log(A)` with A log-uniform in [1, 16] (the model's initialisation range), `dt_bias`
  the inverse softplus of a dt log-uniform in [1e-3, 1e-1] (likewise), `a` normal: the decay
  g = exp(-A * softplus(a + dt_bias)) then runs from ~0.1 to ~1, most of it close to 1 (long memory);
* the initial state normal (float32), scale 2, as a state after a long context holds;
* `scale` = 1 / sqrt(head_size) (the definitions' default);
* MTP: the pool holds more slots than rows, and `initial_state_indices` names distinct slots in a
  random order (never 0..batch-1): a kernel reading slot b for row b fails. The
  `intermediate_states_buffer` ([batch, seq_len, ..], an in-place output) is zeros: every element is
  written, so a kernel that skips a row or a token leaves a zero where a state is expected.

Edge cases: `batch1` (one row / one sequence), `zero_state` (every initial state 0), `fast_decay`
(`a` shifted up so g is near 0 and the past is mostly forgotten), and per stage `min_tokens`
(MTP: seq_len 2) and `unit_lengths` (prefill: every sequence one token long). Boundary cases
(docs/boundary/moe-gdn-mamba.md says why each exists):

* `gate_extremes`: both gates at their limits. a + dt_bias in [20, 120], softplus's linear regime, past
  float32's exp overflow (88.7): softplus must return its input there, never log(1 + exp(x)) (inf, so
  g = 0); A is made tiny (A_log in [-12, -8]) so that A * softplus stays O(0.01) and g near 1: the decay
  matters, slowly. And b = +-100 for most (token, head) (beta exactly 1: the key's slot is overwritten
  with v; beta ~ 4e-44: no update), the rest normal: sigmoid must not be exp(b) / (1 + exp(b)) (NaN);
* `empty_sequences` (prefill): every third sequence, the first and the last, has no token: its
  `new_state` is its initial state passed through (the definitions allow a length of 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .common import Builder, log_uniform, normal, permutation, random_words, uniform

OP_TYPES = ("gdn",)

ACTIVATIONS = ("q", "k", "v")
GATES = ("A_log", "a", "dt_bias", "b")
STATES = ("state", "initial_state")
STRUCTURE = ("cu_seqlens", "initial_state_indices", "intermediate_states_buffer", "scale")
KNOWN = ACTIVATIONS + GATES + STATES + STRUCTURE

COMMON_CASES = ("batch1", "zero_state", "fast_decay", "gate_extremes")
STATE_SCALE = 2.0
FAST_DECAY_SHIFT = 8.0  # added to `a`: softplus(a + dt_bias) ~ a + dt_bias > 1 mostly, g = exp(-A (..)) mostly < 0.05
LINEAR_A = (20.0, 120.0)  # gate_extremes: a uniform here (bf16), past softplus's threshold 20 and exp's 88.7
TINY_A_LOG = (-12.0, -8.0)  # gate_extremes: A_log uniform here, A * softplus(..) in ~[1e-4, 0.04]
BETA_EXTREME = 100.0  # gate_extremes: b = +-this (bf16-exact): sigmoid is 1 or 3.7e-44; exp(100) overflows float32
BETA_EXTREME_SHARE = 0.75
A_LOG2 = (0.0, 4.0)  # A in [1, 16]: Qwen3-Next draws A uniform in (0, 16] at initialisation
DT_LOG2 = (math.log2(1e-3), math.log2(1e-1))  # dt in [1e-3, 1e-1] (mamba-style dt initialisation)


@dataclass(frozen=True)
class Tier:
    batch: int  # decode / MTP rows, prefill sequences
    mtp_tokens: int  # tokens per row of an MTP call
    max_len: int  # longest prefill sequence


# Prefill lengths cross FlashInfer's 64-token chunk: the small tier's longest sequence is 70 tokens.
# The reference is a per-token Python loop (per head for decode and MTP), which bounds the sizes.
TIERS = {
    "small": Tier(batch=3, mtp_tokens=3, max_len=70),
    "medium": Tier(batch=16, mtp_tokens=4, max_len=200),
    "large": Tier(batch=64, mtp_tokens=8, max_len=1024),
}


def stage(definition) -> str:
    """"prefill" (a cu_seqlens input), "mtp" (a state pool read through initial_state_indices) or
    "decode"."""
    if "cu_seqlens" in definition.inputs:
        return "prefill"
    if "initial_state_indices" in definition.inputs:
        return "mtp"
    return "decode"


def edge_cases(definition) -> list[str]:
    extra = {"prefill": ("unit_lengths", "empty_sequences"), "mtp": ("min_tokens",), "decode": ()}[stage(definition)]
    return [*COMMON_CASES, *extra]


def _state_name(b: Builder) -> str:
    found = [n for n in STATES if b.has(n)]
    if len(found) != 1:
        raise b.error(f"a gdn definition needs exactly one state input ({' or '.join(STATES)}), has "
                      f"{', '.join(found) or 'none'}")
    return found[0]


def _seq_lengths(b: Builder) -> list[int]:
    tier = TIERS[b.size]
    if b.case == "unit_lengths":
        return [1] * tier.batch
    n = 1 if b.case == "batch1" else tier.batch
    g = b.rng("lengths")
    if n == 1:
        return [tier.max_len // 2 + int(random_words(1, g)[0] & 0x7FFFFFFF) % (tier.max_len - tier.max_len // 2)]
    # log-uniform over [1, max_len], the two ends pinned (a one-token sequence, one past a 64-token chunk)
    u = ((random_words(n, g) & 0xFFFFFF).to(torch.float64) / 2**24).tolist()
    lens = [max(1, min(tier.max_len, round(tier.max_len ** x))) for x in u]
    lens[0], lens[1] = 1, tier.max_len
    order = permutation(n, g).tolist()
    lens = [lens[i] for i in order]
    if b.case == "empty_sequences":  # the first, the last and every third: leading, inner and trailing
        lens = [0 if i % 3 == 0 or i == n - 1 else n_tok for i, n_tok in enumerate(lens)]
    return lens


def unit_rows(shape: tuple[int, ...], b: Builder, tag: str, dtype: torch.dtype) -> torch.Tensor:
    """Normal rows, L2-normalised over the last dimension in float64 on the CPU, then rounded."""
    x = normal(shape, b.rng(tag), dtype=torch.float32, device="cpu").to(torch.float64)
    return (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)).to(dtype)


def generate(b: Builder) -> None:
    d = b.definition
    extra = [n for n in d.inputs if n not in KNOWN]
    if extra:
        raise b.mismatch(f"the gdn generator does not know input(s) {', '.join(extra)} (it knows {', '.join(KNOWN)})")
    missing = [n for n in (*ACTIVATIONS, *GATES) if not b.has(n)]
    if missing:
        raise b.mismatch(f"a gdn definition needs input(s) {', '.join(missing)}")
    st = stage(d)
    state = _state_name(b)
    tier = TIERS[b.size]

    if st == "prefill":
        lens = _seq_lengths(b)
        cu = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0)
        b.put("cu_seqlens", cu.to(b.torch_dtype("cu_seqlens")))
        b.set_dim("q", 0, sum(lens))
        b.set_dim(state, 0, len(lens))
    else:
        rows = 1 if b.case == "batch1" else tier.batch
        b.set_dim("q", 0, rows)
        seq_axis = b.dim_axis("q", 1)
        if seq_axis not in b.axes:  # MTP: var; decode pins it const 1
            b.set_axis(seq_axis, 2 if b.case == "min_tokens" else tier.mtp_tokens)
        if st == "mtp":
            pool = rows + max(2, rows // 2)
            b.set_dim(state, 0, pool)
            slots = permutation(pool, b.rng("slots"))[:rows]
            if rows >= 2 and bool((slots[1:] > slots[:-1]).all()):
                slots[[0, 1]] = slots[[1, 0]]  # sorted by chance: an identity-like map would test less
            b.put("initial_state_indices", slots.to(b.torch_dtype("initial_state_indices")))

    for name in ("q", "k"):
        b.put(name, unit_rows(b.shape(name), b, name, b.torch_dtype(name)))
    b.put_random("v")

    # gates: per-head parameters are tiny and need log/expm1: made on the CPU, then moved
    heads = b.shape("A_log")
    if b.case == "gate_extremes":
        a_log = uniform(heads, b.rng("A")).to(torch.float64) * (TINY_A_LOG[1] - TINY_A_LOG[0]) + TINY_A_LOG[0]
    else:
        a_log = log_uniform(heads, b.rng("A"), *A_LOG2, device="cpu").to(torch.float64).log()
    b.put("A_log", a_log.to(b.torch_dtype("A_log")))
    dt = log_uniform(b.shape("dt_bias"), b.rng("dt"), *DT_LOG2, device="cpu").to(torch.float64)
    b.put("dt_bias", torch.log(torch.expm1(dt)).to(b.torch_dtype("dt_bias")))
    if b.case == "gate_extremes":
        a = uniform(b.shape("a"), b.rng("a"), device=b.device) * (LINEAR_A[1] - LINEAR_A[0]) + LINEAR_A[0]
        b.put("a", a.to(b.torch_dtype("a")))
    else:
        b.put_random("a", mean=FAST_DECAY_SHIFT if b.case == "fast_decay" else 0.0)
    gate = b.put_random("b")
    if b.case == "gate_extremes":
        g = b.rng("beta")
        extreme = uniform(gate.shape, g, device=b.device) < BETA_EXTREME_SHARE
        sign = torch.where(uniform(gate.shape, g, device=b.device) < 0.5, -1.0, 1.0)
        b.put("b", torch.where(extreme, sign * BETA_EXTREME, gate.float()).to(gate.dtype))

    if b.case == "zero_state":
        b.put(state, torch.zeros(b.shape(state), dtype=b.torch_dtype(state), device=b.device))
    else:
        b.put_random(state, scale=STATE_SCALE)
    if b.has("intermediate_states_buffer"):  # ours: [batch, ..] (by row); the public file's: [pool, ..]
        name = "intermediate_states_buffer"
        b.put(name, torch.zeros(b.shape(name), dtype=b.torch_dtype(name), device=b.device))
    if b.has("scale"):
        b.put_scalar("scale", 1.0 / math.sqrt(b.dim("q", -1)))
