"""Block-scaled fp8 GEMM inputs (op_type `gemm_fp8`): FlashInfer's `flashinfer.gemm.fp8_blockscale_gemm_sm90(input,
weight, input_scale, weight_scale, out=None, out_dtype=None)`, DeepSeek-V3's fp8 recipe: input [M, K] and weight
[N, K] float8_e4m3fn codes, input_scale [M, K/128] float32 (one scale per token per 128-wide K block), weight_scale
[ceil(N/128), K/128] float32 (one per 128x128 weight block), out [M, N] bfloat16. The definitions name the tensors
as FlashInfer's trace template does; input_scale is generated [M, K/128] row-major, the adapter hands the kernel the
M-major padded view it reads.

Typical codes are N(0, 8) rounded to e4m3 (|x| up to ~40, far from 448 and from the subnormals below 2^-6); every
scale is its own log-uniform draw in 2^-8 .. 2^-2 (an amax / 448 of real activations and weights), so a scale read
from the wrong token, block or weight row shows everywhere.

The boundary cases (docs/boundary/gemm_fp8.md says why each exists and what the API promises):

* `single_token`: M = 1 (one decode token; the kernel's swapAB path serves M < 32 anyway).
* `saturated`: even rows of input and even rows of weight hold +-448, e4m3's largest finite code (0x7E): a decode
  with e4m3fnuz's limit (240) clips them.
* `subnormal`: input holds only subnormal codes (k * 2^-9, k = 1..7) and every input_scale is 2^9, so each
  dequantised activation is an integer 1..7: a flush to zero of subnormal operands zeroes the output.
* `scale_overflow`: every input_scale is 2^120, every weight_scale 2^-118 (products 4), input's even rows at +-448:
  the output is ordinary, but dequantising the operands first makes 448 * 2^120 (past float32's max) inf.
* `tiny_scales`: every input_scale is 2^-100, every weight_scale 2^90 (products 2^-10): ordinary outputs, but an
  activation dequantised into float16 (or any format with float16's range) underflows to zero.
* `zero_block`: input's K block 1 is all zero codes with scale 0 on every even row (an all-zero block as a
  quantiser writes it: amax 0, scale 0), and weight block (0, last) holds +-448 codes with scale 0 (a zeroed block
  scale over stale codes): both blocks contribute exactly 0; a scale clamped away from zero (an epsilon guard)
  brings the stale codes back.

K not a multiple of 128 is no case: the API refuses it (ValueError: "K dimension must be divisible by block size"),
and K is a const axis of every definition. N not a multiple of 128 (a last weight-scale block of 64 rows) is a
property of two definitions (n2112, n320), not a case.
"""

from __future__ import annotations

import math

import torch

from .bmm import E4M3, E4M3_MAX, E4M3_SUBNORMAL, to_e4m3
from .common import Builder, log_uniform, normal, randint, unknown_inputs

OP_TYPES = ("gemm_fp8",)
INPUTS = ("input", "weight", "input_scale", "weight_scale")
BLOCK = 128
ROWS = {"small": 4, "medium": 32, "large": 512}  # M (tokens): small takes the swapAB path (M < 32), medium not
CASES = ("single_token", "saturated", "subnormal", "scale_overflow", "tiny_scales", "zero_block")
CODE_STD = 8.0
SCALE_LOG2 = (-8, -2)
SUBNORMAL_SCALE = 2.0 ** 9
OVERFLOW_SCALES = (2.0 ** 120, 2.0 ** -118)
TINY_SCALES = (2.0 ** -100, 2.0 ** 90)
ZERO_INPUT_BLOCK = 1  # input's K block zeroed (codes and scale) on even rows


def edge_cases(definition) -> list[str]:
    return list(CASES)


def _signs(shape, b: Builder, tag: str) -> torch.Tensor:
    return (randint(0, 2, shape, b.rng(tag), device=b.device) * 2 - 1).to(torch.float32)


def _even_rows(n: int, device) -> torch.Tensor:
    return (torch.arange(n, device=device) % 2 == 0)[:, None]


