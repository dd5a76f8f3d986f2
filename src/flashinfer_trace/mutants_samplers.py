"""Planted bugs of the samplers of inputs/samplers.py (min_p_sampling_from_probs, sampling_from_probs,
sampling_from_logits, top_k_top_p_sampling_from_logits: docs/boundary/samplers.md), one or more per boundary class,
each a text edit of a shipped definition's reference. mutants.py appends them to its MUTANTS;
tests/unit/test_samplers.py checks that each passes a typical case and fails its boundary case (or, for plain wrong
math, the typical one), all on the CPU against the float64 ground truth."""

from __future__ import annotations

from .mutants_model import Mutant, _m

MIN_P, MIN_P_SCALAR = "min_p_sampling_from_probs_v128256", "min_p_sampling_from_probs_v151936"
PLAIN = "sampling_from_probs_v32000"
LOGITS, LOGITS_BF16 = "sampling_from_logits_v128256", "sampling_from_logits_v151936_bf16"
TKTP, TKTP_SCALAR = "top_k_top_p_sampling_from_logits_v128256", "top_k_top_p_sampling_from_logits_v151936"

_THRESHOLD = "threshold = p.max(dim=-1, keepdim=True).values * mp"
_KEEP = "kept = torch.where(p >= threshold, p, torch.zeros_like(p))"
_MIN_P_DRAW = ("    kept = kept / kept.sum(dim=-1, keepdim=True)  # renormalise\n")
# an inverse-CDF draw in id order with a uniform on [0, 1): past the kept mass it lands on the last id
_UNNORMALISED = ("    u = torch.rand(p.shape[0], 1, dtype=torch.float64, device=p.device)\n"
                 "    choice = torch.searchsorted(kept.to(torch.float64).cumsum(dim=-1), u, right=True)\n"
                 "    return choice.clamp(max=p.shape[1] - 1).squeeze(1).to(torch.int32)\n")
_SOFTMAX = "e = torch.exp(x - x.max(dim=-1, keepdim=True).values)"
_LOAD = "x = logits.to(torch.float32)"

MUTANTS: tuple[Mutant, ...] = (
    # min-p
    # min_p_one, min_p_exact, uniform, tiny_probs: min_p past every probability keeps nothing, and the reference
    # raises (a row of zeros has no distribution); where something is kept the tail it cuts is below the CPU's reach
    _m(MIN_P, "relative-to-one", "the threshold is min_p itself, not min_p times the row's largest probability",
       (_THRESHOLD, "threshold = mp + 0 * p.max(dim=-1, keepdim=True).values")),
    # min_p_exact: 13 (5) tokens sit exactly on max * min_p and hold most of the kept mass
    _m(MIN_P, "strict-threshold", "a token kept when its probability is > min_p * max, not >=",
       (_KEEP, "kept = torch.where(p > threshold, p, torch.zeros_like(p))"), cls="boundary-parameter"),
    # every row whose filter removes mass: draws past the kept mass land outside the set (min_p_one, min_p_exact)
    _m(MIN_P_SCALAR, "not-renormalised", "the kept probabilities are not renormalised: an inverse-CDF draw with a "
       "uniform on [0, 1) runs past the kept mass onto the last token id",
       (_MIN_P_DRAW, ""), ("    return torch.multinomial(kept.to(torch.float64), 1).squeeze(1).to(torch.int32)\n",
                           _UNNORMALISED)),
    # min_p_zero: a disabling value not recognised (a default leaking in for 0)
    _m(MIN_P_SCALAR, "zero-min-p-default", "min_p = 0 replaced by a default of 0.1 (0 taken for 'unset', not for "
       "'keep every token')", ("    " + _THRESHOLD, "    mp = torch.where(mp > 0, mp, 0.1)\n    " + _THRESHOLD),
       cls="boundary-parameter"),
    # plain categorical
    _m(PLAIN, "last-token-dropped", "the last token id never read (a loop bound of vocab_size - 1)",
       ("    p = probs.to(torch.float64)\n", "    p = probs.to(torch.float64).clone()\n    p[:, -1] = 0\n"),
       cls="boundary-index"),
    _m(PLAIN, "probs-as-logits", "a softmax over the probabilities (read as logits): every zero-probability token "
       "drawable", ("p = probs.to(torch.float64)", "p = torch.softmax(probs.to(torch.float64), dim=-1)")),
    # from logits: huge_logits (exp overflows / underflows: inf / inf, 0 / 0), neg_inf_logits, float16's range
    _m(LOGITS, "no-max-subtraction", "softmax as exp(x) / sum(exp(x)), the row's maximum not subtracted",
       (_SOFTMAX, "e = torch.exp(x)"), cls="boundary-magnitude"),
    _m(LOGITS, "neg-inf-zeroed", "-inf logits sanitised to 0 (nan_to_num): masked tokens drawable",
       (_LOAD, "x = torch.nan_to_num(logits.to(torch.float32), neginf=0.0)"), cls="boundary-structure"),
    _m(LOGITS_BF16, "float16-compute", "the logits handled in float16 (exact for typical bfloat16 logits, inf past "
       "65504)", (_LOAD, "x = logits.to(torch.float16).to(torch.float32)"), cls="boundary-magnitude"),
    # top-k / top-p from logits
    _m(TKTP, "ties-by-rank", "exactly k logits kept by sort position: a tie at the k-th logit is split",
       ("masked = torch.where(sorted_x >= kth,",
        "masked = torch.where(torch.arange(vocab_size, device=x.device)[None, :] < k[:, None],"), cls="boundary-ties"),
    # filter_order: the top-k tokens hold a sliver of the raw mass, so the raw nucleus keeps all k of them
    _m(TKTP, "top-p-on-raw-softmax", "top-p reads the mass of the softmax over every logit, not the renormalised "
       "top-k distribution (the two filters intersected)",
       ("probs = e / e.sum(dim=-1, keepdim=True)",
        "probs = e / torch.exp(sorted_x - sorted_x[:, :1]).sum(dim=-1, keepdim=True)"), cls="boundary-structure"),
    _m(TKTP_SCALAR, "no-max-subtraction", "the kept logits' softmax as exp(x) / sum(exp(x)), the row's maximum not "
       "subtracted", ("e = torch.exp(masked - masked[:, :1])", "e = torch.exp(masked)"), cls="boundary-magnitude"),
)
