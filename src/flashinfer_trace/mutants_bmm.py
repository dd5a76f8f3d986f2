"""Planted bugs of the `bmm_fp8` family, one or more per boundary class of docs/boundary/bmm.md and a few plain
ones: each boundary mutant is right on typical operands (codes N(0, 8), scales 2^-8 .. 2^-2) and is caught by the
case its comment names; the plain ones are caught everywhere."""

from __future__ import annotations

from .mutants_model import FP16_EPILOGUE, GEMM_ACC, GEMM_OUT, Mutant, _m, _writes, flushed_a, squeezed_a

DEF = "bmm_fp8_b128_k512_n128"  # DeepSeek-V3's absorbed W_UV: the cheapest model-tagged definition per case
ODD = "bmm_fp8_b16_k144_n80"  # K = 144: the last K tile of 64 is partial
_ACC = GEMM_ACC
_SCALE = "    scale = A_scale.to(torch.float32) * B_scale.to(torch.float32)\n"
# the edits both forms (fp8 here, bf16 below) plant in their common accumulation line
_SQUEEZE_BATCH = (_ACC, "    acc = torch.matmul(A.to(torch.float32).squeeze(0), B.to(torch.float32).squeeze(0))\n")
_K_TAIL = (_ACC, "    kk = A.shape[-1] - A.shape[-1] % 64\n"
                 "    acc = torch.matmul(A[..., :kk].to(torch.float32), B[:, :kk].to(torch.float32))\n")
_FIRST_BATCH = (_ACC, "    acc = torch.matmul(A.to(torch.float32), B[:1].to(torch.float32))\n")

MUTANTS: tuple[Mutant, ...] = (
    # saturated: codes decoded with e4m3fnuz's limit (240) clip every +-448 operand
    _m(DEF, "fnuz-limit", "operands clipped to +-240 (e4m3fnuz's largest value), not e4m3fn's 448",
       (_ACC, "    acc = torch.matmul(A.to(torch.float32).clamp(-240, 240), B.to(torch.float32).clamp(-240, 240))\n"),
       cls="boundary-magnitude"),
    # subnormal: operands below e4m3's smallest normal (2^-6) flushed to zero: the whole output is 0
    _m(DEF, "subnormals-flushed", "fp8 subnormal operands (|x| < 2^-6) flushed to zero",
       flushed_a(-6), cls="boundary-magnitude"),
    # zero_scale: a 0-d scale read with Python truthiness: 0 is taken as "no scale", 1
    _m(DEF, "zero-scale-as-absent", "A_scale read as `A_scale or 1.0`: a zero scale taken as absent",
       (_SCALE, "    scale = (A_scale or 1.0) * B_scale.to(torch.float32)\n"), cls="boundary-structure"),
    # scale_overflow: the operands dequantised before the product: 448 * 2^120 is inf in float32
    _m(DEF, "dequantize-operands", "each operand multiplied by its scale in float32 before the product",
       (_ACC, "    acc = torch.matmul(A.to(torch.float32) * A_scale, B.to(torch.float32) * B_scale)\n"),
       (_SCALE, "    scale = 1.0\n"), cls="boundary-magnitude"),
    # single_token: the token axis squeezed away (M = 1): A [b, k] broadcasts against B, C is [b, b, n]
    _m(DEF, "token-axis-squeezed", "A's token axis squeezed (a decode path that drops M = 1)", squeezed_a(1),
       cls="boundary-structure"),
    # single_batch: the batch axis squeezed (batch 1): C comes back [M, N], not [1, M, N]
    _m(ODD, "batch-axis-squeezed", "the batch axis squeezed (a path that treats batch 1 as a plain GEMM)",
       _SQUEEZE_BATCH, cls="boundary-structure"),
    _m(DEF, "b-scale-dropped", "B_scale never applied",
       (_SCALE, "    scale = A_scale.to(torch.float32)\n")),
    _m(DEF, "reciprocal-scale", "the scales taken as quantisation scales: divided by, not multiplied",
       (_SCALE, "    scale = 1.0 / (A_scale.to(torch.float32) * B_scale.to(torch.float32))\n")),
    _m(DEF, "first-batch-weights", "every batch multiplied by B[0] (the batch stride of B taken as 0)", _FIRST_BATCH),
    # the partial K tile: only ODD has one (144 = 2 * 64 + 16)
    _m(ODD, "k-tail-dropped", "the sum over K stops at the last whole 64-wide tile (the 16-wide tail dropped)",
       _K_TAIL),
    _writes(DEF, "writes-scale", "right output, but A_scale is set to 1 in place afterwards (the caller's tensor)",
            "    return (acc * scale).to(torch.bfloat16)", "A_scale.fill_(1.0)"),
)

BF = "bmm_bf16_b128_k512_n128"
BF_ODD = "bmm_bf16_b16_k144_n80"

MUTANTS += (
    # beyond_fp16: outputs ~2^16 go through a float16 epilogue: inf past 65504
    _m(BF, "fp16-epilogue", "the float32 sum rounded to float16 before bf16 (a float16 epilogue)",
       FP16_EPILOGUE, cls="boundary-magnitude"),
    # single_token: M = 1 squeezed away
    _m(BF, "token-axis-squeezed", "A's token axis squeezed (a decode path that drops M = 1)", squeezed_a(1),
       cls="boundary-structure"),
    # single_batch: batch 1 squeezed away
    _m(BF_ODD, "batch-axis-squeezed", "the batch axis squeezed (batch 1 treated as a plain GEMM)", _SQUEEZE_BATCH,
       cls="boundary-structure"),
    _m(BF_ODD, "k-tail-dropped", "the sum over K stops at the last whole 64-wide tile (the 16-wide tail dropped)",
       _K_TAIL),
    _m(BF, "first-batch-weights", "every batch multiplied by B[0] (the batch stride of B taken as 0)", _FIRST_BATCH),
    _writes(BF, "writes-b", "right output, but B is zeroed in place afterwards (the caller's tensor)", GEMM_OUT,
            "B.zero_()"),
)
