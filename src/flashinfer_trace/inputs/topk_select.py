"""Top-k selection inputs (op_type `topk`): FlashInfer's `flashinfer.top_k(input, k)` (the dense form: values
and int64 indices of the k largest entries of each row) and `flashinfer.top_k_varlen(logits, seq_lens, top_k)`
(the variable-length form: int32 window-local ids of the min(top_k, seq_len) largest of logits[r, :seq_len],
-1 after them). Inputs are named as the API and FlashInfer's trace template name them; k / top_k is a scalar
input equal to the const axis `top_k` (the output's width). Not the sampling filters of inputs/topk.py.

Typical rows are standard normal scores in the definition's dtype; in the varlen form seq_lens is uniform in
[top_k + 1, max_seq_len] and the columns past a row's seq_len hold scores as large as the valid ones (stale
cache: a kernel that reads past seq_len picks them up).

The boundary cases (docs/boundary/topk_select.md says why each exists and what the API promises):

* `single_row`: one row.
* `ties_at_kth`: the entries ranked k-3 .. k+2 of each row (those that exist) set to the k-th value: a tie
  straddles the cut, so several selections are right, and a kernel must take exactly k of them, none twice.
* `all_equal`: every entry of a row one value (row 0 zeros): the whole row is one tie.
* `negative_rows`: log-softmax of typical rows: every score negative (log-probabilities), so the order of
  negative keys (a radix key must invert their bits) decides the selection.
* `neg_inf`: -inf entries, a value of the contract (masked tokens): row r % 4 holds a random half of -inf,
  only k // 2 finite entries (so -inf entries must be selected), all -inf, or a single -inf at column 0.
  NaN is not generated: neither API defines where it ranks.
* `last_bit`: each row C * (1 + j * eps), C a power of two and j in [0, 16): values one ulp apart, so a key
  that drops low mantissa bits (a radix select with too few passes) ties values that differ.
* `large_values`: typical rows scaled to 1/8 of the dtype's largest finite value (entries up to ~0.6 of it): a
  kernel that ranks in a narrower type (float16 for bfloat16 input) overflows them to ties at inf.
* `short_rows` (varlen only): seq_lens 1, top_k - 1, top_k, top_k + 1 and max_seq_len by row: rows shorter
  than k return all of their columns and -1 after them; a row exactly k long returns all of them.
"""

from __future__ import annotations

import math

import torch

from .common import Builder, bind_rows, log_uniform, normal, permutation, randint, unknown_inputs

OP_TYPES = ("topk",)
ROWS = {"small": 4, "medium": 32, "large": 256}
BOUNDARY_ROWS = {"small": 5, "medium": 10, "large": 64}
COMMON = ("ties_at_kth", "all_equal", "negative_rows", "neg_inf", "last_bit", "large_values")
BOUNDARY_CASES = COMMON + ("short_rows",)
DENSE = ("input", "k")
VARLEN = ("logits", "seq_lens", "top_k")
TIE_SPAN = (-3, 3)  # ties_at_kth: ranks k + TIE_SPAN[0] .. k + TIE_SPAN[1] - 1 (0-based from k - 1) tie
LAST_BIT_STEPS = 16
LARGE_SHARE = 1 / 8


def form(definition) -> str | None:
    """"dense" (input, k), "varlen" (logits, seq_lens, top_k) or None."""
    names = set(definition.inputs)
    if names == set(DENSE):
        return "dense"
    if names == set(VARLEN):
        return "varlen"
    return None


def cases(definition) -> tuple[str, ...]:
    return ("single_row", *COMMON, *(("short_rows",) if form(definition) == "varlen" else ()))


def edge_cases(definition) -> list[str]:
    return list(cases(definition))


def windows(seq_lens, width: int, rows: int) -> list[int]:
    """Each row's valid length: min(seq_len, width) (the whole row in the dense form)."""
    if seq_lens is None:
        return [width] * rows
    return [max(0, min(int(n), width)) for n in torch.as_tensor(seq_lens).cpu().tolist()]


def _ties(x: torch.Tensor, lens: list[int], k: int) -> torch.Tensor:
    x = x.clone()
    for r, n in enumerate(lens):
        if n == 0:
            continue
        row = x[r, :n]
        kk = min(k, n)
        order = torch.argsort(row.to(torch.float64), descending=True, stable=True)
        kth = row[order[kk - 1]].clone()
        lo, hi = max(0, kk - 1 + TIE_SPAN[0]), min(n, kk - 1 + TIE_SPAN[1])
        row[order[lo:hi]] = kth
    return x


