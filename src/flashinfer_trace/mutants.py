"""Planted bugs: mutated references that every comparison must catch.

A tolerance that lets rounding pass could let bugs pass too. Each mutant here is one definition's
reference with one realistic bug planted by text replacement (a transposed weight, the wrong eps, a
RoPE pairing, a causal mask off by one, a dropped sm_scale, a natural-log lse, the wrong expert
routing, ...). `kill(mutant, source)` runs it through `check`'s own plan (shapes and dtypes, every
size, seed and edge case against a ground truth with the op family's error model, determinism) and
says whether the bug was caught; the true reference must pass the same run, or the mutant is not
judged (a crash of the harness is no catch). The kill rate is the share
of mutants caught: `flashinfer-trace mutants` (CPU: torch ground truth; a GPU: FlashInfer too).

    kill(m, "torch")   ->  Kill(mutant, source, killed=True, how="match small seed 0: output ... [bug]")
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .dataset import load_definition
from .definition import Definition
from .groundtruth import GroundTruthUnavailable
from .groundtruth.base import REASON_KINDS
from .mutants_block_sparse import MUTANTS as BLOCK_SPARSE_MUTANTS
from .mutants_bmm import MUTANTS as BMM_MUTANTS
from .mutants_cascade import MUTANTS as CASCADE_MUTANTS
from .mutants_cascade_attention import MUTANTS as CASCADE_ATTENTION_MUTANTS
from .mutants_core import MUTANTS as CORE_MUTANTS
from .mutants_dequantize_fp4 import MUTANTS as DEQUANTIZE_FP4_MUTANTS
from .mutants_gemm_bf16 import MUTANTS as GEMM_BF16_MUTANTS
from .mutants_gemm_fp8 import MUTANTS as GEMM_FP8_MUTANTS
from .mutants_gemma_norm import MUTANTS as GEMMA_NORM_MUTANTS
from .mutants_layernorm import MUTANTS as LAYERNORM_MUTANTS
from .mutants_mhc import MUTANTS as MHC_MUTANTS
from .mutants_model import Mutant
from .mutants_moe_routing import MUTANTS as MOE_ROUTING_MUTANTS
from .mutants_page_append import MUTANTS as PAGE_APPEND_MUTANTS
from .mutants_pod import MUTANTS as POD_MUTANTS
from .mutants_samplers import MUTANTS as SAMPLERS_MUTANTS
from .mutants_segment_gemm import MUTANTS as SEGMENT_GEMM_MUTANTS
from .mutants_single import MUTANTS as SINGLE_MUTANTS
from .mutants_speculative import MUTANTS as SPECULATIVE_MUTANTS
from .mutants_topk import MUTANTS as TOPK_MUTANTS
from .mutants_topk_select import MUTANTS as TOPK_SELECT_MUTANTS
from .mutants_trtllm_paged import MUTANTS as TRTLLM_PAGED_MUTANTS
from .mutants_xqa import MUTANTS as XQA_MUTANTS

__all__ = ["KERNELS", "MUTANTS", "Kill", "Margin", "Mutant", "PlantedKernel", "baseline", "first_failure", "kill",
           "kill_kernel", "kill_rate", "kills", "mutate", "rates_by_class", "run_plan"]


MUTANTS: tuple[Mutant, ...] = (
    CORE_MUTANTS + CASCADE_MUTANTS + PAGE_APPEND_MUTANTS + SINGLE_MUTANTS + TOPK_MUTANTS + LAYERNORM_MUTANTS
    + GEMMA_NORM_MUTANTS + SAMPLERS_MUTANTS + TOPK_SELECT_MUTANTS + BMM_MUTANTS + MOE_ROUTING_MUTANTS
    + SEGMENT_GEMM_MUTANTS + BLOCK_SPARSE_MUTANTS + CASCADE_ATTENTION_MUTANTS + POD_MUTANTS + MHC_MUTANTS
    + DEQUANTIZE_FP4_MUTANTS + SPECULATIVE_MUTANTS + GEMM_FP8_MUTANTS + GEMM_BF16_MUTANTS + TRTLLM_PAGED_MUTANTS
    + XQA_MUTANTS)


# -- planted kernels -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlantedKernel:
    """A kernel with one planted bug, the way real kernels go wrong: the torch ground truth's computation
    wrapped so it is right on typical inputs and wrong at a boundary, or wrong in some of its calls. The
    true reference is judged against it as against FlashInfer (repeats as on a GPU); the checks must fail."""
    definition: str
    id: str
    bug: str
    wrap: Callable[[Callable], Callable]  # the torch adapter's function -> the planted kernel's
    cls: str
    races: bool = False  # run as a kernel with atomics (RACE_FACTOR times the repeats)
    survives: str | None = None

    @property
    def name(self) -> str:
        return f"kernel:{self.definition}:{self.id}"


def _flaky(rate: float):
    """Wrong (first output x1.5 + 0.5) in about `rate` of its calls, from its own stream: a race."""
    def wrap(fn):
        draws = random.Random(0x5EED)

        def kernel(call):
            out = fn(call)
            return (out[0] * 1.5 + 0.5, *out[1:]) if draws.random() < rate else out
        return kernel
    return wrap


def _overflowing_sum_of_squares(fn):
    """rmsnorm accumulating x^2 in fp16: a row whose sum of squares passes 65504 comes out 0."""
    def kernel(call):
        out = fn(call)
        x = call.inputs.values["hidden_states"].double()
        overflow = x.pow(2).sum(dim=-1) > 65504.0
        return (out[0].masked_fill(overflow[:, None], 0.0), *out[1:])
    return kernel


SENTINEL = -5e4  # a finite "-inf" a kernel's running max starts from


def _sentinel_sdpa(q, k, v, scale, causal_offset):
    """Attention whose running max over the raw scores q . k starts at SENTINEL and whose exponentials are
    float32: a row whose every raw score is far below the sentinel underflows to output 0, and a row that sees
    no key (causal, more queries than keys) gets a finite lse."""
    hq, lq, _ = q.shape
    hk, lk, dv = v.shape
    if lk == 0:  # a request with no keys at all: 0 and -inf, as FlashInfer's adapter reports it
        return (torch.zeros(lq, hq, dv, dtype=q.dtype, device=q.device),
                torch.full((lq, hq), -math.inf, dtype=q.dtype, device=q.device))
    group = hq // max(hk, 1)
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    raw = torch.einsum("hqd,hkd->hqk", q, k)
    if causal_offset is not None:
        i = torch.arange(lq, device=q.device)[:, None]
        raw = raw.masked_fill(torch.arange(lk, device=q.device)[None, :] > i + causal_offset, -math.inf)
    peak = raw.amax(dim=-1, keepdim=True).clamp(min=SENTINEL)
    p = torch.exp(((raw - peak) * scale).float()).double()
    total = p.sum(dim=-1)
    out = torch.einsum("hqk,hkd->hqd", p, v) / total.clamp(min=1e-300)[..., None]
    out = torch.where((total > 0)[..., None], out, 0.0)
    lse = peak.squeeze(-1) * scale + torch.log(total.clamp(min=1e-300))
    lse = torch.where(total > 0, lse, peak.squeeze(-1) * scale)
    return out.transpose(0, 1), (lse / math.log(2.0)).transpose(0, 1)


def _sentinel_softmax(fn):
    def kernel(call):
        from .groundtruth import torch_ref

        original, torch_ref._sdpa_with_lse = torch_ref._sdpa_with_lse, _sentinel_sdpa
        try:
            return fn(call)
        finally:
            torch_ref._sdpa_with_lse = original
    return kernel


KERNELS: tuple[PlantedKernel, ...] = (
    PlantedKernel("rmsnorm_h4096", "flaky-1-in-10", "wrong in one call of ten (a race)", _flaky(0.1), "flaky",
                  races=True),
    PlantedKernel("gqa_paged_decode_h32_kv8_d128_ps1", "flaky-1-in-10", "wrong in one call of ten (split-kv race)",
                  _flaky(0.1), "flaky", races=True),
    PlantedKernel("rmsnorm_h4096", "fp16-sum-of-squares", "x^2 summed in fp16: rows past 65504 come out 0",
                  _overflowing_sum_of_squares, "boundary-magnitude"),
    PlantedKernel("gqa_paged_decode_h32_kv8_d128_ps1", "sentinel-softmax", "the running max starts at -5e4: rows "
                  "whose scores are all far below it come out 0", _sentinel_softmax, "boundary-magnitude"),
    PlantedKernel("gqa_paged_prefill_causal_h32_kv8_d128_ps1", "masked-row-lse", "a query that sees no key gets "
                  "the sentinel as its lse, not -inf", _sentinel_softmax, "boundary-structure"),
)


def kill_kernel(planted: PlantedKernel, *, device: str = "cpu", **kw) -> Kill:
    """Whether the checks catch a planted kernel: the true reference against it, repeats as on a GPU."""
    from .check import DEFAULT_REPEATS
    from .groundtruth import GroundTruth, adapters_for

    runs, why, base = baseline(planted.definition, "torch", device=device, **kw)
    if not runs:
        return Kill(planted.name, "planted", None, why or "not judged", baseline_margin=base)
    d = load_definition(planted.definition)
    adapter = next(a for a in adapters_for(d.op_type, "torch") if a.applies(d) is None)
    buggy = dataclasses.replace(adapter, fn=planted.wrap(adapter.fn), races=planted.races,
                                api=f"planted kernel {planted.id}")

    def resolve(source, definition, *, device=None, prebuild=None, path=None):
        return GroundTruth(buggy, definition, device or "cpu", None, None)

    r = run_plan(d, "torch", device=device, resolve=resolve, repeats=DEFAULT_REPEATS, **kw)
    return Kill(planted.name, "planted", r.failure is not None, r.failure or "survived: every check passed", r.margin,
                base)


def rates_by_class(pairs: Iterable[tuple[Mutant | PlantedKernel, Kill]]) -> dict[str, tuple[int, int]]:
    """(killed, judged) per class of bug."""
    out: dict[str, list[int]] = {}
    for m, k in pairs:
        if k.killed is not None:
            tally = out.setdefault(m.cls, [0, 0])
            tally[0] += int(k.killed)
            tally[1] += 1
    return {c: (a, b) for c, (a, b) in sorted(out.items())}


def mutate(definition: Definition, mutant: Mutant) -> Definition:
    """The definition with the mutant's edits applied; ValueError when an edit's text is not there."""
    code = definition.reference
    for old, new in mutant.edits:
        if old not in code:
            raise ValueError(f"{mutant.name}: {old!r} is not in the reference (was it rewritten?)")
        code = code.replace(old, new)
    return definition.model_copy(update={"reference": code})


@dataclass(frozen=True)
class Margin:
    """The closest a run's comparisons came to failing: the largest share of its tolerance any output
    used (<= 1 passes) and the lowest cosine. A surviving bug's margin beside the true reference's, against
    the same ground truth, says whether another criterion (a cosine floor) could catch it without failing
    correct kernels: the fp8 MoE's open question (docs/ground-truth.md)."""
    tolerance_used: float | None
    cosine: float | None
    comparisons: int

    @classmethod
    def of(cls, reports: list[dict]) -> Margin | None:
        if not reports:
            return None
        used = [r["tolerance_used"] for r in reports if r.get("tolerance_used") is not None]
        cos = [r["cosine"] for r in reports if r.get("cosine") is not None]
        return cls(max(used) if used else None, min(cos) if cos else None, len(reports))


