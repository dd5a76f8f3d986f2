"""The pytest face of the engine (check.py): tests/references/test_<op_type>.py each declare one test,
`reference_test(op_type)`, which this plugin parametrizes over the engine's planned cases for that op
type and which asserts the engine's verdict. Nothing is checked here that `flashinfer-trace check`
does not check the same way. tests/references/test_fi_trace.py declares `fi_trace_test()`: every
definition (all op types) of the folder `--fi-trace-definitions DIR` names (import-fi-trace's output),
its records marked `definition_set="fi_trace"` so that a name FlashInfer shares with one of ours stays
apart; without the option it is one clean skip.

Options: the engine's (`check.add_check_options`: --sizes, --seeds, --device, --atol/--rtol/
--matched-ratio/--min-cosine, --draws, --save-failures, --save-inputs, --jit-report, the sandbox's),
plus --run-slow (the large tier), --known-issues FILE, --shard I/N and --fi-trace-definitions DIR.
Markers: gpu, flashinfer, sglang, slow and the arch markers of adapters that pin compute capabilities.
Every test records its `CaseRecord` as the user property `record` (the session's results are those records).
A case whose kernel differs where its API promises nothing (`info`, verdict/contract.py) is no pytest failure:
it passes with an `OutsideContract` warning, and its record says info.
"""

from __future__ import annotations

import sys
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from .check import Case, CheckConfig, Memo, config_from_options, configure_sandbox, run_case
from .escape import for_terminal
from .options import add_check_options
from .results.record import FI_TRACE_SET, CaseRecord, qualified_name
from .status import Kind, Status

ARCH_MARKERS = ("sm80", "sm89", "sm90", "sm100", "sm103", "sm120")
MARKERS = {
    "gpu": "needs a CUDA device",
    "flashinfer": "uses the FlashInfer ground truth",
    "sglang": "uses the SGLang ground truth",
    "slow": "large sizes, not in the default run",
    **{a: f"the ground truth runs on {a}" for a in ARCH_MARKERS},
}


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("flashinfer-trace", "flashinfer-trace reference tests")
    add_check_options(g.addoption)
    g.addoption("--run-slow", action="store_true", help="include the large tier")
    g.addoption("--known-issues", default=None,
                help="known-issues TOML (default: constraints/known-issues.toml of the rootdir)")
    g.addoption("--shard", default=None, metavar="I/N",
                help="run the I-th of N shards (definitions dealt round-robin by name; the session's isolation "
                     "runs the shards of a large test file in parallel processes)")
    g.addoption(FI_TRACE_OPTION, dest="fi_trace_definitions", default=None, metavar="DIR",
                help="FlashInfer's own definitions (flashinfer-trace import-fi-trace --out DIR) for "
                     "tests/references/test_fi_trace.py; without it that test skips")


FI_TRACE_OPTION = "--fi-trace-definitions"


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    configure_sandbox(config.getoption)


@cache
def _check_config(config: pytest.Config) -> CheckConfig:
    report = config.getoption("jit_report")
    checked = config_from_options(config.getoption, prebuild_lookup=_watch(report) if report else None)
    if config.getoption("--run-slow") and "large" not in checked.sizes:
        checked.sizes = (*checked.sizes, "large")
    return checked


def _watch(report: str):
    """The prebuild's answers from its report as it grows (a running prebuild's jobs are waited for)."""
    from .sweep.jit.report import watch

    return watch(report).outcome


def reference_test(op_type: str):
    """The one test of an op type's file: each planned case of its definitions, asserted."""

    def test(case: Case, reference_engine: _Engine) -> None:
        reference_engine.check(case)

    test.op_type = op_type  # type: ignore[attr-defined]
    test.__name__ = f"test_{op_type}"
    return test


def fi_trace_test():
    """The one test of test_fi_trace.py: each planned case of every definition in --fi-trace-definitions DIR."""

    def test_fi_trace(case: Case, reference_engine: _Engine) -> None:
        reference_engine.check(case)

    test_fi_trace.definition_set = FI_TRACE_SET  # type: ignore[attr-defined]
    return test_fi_trace


def fi_trace_cases(folder: str | Path, config: CheckConfig) -> list[Case | CaseRecord]:
    """Every case of the definitions under `folder` (every op type; a file that does not load is one error
    record), each of definition set fi_trace."""
    from dataclasses import replace

    from .check import discover, plan

    if not Path(folder).is_dir():
        raise pytest.UsageError(f"{FI_TRACE_OPTION} {folder}: no such folder (flashinfer-trace import-fi-trace "
                                f"--out DIR writes one)")
    config = replace(config, definitions_dir=str(folder))
    return plan(discover([str(folder)], config), config)


