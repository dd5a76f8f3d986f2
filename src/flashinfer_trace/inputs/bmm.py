"""Batched fp8 GEMM inputs (op_type `bmm_fp8`): FlashInfer's `flashinfer.gemm.bmm_fp8(A, B, A_scale, B_scale,
dtype, out=None, backend=...)`, C[b] = (A[b] @ B[b]) * A_scale * B_scale with A [batch_size, M, K] and B
[batch_size, K, N] float8_e4m3fn codes and A_scale / B_scale per-tensor float32 dequantisation scales (0-d
tensors: the API wants exactly one element). The definitions name the inputs as FlashInfer's trace template does
(A, B, A_scale, B_scale); the output dtype is the definition's output's (the API's `dtype` argument), so it is no
input. B is generated row-major; the adapter hands the kernel the column-major copy it requires.

Typical codes are N(0, 8) rounded to e4m3 (|x| up to ~40, far from the format's 448 and from its subnormals,
below 2^-6); the scales are log-uniform in 2^-8 .. 2^-2 (an amax / 448 of real activations and weights), each
its own value, so a dropped or swapped scale shows everywhere.

The boundary cases (docs/boundary/bmm.md says why each exists and what the API promises):

* `single_token`: M = 1 (one decode token per head).
* `single_batch`: batch_size = 1, where the definition leaves it var (the MLA definitions fix it to the heads).
* `saturated`: even rows of A and every other column of B hold +-448, e4m3's largest finite value (code 0x7E;
  0x7F is NaN): a kernel or reference that decodes with another format's limit (e4m3fnuz's 240) clips them.
* `subnormal`: A holds only subnormal codes (k * 2^-9, k = 1..7) and A_scale is 2^9, so each dequantised A is
  an integer 1..7: a flush to zero of subnormal operands zeroes the whole output.
* `zero_scale`: A_scale is exactly 0 (a per-tensor scale of an all-zero tensor): the output is exactly 0, with
  B still holding +-448; a scale read with Python truthiness (`A_scale or 1.0`) is taken as absent.
* `scale_overflow`: A_scale = 2^120 and B_scale = 2^-118, product 4, with A's even rows at +-448 as in
  `saturated`: the output is ordinary, but dequantising the operands first makes 448 * 2^120 (2^128.8) past
  float32's (and bf16's) max: inf, then inf - inf = NaN.

`bmm_bf16` (FlashInfer's `flashinfer.bmm_bf16(A, B, out=None, out_dtype=torch.bfloat16, backend=...)`, C[b] =
A[b] @ B[b] in bf16 with a float32 sum) has `single_token`, `single_batch` and `beyond_fp16`: A and B scaled by
2^8, outputs ~2^16, past float16's 65504 but ordinary in bf16 (a kernel with a float16 epilogue or accumulator
overflows to inf).

A K that no kernel tile divides (144: a multiple of 16, as cuBLASLt's fp8 needs, of no 32, 64 or 128) is a
definition of its own (`bmm_fp8_b16_k144_n80`): the axis is const, so no case can vary it.
"""

from __future__ import annotations

import math

import torch

from .common import Builder, log_uniform, normal, randint, unknown_inputs

OP_TYPES = ("bmm_fp8", "bmm_bf16")
INPUTS = ("A", "B", "A_scale", "B_scale")
ROWS = {"small": 4, "medium": 32, "large": 512}  # M (tokens)
BATCH = {"small": 2, "medium": 8, "large": 32}  # batch_size where it is var
CASES = ("single_token", "single_batch", "saturated", "subnormal", "zero_scale", "scale_overflow")
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max; code 0x7E
E4M3_SUBNORMAL = 2.0 ** -9  # the smallest subnormal step; normals start at 2^-6
CODE_STD = 8.0
SCALE_LOG2 = (-8, -2)
SUBNORMAL_SCALE = 2.0 ** 9
OVERFLOW_SCALES = (2.0 ** 120, 2.0 ** -118)


BF16_CASES = ("single_token", "single_batch", "beyond_fp16")
BEYOND_FP16 = 2.0 ** 8  # beyond_fp16: A and B * 2^8 (B's typical std 1 / sqrt(K)): outputs ~2^16 > fp16's 65504


