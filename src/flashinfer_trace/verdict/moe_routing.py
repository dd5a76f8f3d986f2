"""Comparing `moe_routing` outputs (flashinfer.fused_topk_deepseek): a selection per token, judged by the scores
that chose it, and the weights judged against that selection.

The API promises no tie-break (neither between experts of equal biased score at the topk cut nor between groups
of equal group score at the topk_group cut) and no order of the topk entries, so two right kernels may return
different ids. As verdict/topk.py does for the DSA indexer, a row passes when it is *a* valid selection under
the float64 scores (groundtruth/torch_moe_routing.sigmoid_scores), with a tie band covering float32 evaluation:

* topk distinct ids in [0, num_experts);
* groups: with g_k the topk_group-th largest float64 group score (sum of a group's two best biased scores),
  every group holding a chosen expert scores >= g_k - 2 * band, and the chosen experts' groups together with
  every group clearly above the cut (> g_k + 2 * band) are at most topk_group groups; the kept set is completed
  with the tied groups whose best expert is lowest (the completion most favourable to the row: a group only
  adds competitors);
* experts: with e_k the topk-th largest biased score inside the kept groups, every chosen expert scores
  >= e_k - band and every other expert of the kept groups <= e_k + band.

band = TIE_ATOL * (1 + |bias|): the kernel computes s in float32 (as 0.5 * tanh(x / 2) + 0.5: ~1e-7 absolute)
and adds a float32 bias (one rounding of |s + bias| <= 1 + |bias|): 2e-6 is ~10x that, and a mis-selection the
contract forbids (bias ignored, a wrong group score, one group too few) moves a score by far more.

The weights are then judged against the row's *own* selection: topk_values[t, j] must be
s[ids[t, j]] / sum_j s[ids[t, j]] * routed_scaling_factor (float64), within the definition's tolerance
(|a - e| <= atol + rtol * |e|, every element): a tie-break changes which weights are right, never whether
they are. A row whose ids are invalid still has its weights judged that way (so the values report says what
the values say). Every failure is a **bug** (`matched_ratio` does not apply to a selection).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .compare import DiffReport

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs
    from .compare import Tolerance

TIE_ATOL = 2e-6
MODEL = f"expert set by biased score within a group set by group score (ties within {TIE_ATOL:g} x (1 + |bias|))"
WEIGHTS_MODEL = "s[id] / sum(s[ids]) * routed_scaling_factor at the row's own ids"


def applies(definition: Definition) -> bool:
    from ..groundtruth.torch_moe_routing import applies as truth_applies

    return definition.op_type == "moe_routing" and truth_applies(definition) is None


def compare(definition: Definition, inputs: Inputs, actual, expected, tolerance: Tolerance) -> list[DiffReport]:
    from ..groundtruth.torch_moe_routing import config, sigmoid_scores

    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    tol = {**tolerance.as_dict(), "tie_atol": TIE_ATOL}
    if len(actual) != 2 or len(expected) != 2:
        return [DiffReport("outputs", [], problem=f"{len(actual)} output(s), expected topk_values and topk_indices",
                           verdict="bug", tolerance=tol)]
    n_group, topk_group, topk, scale = config(definition)
    s, biased = sigmoid_scores(inputs.values)
    band = TIE_ATOL * (1.0 + inputs.values["bias"].detach().cpu().to(torch.float64).abs())
    values = torch.as_tensor(actual[0]).detach().cpu()
    ids = torch.as_tensor(actual[1]).detach().cpu()
    want_e = torch.as_tensor(expected[1]).detach().cpu()
    reports = []
    idx = DiffReport("topk_indices", list(ids.shape), tolerance=tol, error_model=MODEL)
    shape = (s.shape[0], topk)
    want = definition.outputs["topk_indices"].dtype.value
    have = str(ids.dtype).removeprefix("torch.")
    if tuple(ids.shape) != shape or ids.is_floating_point():
        idx.problem, idx.verdict = f"shape {tuple(ids.shape)} {ids.dtype}, expected {shape} {want}", "bug"
        wvals = DiffReport("topk_values", list(values.shape), tolerance=tol, error_model=WEIGHTS_MODEL,
                           problem="no selection to judge the weights by", verdict="bug")
        return [wvals, idx]
    idx.total = ids.numel()
    problems = []
    ids64 = ids.to(torch.int64)
    # the truth's own selection is valid by construction: only rows choosing another set are judged
    same = (ids64.sort(dim=-1).values == want_e.to(torch.int64).sort(dim=-1).values).all(dim=-1) \
        if tuple(want_e.shape) == shape else torch.zeros(shape[0], dtype=torch.bool)
    for t in (~same).nonzero().flatten().tolist():
        bad, why = judge_row(ids64[t], biased[t], band, n_group, topk_group, topk)
        if bad:
            idx.mismatched += bad
            problems.append(f"token {t}: {why}")
            if idx.worst_index is None:
                idx.worst_index = [t, 0]
        else:
            idx.widened += int((~torch.isin(ids64[t], want_e[t].to(torch.int64))).sum())
    if idx.mismatched:
        more = f" (+{len(problems) - 2} more token(s))" if len(problems) > 2 else ""
        idx.verdict = "bug"
        idx.problem = f"{idx.mismatched} of {idx.total} ids wrong: " + "; ".join(problems[:2]) + more
    elif have != want:
        idx.problem, idx.verdict = f"dtype {have}, the API writes {want}", "bug"
    reports.append(judge_weights(values, ids64, s, scale, tolerance, tol))
    reports.append(idx)
    return reports


def judge_row(ids: torch.Tensor, biased: torch.Tensor, band: torch.Tensor, n_group: int, topk_group: int,
              topk: int) -> tuple[int, str]:
    """(wrong ids, why) for one token's selection."""
    experts = biased.numel()
    per = experts // n_group
    if bool(((ids < 0) | (ids >= experts)).any()):
        stray = ids[(ids < 0) | (ids >= experts)][:3].tolist()
        return int(((ids < 0) | (ids >= experts)).sum()), f"id(s) {stray} outside [0, {experts})"
    if ids.unique().numel() != ids.numel():
        return ids.numel() - ids.unique().numel(), "an expert chosen twice"
    grouped = biased.view(n_group, per)
    group_score = grouped.topk(min(2, per), dim=-1).values.sum(dim=-1)
    group_band = 2 * band.view(n_group, per).max(dim=-1).values
    g_k = group_score.topk(topk_group).values[-1]
    used = set((ids // per).tolist())
    low = [g for g in used if group_score[g] < g_k - group_band[g]]
    if low:
        return sum(int((ids // per == g).sum()) for g in low), (
            f"expert(s) from group {low[0]} (score {float(group_score[low[0]]):.6g}), below the "
            f"{topk_group}-th group score {float(g_k):.6g}")
    must = {g for g in range(n_group) if group_score[g] > g_k + group_band[g]}
    kept = used | must
    if len(kept) > topk_group:
        skipped = sorted(must - used)
        return max(1, len(kept) - topk_group), (f"experts from {len(used)} group(s) while group(s) {skipped[:3]} "
                                                f"score clearly above the {topk_group}-th: more than topk_group "
                                                f"groups, or a better group left out")
    tied = [g for g in range(n_group) if g not in kept and group_score[g] >= g_k - group_band[g]]
    tied.sort(key=lambda g: float(grouped[g].max()))
    kept |= set(tied[: topk_group - len(kept)])
    pool = torch.tensor(sorted(e for g in kept for e in range(g * per, (g + 1) * per)), dtype=torch.int64)
    e_k = biased[pool].topk(topk).values[-1]
    chosen = torch.isin(pool, ids)
    low_e = chosen & (biased[pool] < e_k - band[pool])
    high_e = ~chosen & (biased[pool] > e_k + band[pool])
    if bool(low_e.any()) or bool(high_e.any()):
        i = int(pool[low_e][0]) if bool(low_e.any()) else int(pool[high_e][0])
        what = "chosen" if bool(low_e.any()) else "left out"
        return max(int(low_e.sum()), int(high_e.sum())), (
            f"expert {i} {what} with biased score {float(biased[i]):.6g}, the {topk}-th in the kept groups is "
            f"{float(e_k):.6g}")
    return 0, ""


def judge_weights(values: torch.Tensor, ids: torch.Tensor, s: torch.Tensor, scale: float, tolerance: Tolerance,
                  tol: dict) -> DiffReport:
    report = DiffReport("topk_values", list(values.shape), tolerance=tol, error_model=WEIGHTS_MODEL)
    if tuple(values.shape) != tuple(ids.shape) or not values.is_floating_point():
        report.problem = f"shape {tuple(values.shape)} {values.dtype}, expected {tuple(ids.shape)} floating"
        report.verdict = "bug"
        return report
    report.total = values.numel()
    safe = ids.clamp(0, s.shape[1] - 1)
    picked = s.gather(1, safe)
    e = picked / picked.sum(dim=-1, keepdim=True) * scale
    a = values.to(torch.float64)
    err = (a - e).abs()
    allowed = tolerance.atol + tolerance.rtol * e.abs()
    bad = ~(err <= allowed)  # NaN is bad
    report.mismatched = int(bad.sum())
    report.nan_actual = int(torch.isnan(a).sum())
    if report.total:
        report.max_abs = float(torch.nan_to_num(err, nan=float("inf")).max())
        report.tolerance_used = float(torch.nan_to_num(err / allowed, nan=float("inf")).max())
    if report.mismatched:
        first = bad.nonzero()[0].tolist()
        report.worst_index = first
        report.worst_actual, report.worst_expected = float(a[tuple(first)]), float(e[tuple(first)])
        report.verdict = "bug"
        report.problem = (f"{report.mismatched} of {report.total} weights off the renormalised unbiased sigmoid of "
                          f"the row's own experts (first at {first}: {report.worst_actual:.6g} vs "
                          f"{report.worst_expected:.6g})")
    return report
