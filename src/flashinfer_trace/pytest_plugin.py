"""Options, fixtures and hooks of the generated reference tests (tests/references/conftest.py
imports them), kept in the package so they are versioned and unit-tested with it.

Options: --device auto|cpu|cuda, --sizes small,medium (large is marked slow and needs --run-slow
or an explicit --sizes), --seeds 0,1, --atol/--rtol/--matched-ratio/--min-cosine (override every tolerance),
--draws N (sampler draws per row), --save-failures DIR, --save-inputs, --shard I/N (definitions
dealt round-robin over N shards).

Every comparison records its tolerance, seed and ground truth as user properties (they reach the
JUnit XML and the per-test JSON), and every test its time per phase (`phases`: inputs, reference,
ground_truth, compare, worker_starts); a failing comparison is saved under --save-failures with the
command that replays it.
"""

from __future__ import annotations

import sys

import pytest

from .compare import Mismatch, tolerance_for
from .compare_samples import SamplingMismatch, SamplingSettings
from .dataset import load_definition
from .groundtruth import GroundTruthUnavailable, get_ground_truth

ARCH_MARKERS = ("sm80", "sm89", "sm90", "sm100", "sm103", "sm120")
MARKERS = {
    "gpu": "needs a CUDA device",
    "flashinfer": "uses the FlashInfer ground truth",
    "sglang": "uses the SGLang ground truth",
    "slow": "large sizes, not in the default run",
    **{a: f"the ground truth runs on {a}" for a in ARCH_MARKERS},
}
DEFAULT_SIZES = "small,medium"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("flashinfer-trace", "flashinfer-trace reference tests")
    g.addoption("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    g.addoption("--sizes", default=None, help=f"size tiers, comma separated (default {DEFAULT_SIZES})")
    g.addoption("--run-slow", action="store_true", help="include the large tier")
    g.addoption("--seeds", default="0,1", help="input seeds for the ground-truth comparisons")
    g.addoption("--atol", type=float, default=None, help="override every tolerance's atol")
    g.addoption("--rtol", type=float, default=None, help="override every tolerance's rtol")
    g.addoption("--matched-ratio", type=float, default=None, help="override the required matched ratio")
    g.addoption("--min-cosine", type=float, default=None, help="override the cosine floor (fp8 MoE sets one)")
    g.addoption("--draws", type=int, default=None, help="sampler draws per row (default 64 on cpu, 2000 on cuda)")
    g.addoption("--save-failures", default="results/failures", help="where failing cases are saved")
    g.addoption("--save-inputs", action="store_true", help="also save failing inputs as safetensors")
    g.addoption("--known-issues", default=None,
                help="known-issues TOML (default: $FLASHINFER_TRACE_KNOWN_ISSUES or constraints/known-issues.toml)")
    g.addoption("--allow-unconfined-references", action="store_true",
                help="run references where the worker cannot be fully confined (recorded; docs/sandbox.md)")
    g.addoption("--reference-timeout", type=float, default=None, help="seconds per reference call (default 900)")
    g.addoption("--shard", default=None, metavar="I/N",
                help="run the I-th of N shards (definitions dealt round-robin by name; the session's isolation "
                     "runs the shards of a large test file in parallel processes)")


INPUT_CACHE = 2  # generated cases kept: consecutive tests of one case share one generation


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    allow, timeout = config.getoption("--allow-unconfined-references"), config.getoption("--reference-timeout")
    if allow or timeout:
        from .sandbox import configure

        configure(timeout=timeout, allow_unconfined=True if allow else None)


def _sizes(config: pytest.Config) -> list[str]:
    given = config.getoption("--sizes")
    sizes = (given or DEFAULT_SIZES).split(",")
    if config.getoption("--run-slow") and "large" not in sizes:
        sizes.append("large")
    return [s.strip() for s in sizes if s.strip()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "size" in metafunc.fixturenames:
        params = [pytest.param(s, marks=pytest.mark.slow) if s == "large" else s for s in _sizes(metafunc.config)]
        metafunc.parametrize("size", params)
    if "seed" in metafunc.fixturenames:
        seeds = [int(s) for s in metafunc.config.getoption("--seeds").split(",") if s.strip()]
        metafunc.parametrize("seed", seeds)


CASE_PARAMS = ("definition", "name", "source", "size", "seed", "case")


@pytest.fixture(autouse=True)
def record_case(request: pytest.FixtureRequest, record_property):
    """Every test says which case it is (definition, source, size, seed, edge case), so results
    and the matrix never have to parse test ids; and shares generated inputs with its neighbours
    (the input cache is on only while a reference test runs)."""
    from .inputs import set_cache

    params = getattr(getattr(request.node, "callspec", None), "params", {})
    for key in CASE_PARAMS:
        if key in params:
            record_property("definition" if key == "name" else key, params[key])
    record_property("check", request.node.originalname)
    from .sandbox import pool
    from .testing import COMPARED, PHASES

    PHASES.clear()
    COMPARED.clear()
    starts = pool.worker_starts()
    set_cache(INPUT_CACHE)
    yield
    set_cache(0)
    release_cuda_cache()
    record_property("phases", {**{k: round(v, 4) for k, v in PHASES.items()},
                               "worker_starts": pool.worker_starts() - starts})
    if COMPARED:  # a passing comparison's margin too: how much of the tolerance the kernel used
        record_property("compared", list(COMPARED))


def release_cuda_cache() -> None:
    """Give this process's cached CUDA blocks back after each test: a session runs 8 test processes and 8
    reference workers on one GPU, and blocks one of them caches after a large case are memory the others
    cannot get (an OutOfMemoryError on the H100 with 1.85 of 79 GiB free, 16 GiB held by one process)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _known_issues_file(config: pytest.Config):
    import os
    from pathlib import Path

    given = config.getoption("--known-issues") or os.environ.get("FLASHINFER_TRACE_KNOWN_ISSUES")
    return Path(given) if given else Path(config.rootpath) / "constraints" / "known-issues.toml"


SIZE_ORDER = {"small": 0, "medium": 1, "large": 2}


def _case_key(item: pytest.Item) -> tuple:
    """(module, definition, size, seed, case): a definition's tests run together, case by case, so
    the input cache serves them all from one generation."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    name = _definition_of(item)
    if name is None:
        return (str(getattr(item, "path", "")), "", 3, 0, "")  # not a reference test: order kept
    seed = params.get("seed", 0)
    return (str(getattr(item, "path", "")), name, SIZE_ORDER.get(params.get("size", "small"), 3),
            seed if isinstance(seed, int) else 0, str(params.get("case") or ""))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests ordered case by case (stable otherwise); known issues become strict xfail markers
    (run=false ones are not run at all); an expired entry stops the run: it has to be re-checked."""
    from .matrix.known_issues import installed_versions, load_known_issues

    items.sort(key=_case_key)
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
    for item in items:
        name = _definition_of(item)
        if name is None:
            continue  # not a reference test
        source = getattr(getattr(item, "callspec", None), "params", {}).get("source")
        for issue in issues:
            ready = issue.unless_jit_ready and _jit_ready(name, source)
            if issue.applies(name, source, versions, arch, jit_ready=ready):
                item.add_marker(pytest.mark.xfail(strict=True, run=issue.run, reason=issue.describe()))
                item.user_properties.append(("known_issue", issue.id))
                break


def _jit_ready(definition: str, source: str | None) -> bool:
    """The session's prebuild (its JIT report) has this test's modules: built or found cached."""
    from .sweep.jit import prebuild_outcome

    found = prebuild_outcome(definition, source) if source else None
    return found is not None and found.status in ("built", "cached")


def _definition_of(item: pytest.Item) -> str | None:
    """The definition a reference test checks; None for any other test."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    name = params.get("definition") or params.get("name")
    return name if isinstance(name, str) and "record_case" in getattr(item, "fixturenames", ()) else None


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

    return None if config.getoption("--device") == "cpu" else detect_arch()


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> str:
    import torch

    want = pytestconfig.getoption("--device")
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(reason="no-gpu: --device cuda but torch sees no CUDA device")
    return want


@pytest.fixture
def definition(request: pytest.FixtureRequest):
    """Parametrized indirectly with definition names by the generated modules."""
    return load_definition(request.param)


@pytest.fixture
def tolerance(definition, pytestconfig: pytest.Config, record_property):
    cli = {k: pytestconfig.getoption(o) for k, o in
           (("atol", "--atol"), ("rtol", "--rtol"), ("matched_ratio", "--matched-ratio"),
            ("min_cosine", "--min-cosine"))}
    tol = tolerance_for(definition, cli=cli)
    record_property("tolerance", tol.as_dict())
    return tol


@pytest.fixture
def sampling_settings(device: str, pytestconfig: pytest.Config, record_property) -> SamplingSettings:
    draws = pytestconfig.getoption("--draws") or (64 if device == "cpu" else 2000)
    settings = SamplingSettings(draws=draws)
    record_property("sampling", settings.as_dict())
    return settings


@pytest.fixture
def ground_truth(device: str, record_property):
    """ground_truth(source, definition) -> a GroundTruth, or the test is skipped with the reason."""

    def get(source: str, definition):
        try:
            gt = get_ground_truth(source, definition, device=device)
        except GroundTruthUnavailable as e:
            record_property("skip_kind", e.kind)
            pytest.skip(reason=str(e))
        record_property("ground_truth", gt.describe())
        return _SkipWhenUnavailable(gt)

    return get


class _SkipWhenUnavailable:
    """Calls through to a GroundTruth; an adapter that finds out only while running that it cannot
    run this definition skips the test with its reason instead of erroring."""

    def __init__(self, gt):
        self._gt = gt

    def __getattr__(self, name):
        return getattr(self._gt, name)

    def __call__(self, *args, **kwargs):
        from .testing import timed

        try:
            with timed("ground_truth"):
                return self._gt(*args, **kwargs)
        except GroundTruthUnavailable as e:
            pytest.skip(reason=str(e))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or call.excinfo is None:
        return
    error = call.excinfo.value
    if not isinstance(error, (Mismatch, SamplingMismatch)):
        return
    report.user_properties.append(("verdict", getattr(error, "verdict", None) or error.report.verdict))
    params = dict(getattr(item, "callspec", None).params) if hasattr(item, "callspec") else {}
    name = params.get("name") or params.get("definition")
    if not name:
        return
    from .failures import save_failure

    definition = load_definition(name)
    detail = ([r.as_dict() for r in error.reports] if isinstance(error, Mismatch) else [error.report.as_dict()])
    record = {"test": item.nodeid, "definition": name, "check": item.originalname,
              "definition_path": str(definition.source) if definition.source else None,
              "size": params.get("size", "small"), "seed": params.get("seed", 0), "case": params.get("case"),
              "source": params.get("source"), "device": item.funcargs.get("device", "cpu"),
              "reports": detail, "message": str(error)}
    config = item.config
    path = save_failure(record, config.getoption("--save-failures"), inputs=config.getoption("--save-inputs"))
    report.user_properties.append(("failure_file", str(path)))