@cache
def _fi_trace_config(config: pytest.Config) -> CheckConfig:
    """The engine's config for the fi_trace set: the session's, less the JIT report. The prebuild plans
    definitions/ only and its report is keyed by definition name, which FlashInfer's files may share with
    ours (rmsnorm_h4096): read for these, it would answer for another definition."""
    from dataclasses import replace

    return replace(_check_config(config), definition_set=FI_TRACE_SET, prebuild_lookup=None)


def planned_cases(op_type: str, config: CheckConfig) -> list[Case | CaseRecord]:
    from .check import Discovered, plan
    from .dataset import Dataset

    dataset = Dataset(config.definitions_dir)
    definitions = sorted(dataset.select(op_type=op_type, names=dataset.names_maybe_of(op_type)),
                         key=lambda d: d.name)
    return plan(Discovered(definitions, []), config)


def _marks(case: Case) -> list[pytest.MarkDecorator]:
    from .groundtruth import adapters_for

    marks = [pytest.mark.slow] if case.size == "large" else []
    if case.source in ("flashinfer", "sglang"):
        marks += [pytest.mark.gpu, getattr(pytest.mark, case.source)]
        arch = {f"sm{a.min_cc[0]}{a.min_cc[1]}" for a in adapters_for(case.definition.op_type, case.source)
                if a.min_cc}
        marks += [getattr(pytest.mark, m) for m in sorted(arch)]
    return marks


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    op_type = getattr(metafunc.function, "op_type", None)
    definition_set = getattr(metafunc.function, "definition_set", None)
    if (op_type is None and definition_set is None) or "case" not in metafunc.fixturenames:
        return
    if definition_set is not None:
        folder = metafunc.config.getoption("fi_trace_definitions")
        if not folder:
            reason = (f"no {FI_TRACE_OPTION} DIR: FlashInfer's own definitions are checked only where a folder of "
                      f"them is given (flashinfer-trace import-fi-trace --out DIR)")
            metafunc.parametrize("case", [pytest.param(None, id="no-fi-trace-definitions",
                                                       marks=pytest.mark.skip(reason=reason))])
            return
        cases = fi_trace_cases(folder, _fi_trace_config(metafunc.config))
    else:
        cases = planned_cases(op_type, _check_config(metafunc.config))
    params = []
    for c in cases:
        if isinstance(c, CaseRecord):  # no generator: one skip that says so
            params.append(pytest.param(c, id=f"{c.definition}-{c.check.value}"))
        else:
            params.append(pytest.param(c, id=c.id, marks=_marks(c)))
    metafunc.parametrize("case", params)


def identity(case: Case | CaseRecord) -> dict[str, Any]:
    """What a record of this case says before it ran (a crash's record is made from it)."""
    if isinstance(case, CaseRecord):
        return case.as_dict()
    return case.record(Status.NOT_RUN).model_dump(mode="json", include={
        "definition", "definition_set", "op_type", "check", "size", "seed", "case", "source", "path", "fresh",
        "status", "schema_version"})


def _case_of(item: pytest.Item) -> Case | CaseRecord | None:
    return getattr(getattr(item, "callspec", None), "params", {}).get("case")


class OutsideContract(UserWarning):
    """A reference test whose kernel differs where its API promises nothing (Status.INFO: verdict/contract.py)."""


class _Engine:
    """The session's engine state (config, the current case's inputs) bound to one test."""

    def __init__(self, config: CheckConfig, memo: Memo, node: pytest.Item) -> None:
        self.config, self.memo, self.node = config, memo, node

    def check(self, case: Case | CaseRecord) -> None:
        if isinstance(case, CaseRecord):
            record = case
        elif self.memo.device.startswith("cuda") and not _cuda_available():
            record = case.record(Status.SKIP, kind=Kind.NO_GPU,
                                 detail="no-gpu: --device cuda but torch sees no CUDA device")
        else:
            record = run_case(case, self.memo, self.config)
        _set_record(self.node.user_properties, record.as_dict())
        if record.status is Status.PASS:
            return
        if record.status is Status.INFO:  # differs where the API promises nothing: not a failure, said aloud
            warnings.warn(OutsideContract(for_terminal(record.detail or "", multiline=True)), stacklevel=2)
            return
        # pytest prints these to the terminal as they are, and a detail may quote the definition. A not-run case
        # (`not-run: building`) is pytest's skip too: the record, not pytest's outcome, is what the session keeps
        if record.status in (Status.SKIP, Status.NOT_RUN):
            pytest.skip(reason=for_terminal(record.detail or f"{record.status}: {record.kind}", multiline=True))
        pytest.fail(for_terminal(f"{record.status.value}: {record.detail}", multiline=True), pytrace=False)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="session")