def _neg_inf(b: Builder, x: torch.Tensor, lens: list[int], k: int) -> torch.Tensor:
    x = x.clone()
    order = permutation(x.shape[1], b.rng("x:neg-inf"), rows=x.shape[0])
    for r, n in enumerate(lens):
        cols = order[r][order[r] < n]  # a random order of the row's valid columns
        mode = r % 4
        if mode == 0:
            x[r, cols[: n // 2]] = -math.inf
        elif mode == 1:
            x[r, cols[min(n, k // 2):]] = -math.inf
        elif mode == 2:
            x[r, :n] = -math.inf
        elif n:
            x[r, 0] = -math.inf
    return x


def _values(b: Builder, name: str, lens: list[int], k: int) -> torch.Tensor:
    dtype = b.torch_dtype(name)
    rows, width = b.shape(name)
    dev = b.device
    if b.case == "all_equal":
        mag = log_uniform((rows, 1), b.rng("x:equal"), -4, 8, device=dev).to(torch.float64)
        sign = randint(0, 2, (rows, 1), b.rng("x:equal-sign"), device=dev) * 2 - 1
        value = mag * sign
        value[0] = 0
        return value.expand(rows, width).to(dtype).contiguous()
    if b.case == "last_bit":
        c = torch.exp2(randint(-4, 9, (rows, 1), b.rng("x:c"), device=dev).to(torch.float64))
        j = randint(0, LAST_BIT_STEPS, (rows, width), b.rng("x:j"), device=dev).to(torch.float64)
        return (c * (1 + j * torch.finfo(dtype).eps)).to(dtype)
    x = normal((rows, width), b.rng(name), device=dev, dtype=torch.float32).to(torch.float64)
    if b.case == "negative_rows":
        x = torch.log_softmax(x, dim=-1)
    elif b.case == "large_values":
        big = torch.finfo(dtype).max
        x = (x * (big * LARGE_SHARE)).clamp(-big, big)
    x = x.to(dtype)
    if b.case == "ties_at_kth":
        x = _ties(x, lens, k)
    elif b.case == "neg_inf":
        b.neg_inf.add(name)
        x = _neg_inf(b, x, lens, k)
    return x


def _seq_lens(b: Builder, rows: int, width: int, k: int) -> torch.Tensor:
    if b.case == "short_rows":
        pattern = (1, max(1, k - 1), k, min(width, k + 1), width)
        return torch.tensor([min(width, pattern[r % len(pattern)]) for r in range(rows)], dtype=torch.int32)
    lo = min(width, k + 1)
    return randint(lo, width + 1, (rows,), b.rng("seq_lens"), dtype=torch.int32)


def generate(b: Builder) -> None:
    which = form(b.definition)
    if which is None:
        unknown_inputs(b, DENSE + VARLEN, "topk")
        raise b.mismatch("topk needs (input, k) or (logits, seq_lens, top_k)")
    scores, k_name = ("input", "k") if which == "dense" else ("logits", "top_k")
    if b.spec(k_name).shape is not None:
        raise b.mismatch(f"{k_name} must be a scalar (shape null)")
    if len(b.spec(scores).shape or ()) != 2:
        raise b.mismatch(f"{scores} must be [rows, width]")
    if b.case is not None and b.case not in cases(b.definition):
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(cases(b.definition))})")
    if "top_k" not in b.definition.const_axes:
        raise b.mismatch("topk needs a const axis top_k (the output's width)")
    k = int(b.definition.const_axes["top_k"])
    rows = 1 if b.case == "single_row" else (BOUNDARY_ROWS[b.size] if b.case in BOUNDARY_CASES
                                             else b.count(ROWS[b.size]))
    bind_rows(b, [scores], rows)
    width = b.dim(scores, 1)
    if k > width:
        raise b.mismatch(f"top_k {k} is more than the row width {width}")
    lens = [width] * rows
    if which == "varlen":
        seq = _seq_lens(b, rows, width, k)
        b.put("seq_lens", seq)
        lens = windows(seq, width, rows)
    b.put(scores, _values(b, scores, lens, k))
    b.put_scalar(k_name, k)
