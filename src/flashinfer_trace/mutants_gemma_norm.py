"""Planted bugs of the Gemma norms (gemma_rmsnorm, gemma_fused_add_rmsnorm; op_type `rmsnorm`), one or more per
boundary class of docs/boundary/gemma_norm.md and a few plain ones: each boundary mutant is right on typical rows
and is caught by the case its comment names; the plain ones are caught everywhere; one is a known gap."""

from __future__ import annotations

from .mutants_model import Mutant, _m, _writes

DEF = "gemma_rmsnorm_h4608"  # Gemma-2-27B (bf16, param:eps=1e-6): FlashInfer's template default
FP16 = "gemma_rmsnorm_h4608_fp16"  # float16, eps an input
ODD = "gemma_rmsnorm_h129"  # the odd hidden size: no vector width divides its rows
SMALL = "gemma_rmsnorm_h2304"  # Gemma-2-2B: the narrowest model row (a per-column loop stays cheap)
FUSED = "gemma_fused_add_rmsnorm_h4608"
FUSED_FP16 = "gemma_fused_add_rmsnorm_h4608_fp16"
_RSQRT = "torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)"
_MEAN_SQ = "x.pow(2).mean(dim=-1, keepdim=True)"
_SCALE = "(1.0 + weight.to(torch.float32))"
_APPLY = "    y = x * inv_rms * (1.0 + weight.to(torch.float32))\n"
_RETURN = "    return y.to(hidden_states.dtype)"

MUTANTS: tuple[Mutant, ...] = (
    _m(DEF, "no-plus-one", "the weight applied as-is (a plain RMSNorm): Gemma's +1 forgotten",
       (_SCALE, "weight.to(torch.float32)")),
    # zero_rows: mean(x^2) = 0, rsqrt(0) = inf, 0 * inf = NaN where the output is 0
    _m(DEF, "no-eps", "eps never added: rsqrt of the bare mean square", (" + EPS)", ")"), cls="boundary-structure"),
    # eps_min / eps_max: activations * 1e-3 put mean(x^2) at eps's order, where 1 / (sqrt(ms) + eps) is not
    # rsqrt(ms + eps); on typical rows (ms ~ 1) the two agree to 1e-6
    _m(DEF, "eps-outside-sqrt", "eps added to the root mean square, 1 / (sqrt(mean(x^2)) + eps)",
       (_RSQRT, f"(1.0 / (torch.sqrt({_MEAN_SQ}) + EPS))"), cls="boundary-magnitude"),
    _m(DEF, "eps-constant", "its own EPS = 1e-5, not the declared 1e-6 (a ground truth that read EPS from the "
       "reference would agree with it)", ("EPS = 1e-6", "EPS = 1e-5"), cls="steers-verdict"),
    # minus_one_weight: the scale 1 + w is 2^-8 at the odd channels, and x^ * w rounded to bf16 is off by up to
    # 2^-9 of x^ (x^ near sqrt(H) at the spike): the cancellation leaves the output off by half of itself
    _m(DEF, "scale-in-output-dtype", "the scale applied as x^ + x^ * w in the activations' bf16 (x^ rounded, the "
       "product and the sum each rounded)",
       (_APPLY, "    n = (x * inv_rms).to(hidden_states.dtype)\n    y = (n + n * weight).to(torch.float32)\n"),
       cls="boundary-magnitude"),
    _m(DEF, "plus-one-in-weight-dtype", "1 + w rounded to the weight's bf16 before it multiplies",
       (_SCALE, "(1.0 + weight).to(torch.float32)"),
       survives="1 + w rounded to bf16 is off by at most 2^-8 of the scale, inside the bf16 tolerance (1e-2) by "
                "design, and exact wherever the scale is small (Sterbenz: w in [-1, -0.5]); only a kernel-specific "
                "check could see it"),
    _writes(DEF, "writes-weight", "right output, but the weight is zeroed in place afterwards (the caller's tensor: "
            "a ground truth reusing it would compute on the changed weight)", _RETURN, "weight.zero_()"),
    # dominant_element / near_max: a float16 square overflows past |x| = 256 (1e4^2 = 1e8): inf, then an output 0
    _m(FP16, "squares-in-input-dtype", "x^2 taken in float16 before the float32 mean",
       (_MEAN_SQ, "hidden_states.pow(2).to(torch.float32).mean(dim=-1, keepdim=True)"), cls="boundary-magnitude"),
    # dominant_element: row 0's spike is in the last column, which the reduction drops (typical rows lose 32 of
    # 4608 squares: 0.35% of the output)
    _m(DEF, "tail-dropped", "the sum of squares misses each row's last 32 columns (a reduction without its last "
       "warp's share), divided by the full width",
       (_MEAN_SQ, "x[..., :-32].pow(2).sum(dim=-1, keepdim=True) / x.shape[-1]"), cls="boundary-structure"),
    # only a hidden size with a remainder has it; one column of 129 is 0.8% of the sum, so typical medium rows
    # catch it already (a row with a large last element), dominant_element by far more
    _m(ODD, "remainder-dropped", "the sum of squares over the vectorised body only (the last H % 8 columns "
       "dropped), divided by the full width",
       (_MEAN_SQ, "x[..., :x.shape[-1] - x.shape[-1] % 8].pow(2).sum(dim=-1, keepdim=True) / x.shape[-1]")),
    _m(SMALL, "sum-in-input-dtype", "the sum of squares accumulated one column at a time in bf16 (the running sum "
       "stalls once its spacing passes the squares)",
       (f"    inv_rms = {_RSQRT}\n",
        "    acc = torch.zeros(x.shape[0], 1, dtype=hidden_states.dtype, device=x.device)\n"
        "    for j in range(x.shape[-1]):\n"
        "        acc = acc + x[:, j:j + 1].pow(2).to(hidden_states.dtype)\n"
        "    inv_rms = torch.rsqrt(acc.to(torch.float32) / x.shape[-1] + EPS)\n")),
    _m(FUSED, "stale-residual", "the output is right but the residual is never written (only output returned: the "
       "in-place residual keeps its old value)",
       ("    return output.to(hidden_states.dtype), residual_out", "    return output.to(hidden_states.dtype)")),
    # residual_overflow: the float16 sum of two addends of 0.55-0.9 x 65504 is inf, and inf * rsqrt(inf) is NaN;
    # the definition's float32 sum stays finite (on typical rows the rounding is 2^-12 of the output)
    _m(FUSED_FP16, "add-in-input-dtype", "the residual add done in float16, the norm reading the rounded sum",
       ("s = hidden_states.to(torch.float32) + residual.to(torch.float32)",
        "s = (hidden_states + residual).to(torch.float32)"), cls="boundary-magnitude"),
)
