"""Attention partial-state inputs (op_type `cascade_merge`): FlashInfer's `merge_state(v_a, s_a, v_b, s_b)`,
`merge_state_in_place(v, s, v_other, s_other, mask)` and `merge_states(v, s)`, told apart by input name.

A partial state is an attention output v over one KV segment and s, the BASE-2 log-sum-exp of that segment's
scaled logits. v is standard normal (a softmax-weighted mean of O(1) values); s is N(LSE_MEAN, LSE_STD^2), the
log2 of a sum over some hundreds of keys, so two states' weights differ by a few binades and the merge weighs
both. The in-place form's mask is all True (every row merged, as outside a padded CUDA graph).

The boundary cases (docs/boundary/cascade.md says why each exists and what the API promises):
`empty_state` (one side of a row an empty segment: lse -inf, v 0: the merge must return the other state),
`both_empty` (rows whose states are all empty: the empty softmax, output 0 and lse -inf),
`far_apart` (lse 8 to 512 binades apart: exp2 of the difference underflows, and overflows if not taken from the
max), `equal_lse` (ties: weights exactly 1/2, or 1/n), `large_lse` (|lse| ~ 1e4: exp2(lse) itself overflows or
underflows float32), `mostly_empty` (merge_states: all but one or two states of each row empty, the first state
empty in most rows) and `masked_rows` (the in-place form: odd rows merged, even rows left alone).
"""

from __future__ import annotations

import math

import torch

from .common import Builder, bind_rows, log_uniform, normal, randint, uniform, unknown_inputs

OP_TYPES = ("cascade_merge",)
ROWS = {"small": 4, "medium": 64, "large": 2048}
BOUNDARY_ROWS = {"small": 4, "medium": 16, "large": 2048}  # 16 at medium: the point is the values, not the rows
STATES = {"small": 3, "medium": 8, "large": 32}  # merge_states: KV chunks per token (split-KV decode)
PAIR = ("v_a", "s_a", "v_b", "s_b")
IN_PLACE = ("v", "s", "v_other", "s_other", "mask")
MULTI = ("v", "s")
LSE_MEAN, LSE_STD = 8.0, 4.0  # log2 of a sum of exp over ~256 keys of O(1) logits, spread over some binades
FAR_LOG2 = (3, 9)  # `far_apart`: |s_a - s_b| log-uniform in [8, 512] binades (exp2(-24) is below bf16's step)
LARGE_LSE = 1e4  # `large_lse`: exp2(1e4) overflows float32 (max 2^128), exp2(-1e4) is 0
BOUNDARY_CASES = ("empty_state", "both_empty", "far_apart", "equal_lse", "large_lse")
MULTI_CASES = ("mostly_empty",)
MASK_CASES = ("masked_rows",)


def kind(definition) -> str:
    """"pair" (merge_state), "in_place" (merge_state_in_place) or "multi" (merge_states)."""
    names = set(definition.inputs)
    if "v_a" in names:
        return "pair"
    return "in_place" if "v_other" in names else "multi"


def edge_cases(definition) -> list[str]:
    k = kind(definition)
    extra = MULTI_CASES if k == "multi" else MASK_CASES if k == "in_place" else ()
    return ["single_token", *BOUNDARY_CASES, *extra]


def _lse(b: Builder, tag: str, shape) -> torch.Tensor:
    return normal(shape, b.rng(tag), scale=LSE_STD, mean=LSE_MEAN, device=b.device)


def _pattern(shape, device) -> torch.Tensor:
    """(token + head) % 3 over [seq_len, ..., num_heads]: 0 empties the first state, 1 the second, 2 neither."""
    t = torch.arange(shape[0], device=device).reshape(-1, *([1] * (len(shape) - 1)))
    h = torch.arange(shape[-1], device=device)
    return (t + h) % 3


