"""What a prebuild job is expected to cost and where that figure comes from, and which jobs a references or bench
session leaves to its combination's `jit-` session.

A job's expected seconds, best first: its own last build in the report (`built`: what it took; `build-timeout`: at
least what it ran), a known build (KNOWN_BUILDS: a module measured on an arch, with the evidence), the guess by op
type (GUESS). A session whose prebuild defers (`JitConfig.defer`) does not start a job expected to take longer than
its budget whose modules are not here: on the H200 two fp8 MoE jobs each spent their 600 s and failed, and the tests
of their definitions waited 20 minutes for nothing. Such a job is recorded `deferred` at once, naming the command
that builds it, and the cases of its definition record `not-run: building`. Its modules are here when a stamp says
so (an earlier build, the `jit-` session's included) or when the libraries of a known build are in the JIT cache or
FlashInfer's AOT folder (`jit import`, `--jit-modules`): then the job runs, and loads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .report import BuildRecord

if TYPE_CHECKING:
    from .cache import Stamps
    from .plan import JitConfig, Job

__all__ = ["GUESS", "GUESS_DEFAULT", "JIT_SESSION_BUDGET", "KNOWN_BUILDS", "Expectation", "KnownBuild",
           "build_command", "defer", "expectations", "fitting_budget", "known_build", "sharing_apis"]

# First guesses of a job's cost (seconds, cold, measured on an H100 with 0.6.6/0.7.2), used to order the jobs and
# tell the long ones when no earlier report says better.
GUESS = {"moe": 450, "gemm": 176, "sampling": 146, "gqa_ragged": 68, "mla_ragged": 68, "gqa_paged": 68, "rope": 59,
         "rmsnorm": 35, "mla_paged": 26, "activation": 8,
         "mamba_ssu": 90}  # mamba_ssu: a guess (one selective_state_update module per dtypes/dim/dstate)
# gdn: a guess, not measured (0.6.x gdn_prefill_sm90 compiles 32 CUTLASS sm90a kernel instantiations)
GUESS["gdn"] = 300
GUESS_DEFAULT = 30
# a `jit-` session's budget per job: it exists to build what the others leave (the fp8 MoE module, ~41 min)
JIT_SESSION_BUDGET = 3600.0


@dataclass(frozen=True)
class KnownBuild:
    """A module whose build was measured: a job of this source and API, on one of these archs, with the package's
    version in `versions`, is expected to take `seconds` and to build `modules` (their libraries' names)."""

    source: str
    api: str
    archs: tuple[str, ...]
    package: str
    versions: SpecifierSet
    seconds: float
    modules: tuple[str, ...]
    evidence: str

    def matches(self, source: str, api: str, arch: str | None, versions: dict[str, str | None]) -> bool:
        found = versions.get(self.package)
        if source != self.source or api != self.api or arch not in self.archs or not found:
            return False
        try:
            return Version(found) in self.versions
        except InvalidVersion:
            return False


KNOWN_BUILDS = (
    KnownBuild("flashinfer", "flashinfer.fused_moe.cutlass_fused_moe(use_deepseek_fp8_block_scale)", ("sm90",),
               "flashinfer-python", SpecifierSet(">=0.4"), 2460.0, ("fused_moe_90",),
               "fused_moe_90 (181 CUTLASS objects): about 41 min on 16 cores (H100, 2026-11-24: 109 of 181 objects "
               "in 25 min; docs/evidence/h100-runs.md); not built in 600 s, twice, on an H200 with 16 cores "
               "(0.5.3, 2026-11-28)"),
    # one JIT module, `topk`, behind three Python modules' APIs (the prebuild's groups are by Python module, so
    # three jobs built it at once and each ran out of its 600 s); the ragged and page-table transforms load it too
    *(KnownBuild("flashinfer", api, ("sm90",), "flashinfer-python", SpecifierSet(">=0.7.2"), 1400.0,
                 ("topk",), "topk: not built in 600 s three times beside 30 other builds on 16 cores, then built in "
                 "174 s from the objects ninja kept (0.7.2.post1, H200, 2026-11-29; docs/evidence/device-memory.md, "
                 "the sixth run)")
      for api in ("flashinfer.topk.top_k", "flashinfer.top_k_varlen",
                  "flashinfer.sampling.top_k_top_p_sampling_from_logits", "flashinfer.topk.top_k_ragged_transform",
                  "flashinfer.topk.top_k_page_table_transform")),
)


def sharing_apis(source: str, api: str) -> list[str]:
    """The other APIs of `source` that load the JIT modules a known build of `api` makes (KNOWN_BUILDS): a deferral
    of one is a deferral of them (the deferred record's `covers`)."""
    modules = {k.modules for k in KNOWN_BUILDS if k.source == source and k.api == api}
    return sorted({k.api for k in KNOWN_BUILDS if k.source == source and k.modules in modules} - {api})


def known_build(source: str, api: str, arch: str | None, versions: dict[str, str | None]) -> KnownBuild | None:
    """The measured build of this job's module here, if one is known."""
    return next((k for k in KNOWN_BUILDS if k.matches(source, api, arch, versions)), None)


@dataclass(frozen=True)
class Expectation:
    seconds: float
    origin: str  # "report: built in 700 s", "known: <evidence>", "guess: op type moe"


def _fallback(job: Job) -> Expectation:
    if job.expect is not None:
        return Expectation(float(job.expect), f"known: {job.expect_from or 'the plan'}")
    if job.op_type in GUESS:
        return Expectation(float(GUESS[job.op_type]), f"guess: op type {job.op_type}")
    return Expectation(float(GUESS_DEFAULT), "guess: default")


def expectations(jobs: Iterable[Job], previous: Iterable[BuildRecord] = ()) -> dict[tuple[str, str], Expectation]:
    """Each job's expected seconds and where they come from: its earlier build (a timed-out one took at least that,
    so the larger of it and what else is known), else a known build, else the guess by op type."""
    seen = {r.key: r for r in previous if r.status in ("built", "build-timeout")}
    out = {}
    for j in jobs:
        other, r = _fallback(j), seen.get(j.key)
        if r is None:
            out[j.key] = other
        elif r.status == "built":
            out[j.key] = Expectation(float(r.seconds), f"report: built in {r.seconds:g} s")
        elif r.seconds >= other.seconds:
            out[j.key] = Expectation(float(r.seconds), f"report: build-timeout after {r.seconds:g} s, at least that")
        else:
            out[j.key] = Expectation(other.seconds, f"{other.origin}; its last build ran out of time after "
                                                    f"{r.seconds:g} s")
    return out


def fitting_budget(seconds: float) -> float:
    """A budget a build expected to take `seconds` fits in with room (half again, in 5-minute steps; at least a
    `jit-` session's)."""
    return max(JIT_SESSION_BUDGET, 300.0 * math.ceil(1.5 * seconds / 300.0))


def build_command(session: str | None, definitions: list[str], seconds: float) -> str:
    """The command that builds these definitions' modules within a budget that fits `seconds`: the `jit-`
    session's (`session`), else `flashinfer-trace jit build`."""
    budget = f"{fitting_budget(seconds):g}"
    if session:
        k = definitions[0] if len(definitions) == 1 else '"' + " or ".join(definitions) + '"'
        return f"nox -s {session} -- -k {k} --jit-budget {budget}"
    return f"flashinfer-trace jit build {' '.join(definitions)} --budget {budget}"


def defer(jobs: Iterable[Job], expect: dict[tuple[str, str], Expectation], config: JitConfig, *,
          stamps: Stamps, roots: Callable[[], list[Path]] | None = None) -> list[BuildRecord]:
    """The `deferred` records of the jobs this session leaves to its `jit-` session: expected past their budget,
    no fresh stamp, and a module of theirs not here (`roots`: where modules may be, cache.module_roots)."""
    if not config.defer:
        return []
    here: set[str] | None = None
    out = []
    for j in jobs:
        e = expect[j.key]
        if e.seconds <= j.budget or stamps.fresh(j) is not None:
            continue
        if j.known_modules:
            if here is None:
                from . import cache

                here = {Path(p).stem for p in cache.libraries((roots or cache.module_roots)())}
            if set(j.known_modules) <= here:
                continue
        command = build_command(config.defer_to, [j.definition], e.seconds)
        out.append(BuildRecord(
            j.definition, j.source, "deferred", api=j.api, op_type=j.op_type, budget=j.budget, checked_by="plan",
            expected=e.seconds, expected_from=e.origin, covers=sharing_apis(j.source, j.api),
            message=f"not built here: expected {e.seconds:g} s ({e.origin}), more than this session's budget of "
                    f"{j.budget:g} s, and its modules are not in the JIT cache; build it with `{command}` (beside or "
                    f"before this session), then run this session again: its cases run once the module is cached"))
    return out