def _operand(b: Builder, name: str, shape: tuple[int, int]) -> torch.Tensor:
    x = normal(shape, b.rng(name), scale=CODE_STD, device=b.device)
    if b.case == "saturated" or (b.case == "scale_overflow" and name == "input"):
        x = torch.where(_even_rows(shape[0], b.device), _signs(shape, b, f"{name}:sat-sign") * E4M3_MAX, x)
    elif b.case == "subnormal" and name == "input":
        k = randint(1, 8, shape, b.rng("input:subnormal"), device=b.device).to(torch.float32)
        x = k * E4M3_SUBNORMAL * _signs(shape, b, "input:subnormal-sign")
    elif b.case == "zero_block" and name == "input":
        block = slice(ZERO_INPUT_BLOCK * BLOCK, (ZERO_INPUT_BLOCK + 1) * BLOCK)
        x[:, block] = torch.where(_even_rows(shape[0], b.device), 0.0, x[:, block])
    elif b.case == "zero_block" and name == "weight":
        rows, block = slice(0, min(BLOCK, shape[0])), slice(shape[1] - BLOCK, shape[1])
        x[rows, block] = _signs((rows.stop, BLOCK), b, "weight:stale-sign") * E4M3_MAX
    return to_e4m3(x)


def _scales(b: Builder, name: str, shape: tuple[int, int]) -> torch.Tensor:
    s = log_uniform(shape, b.rng(name), *SCALE_LOG2, device=b.device).to(torch.float32)
    first = name == "input_scale"
    if b.case == "subnormal" and first:
        s = torch.full_like(s, SUBNORMAL_SCALE)
    elif b.case == "scale_overflow":
        s = torch.full_like(s, OVERFLOW_SCALES[0 if first else 1])
    elif b.case == "tiny_scales":
        s = torch.full_like(s, TINY_SCALES[0 if first else 1])
    elif b.case == "zero_block" and first:
        s[:, ZERO_INPUT_BLOCK] = torch.where(_even_rows(shape[0], b.device)[:, 0], 0.0, s[:, ZERO_INPUT_BLOCK])
    elif b.case == "zero_block":
        s[0, -1] = 0.0
    return s


def generate(b: Builder) -> None:
    unknown_inputs(b, INPUTS, "gemm_fp8")
    missing = [n for n in INPUTS if n not in b.definition.inputs]
    if missing:
        raise b.mismatch(f"gemm_fp8 needs inputs {', '.join(INPUTS)} (missing {', '.join(missing)})")
    if any(len(b.spec(n).shape or ()) != 2 for n in INPUTS):
        raise b.mismatch("input [M, K], weight [N, K], input_scale [M, K/128] and weight_scale [N/128, K/128] are 2-D")
    for n in ("input", "weight"):
        if b.torch_dtype(n) != E4M3:
            raise b.mismatch(f"{n} must be float8_e4m3fn codes, not {b.spec(n).dtype.value}")
    if b.case is not None and b.case not in CASES:
        raise b.error(f"unknown case {b.case!r} (cases: {', '.join(CASES)})")
    m_axis = b.dim_axis("input", 0)
    if m_axis not in b.definition.const_axes:
        b.set_axis(m_axis, 1 if b.case == "single_token" else b.count(ROWS[b.size]))
    m, k = b.shape("input")
    n = b.dim("weight", 0)
    if k % BLOCK or b.shape("input_scale") != (m, k // BLOCK) or b.shape("weight_scale") != (math.ceil(n / BLOCK),
                                                                                             k // BLOCK):
        raise b.mismatch("K must be a multiple of 128, input_scale [M, K/128], weight_scale [ceil(N/128), K/128]")
    b.put("input", _operand(b, "input", (m, k)))
    b.put("weight", _operand(b, "weight", (n, k)))
    b.put("input_scale", _scales(b, "input_scale", b.shape("input_scale")))
    b.put("weight_scale", _scales(b, "weight_scale", b.shape("weight_scale")))
