"""The bisect engine: the config, a probe's verdict, the search over the releases, the report. Pure logic: the
probe is passed in (probe.py's `probe_release` installs and checks a release; tests pass a fake)."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from ..results.record import CaseRecord
from ..status import SEVERITY, CellState, Status, cell_state
from ..sweep.combos import Combination

# a release whose kernel computes this definition wrong: what bisect looks for
BAD_STATES = (CellState.FAIL, CellState.FLAKY_WRONG)
# the package bisected -> the ground truth that exercises it, and where its changelog is (tags are v<version>)
SOURCE_OF = {"flashinfer-python": "flashinfer", "sglang": "sglang"}
REPOSITORY_OF = {"flashinfer-python": "flashinfer-ai/flashinfer", "sglang": "sgl-project/sglang"}


class BisectError(ValueError):
    """A bisect that cannot start or cannot conclude, in words naming the bad input."""


class Verdict(str, enum.Enum):
    GOOD = "good"
    BAD = "bad"
    UNTESTABLE = "untestable"  # stepped past, as `git bisect skip`

    def __str__(self) -> str:
        return self.value


@dataclass
class BisectConfig:
    definition: str  # a name in the definitions folder, or the path of its JSON file
    package: str  # the distribution bisected: flashinfer-python, sglang, or the one a --kernel module comes from
    good: Version
    bad: Version
    combination: Combination  # the bad release's combination: a probe is it with `package` pinned to its version
    out: Path = Path("results/bisect")  # each probe's records under out/<definition>/<version>/
    source: str | None = None  # the ground truth checked; None: the package's (SOURCE_OF)
    kernel: str | None = None  # source "kernel": MODULE:FUNCTION (groundtruth/kernel.py)
    wheelhouse: Path | None = None  # offline: the releases' wheels (and the combination's) from this folder
    preinstalled_torch: str | None = None  # reuse this interpreter's torch in every probe (install.py)
    torch_index: str | None = None
    index_url: str | None = None  # where the releases are listed; None: pip's configured index
    pre: bool = False  # pre-releases count as candidates
    versions: tuple[Version, ...] | None = None  # the releases, given: no listing
    check_args: tuple[str, ...] = ()  # more `check` options for every probe: --repeats 5, --sizes small,medium
    definitions_dir: str | None = None
    project: Path = Path(".")  # the project the probes layer in (its src/)
    python: str = sys.executable  # makes the probes' venvs
    timeout: float = 6 * 3600.0  # seconds a probe's check may take

    def __post_init__(self) -> None:
        self.package = canonicalize_name(self.package)
        self.good, self.bad = Version(str(self.good)), Version(str(self.bad))
        if self.source is None:
            self.source = "kernel" if self.kernel else SOURCE_OF.get(self.package)
        if self.source is None:
            raise BisectError(f"--package {self.package}: no ground truth exercises it; name one with "
                              "--ground-truth, or your own function with --kernel MODULE:FUNCTION")
        if (self.source == "kernel") != (self.kernel is not None):
            raise BisectError("--kernel MODULE:FUNCTION and --ground-truth kernel go together")
        if self.combination.pin(self.package) is None:
            raise BisectError(f"--combination {self.combination.id} does not pin {self.package}: a probe is that "
                              "combination with the package pinned to one release")

    @property
    def name(self) -> str:
        """The definition's name (the file's stem for a path: definitions are named as their files)."""
        return Path(self.definition).stem if self.definition.endswith(".json") else self.definition

    def folder(self, version: Version | str) -> Path:
        return self.out / self.name / str(version)


def pinned(combo: Combination, package: str, version: Version) -> Combination:
    """The combination with `package` pinned to `version`: a combination of its own (its own id, so an offline
    install layers its own folder, and its own digest, so an environment is not taken for another's)."""
    name = canonicalize_name(package)
    if combo.pin(name) is None:
        raise BisectError(f"{combo.id} does not pin {name}")
    pins = {**combo.pins, name: Version(str(version))}
    digest = hashlib.sha256(f"{combo.sha256}\n{name}=={version}".encode()).hexdigest()
    return dataclasses.replace(combo, id=f"{combo.id}+{name}{version}".lower(), pins=pins, sha256=digest)


def between(versions: Iterable[Version], config: BisectConfig) -> list[Version]:
    """The releases strictly between good and bad, oldest first; pre-releases only with `config.pre`."""
    if config.good >= config.bad:
        raise BisectError(f"--good {config.good} is not older than --bad {config.bad}: bisect looks for the first "
                          "bad release after a good one")
    return sorted({v for v in versions if config.good < v < config.bad and (config.pre or not v.is_prerelease)})


# -- a probe ------------------------------------------------------------------------------------------
@dataclass
class Probe:
    """What checking the definition on one release said."""

    version: str
    verdict: Verdict
    state: CellState  # the worst state of the kernel's cases; install-failed where the release did not install
    detail: str = ""
    counts: dict[str, int] = field(default_factory=dict)  # the kernel's cases by status
    cases: dict[str, str] = field(default_factory=dict)  # case id -> status
    failing: list[dict[str, Any]] = field(default_factory=list)  # the wrong cases: detail, tolerance used
    folder: str | None = None  # where its install log, records and check log are

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "verdict": self.verdict.value, "state": self.state.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Probe:
        return cls(**{**data, "verdict": Verdict(data["verdict"]), "state": CellState(data["state"])})


def case_id(r: CaseRecord) -> str:
    parts = [r.check.value, f"{r.source}:{r.path}" if r.path else r.source, r.size,
             "fresh" if r.fresh else f"seed{r.seed}", r.case]
    return "-".join(str(p) for p in parts if p is not None)


def classify(version: Version | str, records: list[CaseRecord], source: str, folder: str | None = None) -> Probe:
    """A release's verdict from its records of the source's cases: bad where one is wrong, good where some pass
    and none is anything else but a skip or info, untestable otherwise (nothing ran, an error, a timeout)."""
    mine = [r for r in records if r.source == source]
    states = [cell_state(r.status, r.kind) for r in mine]
    counts: dict[str, int] = {}
    for r in mine:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    cases = {case_id(r): r.status.value for r in mine}
    worst = min(states, key=SEVERITY.index) if states else CellState.NOT_RUN
    versions = {r.ground_truth.version for r in mine if r.ground_truth and r.ground_truth.version}
    if versions and versions != {str(Version(str(version)))}:
        return Probe(str(version), Verdict.UNTESTABLE, CellState.ERROR, f"the probe ran {', '.join(sorted(versions))}, "
                     f"not {version}: the install did not take", counts, cases, folder=folder)
    bad = [r for r, s in zip(mine, states, strict=True) if s in BAD_STATES]
    if bad:
        failing = [{"case": case_id(r), "state": cell_state(r.status, r.kind).value, "detail": r.detail,
                    "tolerance_used": r.tolerance_used, "tolerance": r.tolerance, "repeats": r.repeats,
                    "api": r.ground_truth.api if r.ground_truth else None} for r in bad]
        return Probe(str(version), Verdict.BAD, worst, f"{len(bad)} of {len(mine)} case(s) wrong: {bad[0].detail}",
                     counts, cases, failing, folder)
    passed = [r for r in mine if r.status is Status.PASS]
    # info: differs only where the API promises nothing (verdict/contract.py): not wrong, so no reason to doubt
    others = [r for r in mine if r.status not in (Status.PASS, Status.SKIP, Status.INFO)]
    if passed and not others:
        return Probe(str(version), Verdict.GOOD, worst, f"{len(passed)} case(s) pass", counts, cases, folder=folder)
    why = others[0] if others else (mine[0] if mine else None)
    detail = (why.detail or why.status.value) if why else f"no {source} case ran"
    return Probe(str(version), Verdict.UNTESTABLE, worst, detail, counts, cases, folder=folder)


# -- the search -----------------------------------------------------------------------------------------
@dataclass
class BisectReport:
    definition: str
    package: str
    source: str
    good: str
    bad: str
    candidates: list[str]  # the releases strictly between
    first_bad: str
    last_good: str
    suspects: list[str]  # the releases the first bad one may be: untestable ones before it, then it
    probes: list[Probe]  # in the order they ran
    evidence: dict[str, Any]
    changelog: dict[str, Any] | None

    @property
    def untestable(self) -> list[Probe]:
        return [p for p in self.probes if p.verdict is Verdict.UNTESTABLE]

    def as_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in dataclasses.asdict(self).items() if k != "probes"},
                "probes": [p.as_dict() for p in self.probes],
                "untestable": [p.version for p in self.untestable]}

    def text(self) -> str:
        first = (f"the first bad release is {self.first_bad}" if len(self.suspects) == 1 else
                 f"the first bad release is one of {', '.join(self.suspects)} (untestable ones in between)")
        out = [f"bisect {self.definition} over {self.package} {self.good}..{self.bad} "
               f"({len(self.candidates)} release(s) between, {self.source} ground truth): {first}; "
               f"the last good is {self.last_good}", ""]
        out += [f"  {p.version:<16} {p.verdict.value:<10} {p.state.value:<14} {p.detail}" for p in self.probes]
        ev = self.evidence
        out += ["", f"evidence: {self.first_bad} is wrong in {len(ev['first_bad_failing'])} case(s):"]
        for f in ev["first_bad_failing"]:
            used = f.get("tolerance_used")
            out.append(f"  {f['case']}: {f['state']}: {f['detail']}" + (f" (tolerance used {used:.3g})" if used
                                                                          is not None else ""))
        same = ev["last_good_same_cases"]
        passed = sum(1 for s in same.values() if s == "pass")
        out.append(f"  the same {len(same)} case(s) on {self.last_good}: {passed} pass"
                   + ("" if passed == len(same) else f", others {sorted(set(same.values()) - {'pass'})}"))
        for p in self.untestable:
            out.append(f"skipped {p.version}, untestable ({p.state.value}): {p.detail}")
        if self.changelog:
            out.append(f"changelog: {self.changelog['url']}")
        return "\n".join(out) + "\n"