@dataclass(frozen=True)
class Kill:
    mutant: str
    source: str
    killed: bool | None  # None: not judged: the ground truth cannot run here, or the true reference fails (how)
    how: str
    margin: Margin | None = None  # the mutant's comparisons up to the first failure (all of them if it survived)
    baseline_margin: Margin | None = None  # the true reference's, same plan and ground truth


# the planted bugs' fresh seed: fixed, so a kill is reproducible, yet its counts are drawn like a run's fresh seed's
# (inputs.common.fresh_count): a reference right only at the tiers' sizes is caught here as in a run
PLANTED_FRESH_SEED = 20261129


@dataclass(frozen=True)
class PlanRun:
    failure: str | None  # the first check that failed or errored; None when everything passed
    margin: Margin | None


def run_plan(d: Definition, source: str, *, device: str = "cpu", sizes=("small", "medium"), seeds=(0, 1),
             draws: int | None = None, tolerance: dict[str, float] | None = None, resolve=None,
             repeats: int | None = None, cases: tuple[str, ...] | None = None,
             fresh_seed: int | None = PLANTED_FRESH_SEED) -> PlanRun:
    """`check`'s plan (shape, dtype, every size x seed and the fresh seed, determinism, edge cases) for `d` against
    `source`, up to its first failure or error (`tolerance`: command-line overrides; `cases`: CheckConfig's).
    Raises GroundTruthUnavailable when the ground truth could not run any comparison here."""
    from .check import CheckConfig, Discovered, plan, run

    config = CheckConfig(sources=(source,), sizes=tuple(sizes), seeds=tuple(seeds), device=device, draws=draws,
                         tolerance=dict(tolerance or {}), resolve=resolve, repeats=repeats, paths=resolve is None,
                         cases=cases, fresh_seed=fresh_seed)
    compared, reports = [], []
    for r in run(plan(Discovered([d], []), config), config):
        if r.check in ("match", "edge"):
            compared.append(r)
            reports += [x for x in (r.reports or r.compared) if isinstance(x, dict)]
        if r.status in ("fail", "error"):
            where = " ".join(str(p) for p in (r.check, r.size, f"seed {r.seed}", r.case) if p)
            return PlanRun(f"{where}: {' '.join((r.detail or '').split())[:300]}", Margin.of(reports))
    if compared and all(r.status == "skip" for r in compared):
        first = compared[0]
        kind = first.kind.value if first.kind is not None and first.kind.value in REASON_KINDS else "unsupported"
        raise GroundTruthUnavailable(kind, (first.detail or kind).removeprefix(f"{kind}: "))
    return PlanRun(None, Margin.of(reports))