def _pair_lse(b: Builder, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """The two lse tensors of a merge_state / merge_state_in_place case."""
    first, second = _lse(b, "s:first", shape), _lse(b, "s:second", shape)
    if b.case in ("empty_state", "both_empty"):  # both_empty: pattern 0 empties both, 1 the first, 2 neither
        which = _pattern(shape, b.device)
        first = torch.where(which <= (1 if b.case == "both_empty" else 0), -math.inf, first)
        second = torch.where(which == (0 if b.case == "both_empty" else 1), -math.inf, second)
    elif b.case == "far_apart":  # second = first -/+ 2^U(3, 9): each side dominates in half the rows
        gap = log_uniform(shape, b.rng("s:gap"), *FAR_LOG2, device=b.device)
        sign = randint(0, 2, shape, b.rng("s:sign"), device=b.device) * 2 - 1
        second = first + sign * gap
    elif b.case == "equal_lse":
        second = first.clone()
    elif b.case == "large_lse":  # both near +1e4 in even tokens, near -1e4 in odd ones
        sign = 1.0 - 2.0 * (torch.arange(shape[0], device=b.device) % 2).reshape(-1, 1)
        first, second = first + sign * LARGE_LSE, second + sign * LARGE_LSE
    return first, second


def _multi_lse(b: Builder, shape) -> torch.Tensor:
    """[seq_len, num_states, num_heads] lse of a merge_states case."""
    s = _lse(b, "s", shape)
    if b.case == "far_apart":  # state i of a row shifted by i * gap: the last dominates, the rest underflow
        gap = log_uniform((shape[0], 1, shape[2]), b.rng("s:gap"), *FAR_LOG2, device=b.device)
        s = s + torch.arange(shape[1], device=b.device).reshape(1, -1, 1) * gap
    elif b.case == "equal_lse":
        s = s[:, :1].expand(shape).clone()
    elif b.case == "large_lse":
        sign = 1.0 - 2.0 * (torch.arange(shape[0], device=b.device) % 2).reshape(-1, 1, 1)
        s = s + sign * LARGE_LSE
    elif b.case in ("empty_state", "both_empty", "mostly_empty"):
        s = torch.where(_empty_states(b, shape), -math.inf, s)
    return s


def _empty_states(b: Builder, shape) -> torch.Tensor:
    """Which states are empty. `empty_state`: the (token + head) % 3 pattern on the first state (0), on the
    last (1), or none (2); `both_empty`: every state (0), the first (1), none (2). `mostly_empty`: every state
    but one (at a random index, the first in a 1/n share of rows) and, in half the rows, a second kept one; so
    the first state is empty in most rows."""
    rows, states, heads = shape
    idx = torch.arange(states, device=b.device).reshape(1, -1, 1)
    which = _pattern((rows, 1, heads), b.device)
    if b.case == "empty_state":
        return ((which == 0) & (idx == 0)) | ((which == 1) & (idx == states - 1))
    if b.case == "both_empty":
        return (which == 0) | ((which == 1) & (idx == 0))
    keep = randint(0, states, (rows, 1, heads), b.rng("s:keep"), device=b.device)
    also = randint(0, states, (rows, 1, heads), b.rng("s:also"), device=b.device)
    second = uniform((rows, 1, heads), b.rng("s:second"), device=b.device) < 0.5
    return ~((idx == keep) | ((idx == also) & second))


def _values(b: Builder, name: str, lse: torch.Tensor) -> None:
    """v ~ N(0, 1) in its dtype, 0 where the state is empty (lse -inf): what a kernel writes for no keys."""
    v = normal(b.shape(name), b.rng(name), dtype=torch.float32, device=b.device)
    v = torch.where(torch.isneginf(lse)[..., None], 0.0, v)
    b.put(name, v.to(b.torch_dtype(name)))


def _put_lse(b: Builder, name: str, lse: torch.Tensor) -> None:
    b.neg_inf.add(name)
    b.put(name, lse.to(torch.float32))


def generate(b: Builder) -> None:
    k = kind(b.definition)
    known = {"pair": PAIR, "in_place": IN_PLACE, "multi": MULTI}[k]
    unknown_inputs(b, known, "cascade_merge")
    missing = [n for n in known if n not in b.definition.inputs and n != "mask"]
    if missing:
        raise b.mismatch(f"cascade_merge ({k}) needs input(s) {', '.join(missing)}")
    if "mask" in b.definition.inputs and b.spec("mask").is_absent:  # fi_trace's mask=None: its init makes it
        raise b.mismatch("the mask is an absent optional input (passed as None); this generator makes a tensor")
    cases = edge_cases(b.definition)
    if b.case is not None and b.case not in cases:
        raise b.error(f"unknown case {b.case!r} for a {k} merge (cases: {', '.join(cases)})")
    rows = 1 if b.case == "single_token" else (BOUNDARY_ROWS[b.size] if b.case else b.count(ROWS[b.size]))
    firsts = ("v_a", "s_a") if k == "pair" else ("v", "s")
    bind_rows(b, [n for n in b.definition.inputs if n != "mask"], rows)
    if k == "multi":
        b.set_dim("v", 1, STATES[b.size])
        b.set_dim("s", 1, STATES[b.size])
        s = _multi_lse(b, b.shape("s"))
        _put_lse(b, "s", s)
        _values(b, "v", s)
        return
    first, second = _pair_lse(b, b.shape(firsts[1]))
    other = ("v_b", "s_b") if k == "pair" else ("v_other", "s_other")
    for (v_name, s_name), lse in ((firsts, first), (other, second)):
        _put_lse(b, s_name, lse)
        _values(b, v_name, lse)
    if "mask" in b.definition.inputs:
        mask = torch.ones(rows, dtype=torch.bool, device=b.device)
        if b.case == "masked_rows":  # even rows (the first among them) skipped, odd rows merged
            mask = torch.arange(rows, device=b.device) % 2 == 1
        b.put("mask", mask)