def changelog(package: str, last_good: str, first_bad: str) -> dict[str, Any] | None:
    """The commits between the two releases: a GitHub compare of their tags."""
    repo = REPOSITORY_OF.get(canonicalize_name(package))
    if repo is None:
        return None
    return {"repository": repo, "from": f"v{last_good}", "to": f"v{first_bad}",
            "url": f"https://github.com/{repo}/compare/v{last_good}...v{first_bad}"}


def search(candidates: list[Version], probe: Callable[[Version], Probe], config: BisectConfig,
           on_probe: Callable[[Probe], None] | None = None) -> BisectReport:
    """Bisect: the bad and the good release first (each must be what it is said to be), then the middle
    of what is left, stepping past untestable releases. The first bad release is the oldest bad one after the
    newest good one; untestable releases between the two are suspects too."""
    seq = [config.good, *sorted(candidates), config.bad]
    probes: list[Probe] = []

    def run(version: Version) -> Probe:
        p = probe(version)
        probes.append(p)
        if on_probe:
            on_probe(p)
        return p

    ends = {}
    for version, want in ((config.bad, Verdict.BAD), (config.good, Verdict.GOOD)):
        ends[want] = p = run(version)
        if p.verdict is not want:
            raise BisectError(f"the {want.value} release {version} is {p.verdict.value} for {config.name} "
                              f"({p.state.value}: {p.detail}); records in {p.folder}")
    lo, hi, skipped = 0, len(seq) - 1, set()
    by_index = {0: ends[Verdict.GOOD], hi: ends[Verdict.BAD]}
    while open_ := [i for i in range(lo + 1, hi) if i not in skipped]:
        middle = (lo + hi) / 2
        i = min(open_, key=lambda j: (abs(j - middle), j))
        p = by_index[i] = run(seq[i])
        if p.verdict is Verdict.GOOD:
            lo = i
        elif p.verdict is Verdict.BAD:
            hi = i
        else:
            skipped.add(i)
    first, last = by_index[hi], by_index[lo]
    evidence = {"first_bad_failing": first.failing, "first_bad_folder": first.folder, "last_good_folder": last.folder,
                "last_good_same_cases": {f["case"]: last.cases.get(f["case"], "not-run") for f in first.failing}}
    suspects = [str(seq[i]) for i in sorted(skipped) if lo < i < hi] + [str(seq[hi])]
    return BisectReport(config.name, config.package, str(config.source), str(config.good), str(config.bad),
                        [str(v) for v in sorted(candidates)], str(seq[hi]), str(seq[lo]), suspects, probes, evidence,
                        changelog(config.package, str(seq[lo]), str(seq[hi])))