def first_failure(d: Definition, source: str, **kw) -> str | None:
    """The first check of `check`'s plan that fails or errors for `d` against `source`; None when
    everything passes (run_plan, without the margin)."""
    return run_plan(d, source, **kw).failure


_baselines: dict[tuple, tuple[bool, str | None, Margin | None]] = {}


def baseline(definition: str, source: str, *, device: str = "cpu", **kw) -> tuple[bool, str | None, Margin | None]:
    """(runs, why not, margin) for the true reference through the same plan, once per process: a mutant is
    judged only where its unmutated reference passes: a harness that cannot run the true reference (a
    worker that cannot start) must not count each crash as a caught bug."""
    key = (definition, source, device, repr(sorted(kw.items())))
    if key not in _baselines:
        try:
            r = run_plan(load_definition(definition), source, device=device, **kw)
            _baselines[key] = (r.failure is None, f"not judged: the true reference fails too: {r.failure}"
                               if r.failure else None, r.margin)
        except GroundTruthUnavailable as e:
            _baselines[key] = (False, str(e), None)
    return _baselines[key]


def kill(mutant: Mutant, source: str = "torch", *, device: str = "cpu", **kw) -> Kill:
    """Whether the checks catch the mutant; None (with why) when its true reference does not pass, or when it
    is planted at the GPU settings' thresholds and this is a CPU."""
    if mutant.gpu_only and device == "cpu":
        return Kill(mutant.name, source, None, f"not judged on the CPU: {mutant.gpu_only}")
    runs, why, base = baseline(mutant.definition, source, device=device, **kw)
    if not runs:
        return Kill(mutant.name, source, None, why or "not judged", baseline_margin=base)
    d = mutate(load_definition(mutant.definition), mutant)
    try:
        r = run_plan(d, source, device=device, **kw)
    except GroundTruthUnavailable as e:
        return Kill(mutant.name, source, None, str(e), baseline_margin=base)
    return Kill(mutant.name, source, r.failure is not None, r.failure or "survived: every check passed", r.margin, base)


def kills(source: str = "torch", *, device: str = "cpu", **kw) -> list[Kill]:
    return [kill(m, source, device=device, **kw) for m in MUTANTS]


def kill_rate(kills: Iterable[Kill]) -> tuple[int, int]:
    """(killed, run): mutants whose ground truth could not run are not counted."""
    ran = [k for k in kills if k.killed is not None]
    return sum(k.killed for k in ran), len(ran)