def reference_memo(pytestconfig: pytest.Config) -> Memo:
    config = _check_config(pytestconfig)
    return Memo(config.resolved_device, config.memory())


@pytest.fixture
def reference_engine(request: pytest.FixtureRequest, pytestconfig: pytest.Config, reference_memo: Memo):
    fi_trace = getattr(request.function, "definition_set", None) == FI_TRACE_SET
    yield _Engine(_fi_trace_config(pytestconfig) if fi_trace else _check_config(pytestconfig), reference_memo,
                  request.node)
    release_cuda_cache()
    strays(reference_memo)


def release_cuda_cache() -> None:
    """Give this process's cached CUDA blocks back after each test: a session runs several test processes
    and reference workers on one GPU, and blocks one of them caches after a large case are memory the
    others cannot get. A CUDA context the test broke (a sticky error: an illegal address, a launch failure)
    fails here: the process then ends after this test's report (`pytest_runtest_logfinish`), and the session's
    supervisor runs the rest in a new one, so that no later test inherits the error as its own."""
    global _broken
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except RuntimeError as e:
            _broken = " ".join(str(e).split())[:300]


def strays(memo: Memo) -> None:
    """A test process that keeps device memory no case of its holds (a library's cache, an object kept alive by
    mistake) takes it from the device's budget unseen: past STRAY_LIMIT it ends after this test, like a broken
    context, and the rest run in a new process (a cache that kept every FlashInfer wrapper alive grew test
    processes to 25-47 GiB on an H200 and ran the device out of memory for the cases that had leases)."""
    global _broken
    stray = memo.stray_bytes()
    if stray is not None and stray > STRAY_LIMIT and _broken is None:
        # tensors a reference cycle keeps (a planned launch's closure, a wrapper's bound methods) go back only when
        # the collector runs: collect before judging (on the H200, 114 test processes ended with 4-11 GiB "beyond
        # their cases" after large_offsets and large_page_index paths, each then starting its group again)
        import gc

        gc.collect()
        release_cuda_cache()
        stray = memo.stray_bytes()
    if stray is not None and stray > STRAY_LIMIT and _broken is None:
        _broken = (f"this process holds {stray / 2**30:.1f} GiB of device memory beyond its cases' "
                   f"(more than {STRAY_LIMIT / 2**30:.0f} GiB)")


STRAY_LIMIT = 4 << 30
_broken: str | None = None  # why this process's CUDA context cannot be trusted any more
EXIT_CONTEXT_BROKEN = 86  # the test process's exit status when it ends for that (isolation.py runs the rest anew)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid: str, location) -> None:
    if _broken is not None:
        sys.stderr.write(f"{nodeid}: the CUDA context cannot be trusted ({_broken}); this test process ends here "
                         "and the rest run in a new one\n")
        sys.stderr.flush()
        sys.stdout.flush()
        import os

        os._exit(EXIT_CONTEXT_BROKEN)


def _set_record(properties: list, record: dict[str, Any]) -> None:
    properties[:] = [(k, v) for k, v in properties if k != "record"] + [("record", record)]


