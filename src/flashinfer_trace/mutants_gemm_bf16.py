"""Planted bugs of the `gemm_bf16` family, one or more per boundary class of docs/boundary/gemm_bf16.md and a few
plain ones: each boundary mutant is right on typical operands (activations N(0, 1), weights N(0, 1 / K)) and is
caught by the case its comment names; the plain ones are caught everywhere. They sit on the cheap definitions (K
200 for mm_bf16, the router GEMM for the long sums): the 4096 x 4096 one costs seconds of float64 per case."""

from __future__ import annotations

from .mutants_model import FP16_EPILOGUE, GEMM_ACC, GEMM_OUT, Mutant, _m, _writes, flushed_a, squeezed_a

ODD = "gemm_bf16_n72_k200"  # mm_bf16's form; K = 3 * 64 + 8, N = 64 + 8
ROUTER = "router_gemm_m16_k7168_n256"  # DeepSeek-V3's router: K 7168, float32 logits, M 1 .. 16
TINY = "tinygemm_bf16_n128_k2880"  # gpt-oss-120b's router through tinygemm_bf16: with a bias
_ACC, _OUT = GEMM_ACC, GEMM_OUT  # mm_bf16's accumulation and return lines
_R_ACC = "    out = torch.matmul(mat_a.to(torch.float32), mat_b.to(torch.float32))\n"
_R_OUT = "    return out"

MUTANTS: tuple[Mutant, ...] = (
    # long_k_positive: a bfloat16 running sum stalls once it is 2^8 times a term (typical sums cancel and pass)
    _m(ROUTER, "bf16-accumulator", "the sum over K kept in bfloat16, one product at a time",
       (_R_ACC, "    acc = torch.zeros(mat_a.shape[0], mat_b.shape[1], dtype=torch.bfloat16)\n"
                "    for k in range(mat_a.shape[1]):\n"
                "        acc = acc + mat_a[:, k:k + 1] * mat_b[k:k + 1, :]\n"
                "    out = acc.to(torch.float32)\n"), cls="boundary-magnitude"),
    # near_bf16_max: outputs ~2^118 through a float16 epilogue: inf past 65504
    _m(ODD, "fp16-epilogue", "the float32 sum rounded to float16 before bfloat16 (a float16 epilogue)",
       FP16_EPILOGUE, cls="boundary-magnitude"),
    # subnormal: bfloat16 subnormal activations (below 2^-126) flushed to zero: the output is 0
    _m(ODD, "subnormals-flushed", "subnormal activations (|a| < 2^-126) flushed to zero (FTZ on the inputs)",
       flushed_a(-126), cls="boundary-magnitude"),
    # single_token: M = 1 squeezed away (a GEMV path): C comes back [N], not [1, N]
    _m(ODD, "token-axis-squeezed", "A's token axis squeezed (a decode path that drops M = 1)", squeezed_a(0),
       cls="boundary-structure"),
    # max_tokens: only the first 8-row tile written (tinygemm-style TILE_N 8): rows 8 .. 15 are 0
    _m(ROUTER, "rows-past-8-dropped", "only the first 8 tokens computed (one 8-row tile); later rows left 0",
       (_R_OUT, "    out[8:] = 0\n    return out"), cls="boundary-structure"),
    # zero_rows: a per-row amax rescaling of A without a zero guard: 0 / 0 = NaN on a zero row
    _m(ODD, "row-amax-scaling", "A rescaled per row by its amax and back, no guard for amax 0 (NaN rows)",
       (_ACC, "    s = A.to(torch.float32).abs().amax(-1, keepdim=True)\n"
              "    acc = torch.matmul(A.to(torch.float32) / s, B.to(torch.float32)) * s\n"),
       cls="boundary-structure"),
    _m(ODD, "k-tail-dropped", "the sum over K stops at the last whole 64-wide tile (the 8-wide tail dropped)",
       (_ACC, "    kk = A.shape[-1] - A.shape[-1] % 64\n"
              "    acc = torch.matmul(A[:, :kk].to(torch.float32), B[:kk].to(torch.float32))\n")),
    _m(ODD, "n-tail-unwritten", "the output's columns past the last whole 64-wide tile left 0",
       (_OUT, "    acc[:, acc.shape[-1] - acc.shape[-1] % 64:] = 0\n    return acc.to(torch.bfloat16)")),
    _m(TINY, "bias-dropped", "the bias never added",
       ("    acc = acc + bias.to(torch.float32)\n", "")),
    _m(TINY, "bias-twice", "the bias added twice (once in the epilogue, once by the caller)",
       ("    acc = acc + bias.to(torch.float32)\n", "    acc = acc + 2 * bias.to(torch.float32)\n")),
    _writes(ROUTER, "writes-a", "right logits, but mat_a is zeroed in place afterwards (the caller's hidden states)",
            _R_OUT, "mat_a.zero_()", result=None),
)
