"""Planted bugs of the `layernorm` family, one or more per boundary class of docs/boundary/layernorm.md and a few
plain ones: each boundary mutant is right on typical rows (O(1) activations around a per-row offset) and is
caught by the case its comment names; the plain ones are caught everywhere."""

from __future__ import annotations

from .mutants_model import Mutant, _m, _writes

DEF = "layernorm_h128"  # DeepSeek-V3.2's indexer k_norm: the cheapest model-tagged definition
WIDE = "layernorm_h768"  # a hidden size that is no power of two: the row's float32 mean is inexact
ODD = "layernorm_h129"  # the odd hidden size: no vector width divides its rows
_LOAD = "    x = hidden_states.to(torch.float32)\n"
_MEAN = "    mean = x.mean(dim=-1, keepdim=True)\n"
_VAR = "    var = centered.pow(2).mean(dim=-1, keepdim=True)\n"
_RSQRT = "torch.rsqrt(var + eps)"
_AFFINE = "* weight.to(torch.float32) + bias.to(torch.float32)"

MUTANTS: tuple[Mutant, ...] = (
    # large_mean: E[x^2] - E[x]^2 cancels (the variance is down to 2^-16 / H of M^2, below float32's rounding
    # of M^2 once H > 256; at H = 128 bf16's 8-bit significands keep both terms exact enough: docs/boundary/
    # layernorm.md); near_max: x^2 overflows float32 in the constant rows (inf - inf). FlashInfer's own kernel has
    # this branch (generalLayerNorm's USE_DIFF_OF_SQUARES), switched off.
    _m(WIDE, "diff-of-squares", "variance as E[x^2] - E[x]^2 in float32 (one pass), not the mean square of the "
       "deviations", (_VAR, "    var = x.pow(2).mean(dim=-1, keepdim=True) - mean.pow(2)\n"),
       cls="boundary-magnitude"),
    # large_mean: the mean rounded to bf16 (a step of M / 128) loses the deviations it is subtracted from
    _m(DEF, "mean-in-input-dtype", "the mean rounded to the activations' bf16 before it is subtracted",
       (_MEAN, "    mean = x.mean(dim=-1, keepdim=True).to(hidden_states.dtype).to(torch.float32)\n"),
       cls="boundary-magnitude"),
    # constant_rows: variance 0, rsqrt(0) = inf, 0 * inf = NaN where the output is the bias
    _m(DEF, "no-eps", "eps never added: rsqrt of the bare variance", (_RSQRT, "torch.rsqrt(var)"),
       cls="boundary-structure"),
    # eps_min / eps_max: with a variance ~1e-6, 1 / (sqrt(var) + eps) and rsqrt(var + eps) differ by 2x and more
    _m(DEF, "eps-outside-sqrt", "eps added to the standard deviation, 1 / (sqrt(var) + eps)",
       (_RSQRT, "(1.0 / (torch.sqrt(var) + eps))"), cls="boundary-magnitude"),
    _m(DEF, "eps-literal", "a literal eps 1e-5 in the expression, not the eps input",
       (_RSQRT, "torch.rsqrt(var + 1e-5)")),
    # large_mean on the odd hidden size: a row zero-padded to a multiple of 8 lanes (one 16-byte bf16 vector) whose
    # padding counts in the variance as (0 - mean)^2 each (the bug FlashInfer's CuTe kernel comments it avoids)
    _m(ODD, "padded-lanes-in-variance", "the row zero-padded to a multiple of 8 and the padding's (0 - mean)^2 "
       "summed into the variance",
       (_VAR, "    pad = (-x.shape[-1]) % 8\n"
              "    var = (centered.pow(2).sum(dim=-1, keepdim=True) + pad * mean.pow(2)) / x.shape[-1]\n"),
       cls="boundary-structure"),
    # only a hidden size with a remainder has it (caught on typical rows too: one column of 129 moves the mean by
    # 0.8% of it); large_mean by far more
    _m(ODD, "remainder-dropped", "the mean sums the vectorised body only (the last H % 8 columns dropped), "
       "divided by the full width",
       (_MEAN, "    body = x.shape[-1] - x.shape[-1] % 8\n"
               "    mean = x[..., :body].sum(dim=-1, keepdim=True) / x.shape[-1]\n")),
    # constant_rows: row 0 is all zeros, max |x| = 0, 0 / 0 (the guard against overflow is scale-invariant
    # everywhere else: the statistics of x / m with eps / m^2 give the same output)
    _m(DEF, "rescale-no-zero-guard", "rows pre-scaled by their max |x| (an overflow guard) with no guard for a "
       "zero row", (_LOAD, "    m = hidden_states.to(torch.float32).abs().amax(dim=-1, keepdim=True)\n"
                           "    x = hidden_states.to(torch.float32) / m\n"),
       (_RSQRT, "torch.rsqrt(var + eps / (m * m))"), cls="boundary-structure"),
    _m(DEF, "no-centring", "the mean is not subtracted (an RMSNorm with a bias)",
       ("    centered = x - mean\n", "    centered = x\n")),
    _m(DEF, "no-bias", "the bias is not added", (_AFFINE, "* weight.to(torch.float32)")),
    _m(DEF, "bias-before-scale", "(x^ + bias) * weight: the bias added before the scale",
       ("centered * torch.rsqrt(var + eps) * weight.to(torch.float32) + bias.to(torch.float32)",
        "(centered * torch.rsqrt(var + eps) + bias.to(torch.float32)) * weight.to(torch.float32)")),
    _m(DEF, "tokens-axis", "mean and variance over the tokens (dim 0), not the hidden dimension",
       (_MEAN, "    mean = x.mean(dim=0, keepdim=True)\n"),
       (_VAR, "    var = centered.pow(2).mean(dim=0, keepdim=True)\n")),
    _writes(DEF, "writes-bias", "right output, but the bias is zeroed in place afterwards (the caller's tensor: a "
            "ground truth reusing it would compute on the changed bias)", "    return y.to(hidden_states.dtype)",
            "bias.zero_()"),
)
