"""Planted bugs of the `gemm_fp8` family (block-scaled fp8 GEMM), one or more per boundary class of
docs/boundary/gemm_fp8.md and a few plain ones: each boundary mutant is right on typical operands (codes N(0, 8),
every block scale its own draw in 2^-8 .. 2^-2) and is caught by the case its comment names; the plain ones are
caught on typical operands."""

from __future__ import annotations

from .mutants_model import Mutant, _m, _writes

DEF = "fp8_blockscale_gemm_sm90_n3072_k1536"  # DeepSeek-V3's q_b_proj (tp 8): the cheapest model-tagged definition
ODD = "fp8_blockscale_gemm_sm90_n320_k384"  # N = 2.5 x 128: the last weight-scale block covers 64 rows
_A = "    a = input.to(torch.float32).reshape(M, blocks, 128)\n"
_W = "    w = weight.to(torch.float32).reshape(N, blocks, 128)\n"
_WS = "    w_scale = weight_scale.to(torch.float32).repeat_interleave(128, dim=0)[:N]\n"
_S = "    scale = input_scale.to(torch.float32).t()[:, :, None] * w_scale.t()[:, None, :]\n"
_OUT = "    return (partial * scale).sum(dim=0).to(torch.bfloat16)"

MUTANTS: tuple[Mutant, ...] = (
    # saturated: codes decoded with e4m3fnuz's limit (240) clip every +-448 operand
    _m(DEF, "fnuz-limit", "operands clipped to +-240 (e4m3fnuz's largest value), not e4m3fn's 448",
       (_A, "    a = input.to(torch.float32).clamp(-240, 240).reshape(M, blocks, 128)\n"),
       (_W, "    w = weight.to(torch.float32).clamp(-240, 240).reshape(N, blocks, 128)\n"), cls="boundary-magnitude"),
    # subnormal: activations below e4m3's smallest normal (2^-6) flushed to zero: the whole output is 0
    _m(DEF, "subnormals-flushed", "fp8 subnormal activations (|x| < 2^-6) flushed to zero",
       (_A, "    a = input.to(torch.float32).reshape(M, blocks, 128)\n"
            "    a = torch.where(a.abs() < 2 ** -6, 0.0, a)\n"),
       cls="boundary-magnitude"),
    # scale_overflow: the operands dequantised in float32 before the product: 448 * 2^120 is inf
    _m(DEF, "dequantize-operands", "each operand multiplied by its block scales in float32 before the product",
       (_A, "    a = input.to(torch.float32).reshape(M, blocks, 128) * input_scale.to(torch.float32)[:, :, None]\n"),
       (_W, "    w = weight.to(torch.float32).reshape(N, blocks, 128)\n"
            "    w = w * weight_scale.to(torch.float32).repeat_interleave(128, dim=0)[:N, :, None]\n"),
       (_S, "    scale = torch.ones((), dtype=torch.float32)\n"), cls="boundary-magnitude"),
    # tiny_scales: the activations dequantised into float16 (a W8A16-style path): 2^-100 * code underflows to 0
    _m(DEF, "half-dequantized-activations", "activations dequantised into float16 before the product",
       (_A, "    a = input.to(torch.float32) * input_scale.to(torch.float32).repeat_interleave(128, dim=1)\n"
            "    a = a.to(torch.float16).to(torch.float32).reshape(M, blocks, 128)\n"),
       (_S, "    scale = w_scale.t()[:, None, :]\n"), cls="boundary-magnitude"),
    # zero_block: a zero block scale taken as "no scale" (1): the weight block's stale +-448 codes come back
    _m(DEF, "zero-scale-as-one", "a weight block scale of 0 read as absent (1): `scale or 1`",
       (_WS, "    w_scale = weight_scale.to(torch.float32)\n    w_scale = torch.where(w_scale == 0, 1.0, w_scale)\n"
             "    w_scale = w_scale.repeat_interleave(128, dim=0)[:N]\n"), cls="boundary-magnitude"),
    # single_token: a decode path that squeezes M = 1 away: out comes back [N], not [1, N]
    _m(DEF, "token-axis-squeezed", "the token axis squeezed when M = 1 (a GEMV path that drops it)",
       (_OUT, "    return (partial * scale).sum(dim=0).squeeze(0).to(torch.bfloat16)"), cls="boundary-structure"),
    # the plain ones, caught on typical operands
    _m(DEF, "block-scale-read-per-token", "the [N/128, K/128] block scales read as per-token ones (row n: scale row n)",
       (_WS, "    w_scale = weight_scale.to(torch.float32)[torch.arange(N).clamp(max=weight_scale.shape[0] - 1)]\n")),
    _m(ODD, "n-tail-scale-proportional", "weight row n given scale row n * ceil(N/128) // N (right only when 128 "
                                         "divides N)",
       (_WS, "    w_scale = weight_scale.to(torch.float32)[torch.arange(N) * weight_scale.shape[0] // N]\n")),
    _m(DEF, "input-scale-layout", "input_scale's memory read M-major ([K/128, M]) as the kernel's layout, though "
                                  "it is given [M, K/128]",
       (_S, "    scale = input_scale.to(torch.float32).reshape(blocks, M)[:, :, None] * w_scale.t()[:, None, :]\n")),
    _m(DEF, "first-block-scale-only", "each token's first K-block scale applied to every block",
       (_S, "    scale = input_scale.to(torch.float32)[:, :1].t()[:, :, None] * w_scale.t()[:, None, :]\n")),
    _writes(DEF, "writes-scale", "right output, but input_scale is set to 1 in place afterwards (the caller's "
            "tensor)", _OUT, "input_scale.fill_(1.0)"),
)