def _known_issues_file(config: pytest.Config) -> Path:
    given = config.getoption("--known-issues")
    return Path(given) if given else Path(config.rootpath) / "constraints" / "known-issues.toml"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each reference test says which case it is (the stream plugin reports it, so a crash's record has
    it); known issues become strict xfail markers (run=false ones are not run at all); an expired entry
    stops the run: it has to be re-checked."""
    from .matrix.known_issues import installed_versions, load_known_issues

    for item in items:
        case = _case_of(item)
        if case is not None:
            item.user_properties.append(("case", identity(case)))
    shard = config.getoption("--shard")
    if shard:
        _keep_shard(config, items, shard)
    issues = load_known_issues(_known_issues_file(config))
    if not issues:
        return
    expired = [i for i in issues if i.expired()]
    if expired:
        raise pytest.UsageError("expired known issue(s), re-check and update or remove: "
                                + "; ".join(f"{i.id} (expired {i.expires})" for i in expired))
    versions = installed_versions({n for i in issues for n in i.packages})
    arch = _device_arch(config)
    prebuild = _check_config(config).prebuild()
    for item in items:
        case = _case_of(item)
        if case is None:
            continue
        name, source = _qualified(case), case.source
        for issue in issues:  # an fi_trace case by `fi_trace/<name>`: an entry for one of ours never matches it
            # the report is asked only where the issue otherwise applies: a running prebuild's lookup waits for
            # the job, and only these tests need its answer at collection
            if not issue.applies(name, source, versions, arch):
                continue
            if not (issue.unless_jit_ready and case.definition_set is None and _jit_lifts(prebuild, name, source)):
                item.add_marker(pytest.mark.xfail(strict=True, run=issue.run, reason=issue.describe()))
                item.user_properties.append(("known_issue", issue.id))
                break


def _qualified(case: Case | CaseRecord) -> str:
    if isinstance(case, CaseRecord):
        return case.qualified
    return qualified_name(case.definition.name, case.definition_set)


def _jit_ready(prebuild, definition: str, source: str | None) -> bool:
    """The session's prebuild (its JIT report) has this test's modules: built, found cached, or in FlashInfer's
    prebuilt package."""
    return _jit_status(prebuild, definition, source) in ("built", "cached", "prebuilt")


def _jit_lifts(prebuild, definition: str, source: str | None) -> bool:
    """An `unless_jit_ready` issue does not apply: the prebuild has the modules, or it deferred them to the
    combination's `jit-` session, and the case's own `not-run: building` (with the command) says more than the
    issue's xfail."""
    return _jit_status(prebuild, definition, source) in ("built", "cached", "prebuilt", "deferred")


def _jit_status(prebuild, definition: str, source: str | None) -> str | None:
    found = prebuild(definition, source) if prebuild is not None and source else None
    return None if found is None else str(found.status)


def _definition_of(item: pytest.Item) -> str | None:
    case = _case_of(item)
    if case is None:
        return None
    return case.definition if isinstance(case, CaseRecord) else case.definition.name


def _keep_shard(config: pytest.Config, items: list[pytest.Item], shard: str) -> None:
    """Keep the I-th of N shards: every test of a definition stays in one shard (its inputs and its
    reference worker are shared by neighbouring tests); tests of no definition go to shard 0."""
    index, _, count = shard.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise pytest.UsageError(f"--shard {shard!r}: expected I/N with 0 <= I < N") from None
    if not 0 <= i < n:
        raise pytest.UsageError(f"--shard {shard!r}: expected I/N with 0 <= I < N")
    names = sorted({d for d in map(_definition_of, items) if d})
    owner = {d: k % n for k, d in enumerate(names)}
    keep = [it for it in items if owner.get(_definition_of(it) or "", 0) == i]
    dropped = [it for it in items if owner.get(_definition_of(it) or "", 0) != i]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def _device_arch(config: pytest.Config) -> str | None:
    from .sweep.session import detect_arch

    return None if _check_config(config).resolved_device == "cpu" else detect_arch()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """The record's final status, where pytest decides it: a known issue's xfail / strict xpass, an error
    outside the test's call."""
    outcome = yield
    report = outcome.get_result()
    props = dict(report.user_properties)
    base = props.get("record") or props.get("case")
    if base is None:
        return
    xfail, issue = getattr(report, "wasxfail", None), props.get("known_issue")
    update: dict[str, Any] | None = None
    if report.skipped and xfail is not None:
        update = {"status": Status.XFAIL.value, "kind": Kind.KNOWN_ISSUE.value, "detail": xfail or None,
                  "known_issue": issue}
    elif (report.when == "call" and report.failed and issue
          and props.get("record", {}).get("status") in ("pass", "info")):
        update = {"status": Status.XPASS.value, "known_issue": issue,
                  "detail": f"known issue {issue} passes: the entry should go"}
    elif report.failed and report.when != "call":
        update = {"status": Status.ERROR.value, "kind": Kind.EXCEPTION.value,
                  "detail": f"error in {report.when}: {str(report.longrepr)[-1500:]}"}
    elif report.when == "call" and call.excinfo is not None and "record" not in props:
        update = {"status": Status.ERROR.value, "kind": Kind.EXCEPTION.value,
                  "detail": call.excinfo.exconly()[-1500:]}
    if update is not None:
        _set_record(report.user_properties, {**base, **update})
        _set_record(item.user_properties, {**base, **update})