def edge_cases(definition) -> list[str]:
    batch_var = "batch_size" not in definition.const_axes
    cases = BF16_CASES if definition.op_type == "bmm_bf16" else CASES
    return [c for c in cases if c != "single_batch" or batch_var]


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round float values to e4m3 codes, saturating at +-448 first (torch's conversion gives NaN past it)."""
    return x.to(torch.float32).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def _signs(shape, b: Builder, tag: str) -> torch.Tensor:
    return (randint(0, 2, shape, b.rng(tag), device=b.device) * 2 - 1).to(torch.float32)


def _operand(b: Builder, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    x = normal(shape, b.rng(name), scale=CODE_STD, device=b.device)
    if b.case == "saturated" or (b.case == "scale_overflow" and name == "A"):
        sign = _signs(shape, b, f"{name}:sat-sign")
        if name == "A":  # even rows (tokens) of every batch
            mask = (torch.arange(shape[1], device=b.device) % 2 == 0)[None, :, None]
        else:  # every other column of B
            mask = (torch.arange(shape[2], device=b.device) % 2 == 0)[None, None, :]
        x = torch.where(mask, sign * E4M3_MAX, x)
    elif b.case == "subnormal" and name == "A":
        k = randint(1, 8, shape, b.rng("A:subnormal"), device=b.device).to(torch.float32)
        x = k * E4M3_SUBNORMAL * _signs(shape, b, "A:subnormal-sign")
    elif b.case == "zero_scale" and name == "B":
        x = _signs(shape, b, "B:max-sign") * E4M3_MAX
    return to_e4m3(x)


def _scales(b: Builder) -> tuple[float, float]:
    a, s = (float(log_uniform((1,), b.rng(n), *SCALE_LOG2).item()) for n in ("A_scale", "B_scale"))
    if b.case == "subnormal":
        a = SUBNORMAL_SCALE
    elif b.case == "zero_scale":
        a = 0.0
    elif b.case == "scale_overflow":
        a, s = OVERFLOW_SCALES
    return a, s


def _bind(b: Builder, cases: tuple[str, ...]) -> None:
    if b.case is not None and b.case not in cases:
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(cases)})")
    batch_axis, m_axis = b.dim_axis("A", 0), b.dim_axis("A", 1)
    if b.case == "single_batch" and batch_axis in b.definition.const_axes:
        raise b.error(f"case single_batch needs a var {batch_axis} (this definition fixes it)")
    if batch_axis not in b.definition.const_axes:
        b.set_axis(batch_axis, 1 if b.case == "single_batch" else b.count(BATCH[b.size], "batch"))
    if m_axis not in b.definition.const_axes:
        b.set_axis(m_axis, 1 if b.case == "single_token" else b.count(ROWS[b.size], "rows"))


def generate_bf16(b: Builder) -> None:
    """bmm_bf16: A ~ N(0, 1), B ~ N(0, 1 / K) in bf16 (outputs of variance ~1), both * 2^8 in beyond_fp16."""
    unknown_inputs(b, ("A", "B"), "bmm_bf16")
    if any(len(b.spec(n).shape or ()) != 3 for n in ("A", "B") if b.has(n)) or not (b.has("A") and b.has("B")):
        raise b.mismatch("bmm_bf16 needs A [batch_size, M, K] and B [batch_size, K, N]")
    _bind(b, BF16_CASES)
    big = BEYOND_FP16 if b.case == "beyond_fp16" else 1.0
    b.put_random("A", scale=big)
    b.put_random("B", scale=big / math.sqrt(b.dim("B", 1)))


def generate(b: Builder) -> None:
    if b.definition.op_type == "bmm_bf16":
        generate_bf16(b)
        return
    unknown_inputs(b, INPUTS, "bmm_fp8")
    missing = [n for n in INPUTS if n not in b.definition.inputs]
    if missing:
        raise b.mismatch(f"bmm_fp8 needs inputs {', '.join(INPUTS)} (missing {', '.join(missing)})")
    if len(b.spec("A").shape or ()) != 3 or len(b.spec("B").shape or ()) != 3:
        raise b.mismatch("A must be [batch_size, M, K] and B [batch_size, K, N]")
    for n in ("A", "B"):
        if b.torch_dtype(n) != E4M3:
            raise b.mismatch(f"{n} must be float8_e4m3fn codes, not {b.spec(n).dtype.value}")
    for n in ("A_scale", "B_scale"):
        if b.spec(n).shape != []:
            raise b.mismatch(f"{n} must be a per-tensor scale, a 0-d tensor (shape [])")
    _bind(b, CASES)
    b.put("A", _operand(b, "A", b.shape("A")))
    b.put("B", _operand(b, "B", b.shape("B")))
    a_scale, b_scale = _scales(b)
    b.put_scalar("A_scale", a_scale)
    b.put_scalar("B_scale", b_scale)
