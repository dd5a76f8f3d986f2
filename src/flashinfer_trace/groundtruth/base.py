"""What a ground-truth adapter declares, and how its availability is decided.

An adapter is data plus one function: the op type (and which definitions of it) it computes,
the package and `packaging` version specifier it needs, the attributes that must exist there,
the input dtypes it takes, and the compute-capability range it runs on. Whether it can run
here is decided by `availability`, a fixed pipeline of checks; the first that fails gives a
machine-readable reason (`kind: detail`) that tests turn into `pytest.skip` and the matrix
groups. Nothing here imports flashinfer or sglang at module import.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ..status import REASON_KINDS, GroundTruthUnavailable  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs

SOURCES = ("flashinfer", "sglang", "torch")
# the user's own kernel (`--kernel MODULE:FUNCTION`, kernel.py): a source only where one is named
KERNEL = "kernel"
ALL_SOURCES = (*SOURCES, KERNEL)

# (definition, source) -> the prebuild's record of that job (`.api`, `.status`, `.message`), or None
PrebuildLookup = Callable[..., Any]  # (definition, source, api=None) -> the prebuild's record (sweep/jit/report.py)


@dataclass(frozen=True)
class Package:
    """An importable package and the distributions that may provide it (renames happen:
    sgl-kernel became sglang-kernel, both installing `sgl_kernel`)."""

    module: str
    distributions: tuple[str, ...]
    label: str  # how reasons name it: "flashinfer"


@dataclass(frozen=True)
class Call:
    """What an adapter's function receives."""

    definition: Definition
    inputs: Inputs
    module: ModuleType | None  # the imported package (None for torch-only adapters)
    version: Version | None
    draws: int = 1  # samplers: samples per row to return, as [batch, draws]
    mode: str | None = None  # the call mode the path asks for (an adapter's `modes`); None: its plain call


class SamplerCallBroken(AssertionError):
    """A sampler kernel broke a property of its call that no distribution of draws shows (two calls from the same
    generator state must agree; from an advanced state, or without a generator, differ): raised by a ground truth's
    call, judged a `bug` of that side (verdict/samples.py)."""


@dataclass(frozen=True)
class Adapter:
    source: str  # "flashinfer" | "sglang" | "torch"
    op_type: str
    api: str  # what is called, for reports: "flashinfer.norm.rmsnorm"
    fn: Callable[[Call], tuple]
    package: Package | None = None  # None: torch only, always importable
    versions: SpecifierSet = field(default_factory=SpecifierSet)
    requires: tuple[str, ...] = ()  # dotted attributes of the package that must exist
    # Which definitions of the op type this adapter computes: None if it does, else why not.
    applies: Callable[[Definition], str | None] = lambda d: None
    # Readers of parameters the format leaves in the reference (semantics.eps, ...): called before
    # running, so a definition they cannot read is a skip with their reason, not an error.
    params: tuple[Callable[[Definition], Any], ...] = ()
    dtypes: frozenset[str] | None = None  # accepted dtypes of the definition's float inputs
    needs_cuda: bool = False
    min_cc: tuple[int, int] | None = None
    max_cc: tuple[int, int] | None = None
    # "exact": outputs compare element-wise; "sampler": outputs are random draws (see compare.py)
    kind: str = "exact"
    # A last check against the imported package, after `requires` (fi_api.py resolves the tag's dotted
    # path there and checks the call against its signature): raises GroundTruthUnavailable.
    resolve: Callable[[ModuleType, Version | None, Definition], None] | None = None
    # Which ground-truth path of its source this adapter serves: adapters with the same `path` are
    # alternatives (versions, arches: the first that can run is taken), different paths are each checked
    # (decode on CUDA cores and on tensor cores). "" is the source's plain path.
    path: str = ""
    # Further ways to call the same kernel, each its own path "<path>+<mode>" (or "<mode>" on the plain
    # path): modes.py's generic ones (plan once and run again on new data, CUDA-graph replay) need `plan`;
    # any other (a backend) is read by `fn` from `Call.mode`.
    modes: tuple[str, ...] = ()
    # The launch split from its setup: plan(call) -> a closure launching the kernel on call's tensors
    # (what a benchmark times and a CUDA graph captures); finish(call, raw) -> the definition's outputs.
    plan: Callable[[Call], Callable[[], Any]] | None = None
    finish: Callable[[Call, tuple], tuple] | None = None
    # Atomics, split-K or multi-CTA reductions: a race shows only in some runs, so it is run more often
    races: bool = False

    def __post_init__(self):
        if self.source not in ALL_SOURCES:
            raise ValueError(f"unknown source {self.source!r}")
        if self.kind not in ("exact", "sampler"):
            raise ValueError(f"unknown adapter kind {self.kind!r}")

    @property
    def arch_range(self) -> str:
        lo = f"sm{self.min_cc[0]}{self.min_cc[1]}" if self.min_cc else None
        hi = f"sm{self.max_cc[0]}{self.max_cc[1]}" if self.max_cc else None
        if lo and hi:
            return lo if lo == hi else f"{lo}..{hi}"
        return f">= {lo}" if lo else f"<= {hi}" if hi else "any"


# -- environment probes (cached: they do not change inside a process) ---------------------------
@cache
def installed_version(package: Package) -> Version | None:
    """The installed distribution's version, or None when no candidate distribution is installed."""
    for dist in package.distributions:
        try:
            return Version(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
        except InvalidVersion:
            return None
    # e.g. an in-tree build with no metadata; only the top-level name: a dotted find_spec imports parents
    if importlib.util.find_spec(package.module.partition(".")[0]) is not None:
        return Version("0")
    return None


_imported: dict[str, ModuleType | GroundTruthUnavailable] = {}


def import_package(package: Package) -> ModuleType:
    """Import once per process; any exception (not only ImportError: some flashinfer versions
    raise AssertionError at import without a GPU) becomes an import-failed reason."""
    hit = _imported.get(package.module)
    if hit is None:
        try:
            hit = importlib.import_module(package.module)
        except BaseException as e:  # noqa: BLE001 - SystemExit from a broken extension counts too
            if isinstance(e, KeyboardInterrupt):
                raise
            text = " ".join(str(e).split())
            hit = GroundTruthUnavailable("import-failed", f"{type(e).__name__}: {text[:300]}")
        _imported[package.module] = hit
    if isinstance(hit, GroundTruthUnavailable):
        raise hit
    return hit


def module_version(module: ModuleType, package: Package) -> Version | None:
    raw = getattr(module, "__version__", None)
    try:
        return Version(str(raw)) if raw else installed_version(package)
    except InvalidVersion:
        return installed_version(package)


def has_attr_path(module: ModuleType, dotted: str) -> bool:
    obj: Any = module
    for part in dotted.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:  # noqa: BLE001 - lazy submodules may raise anything on access
            return False
    return True


def cuda_capability(device: str | None) -> tuple[int, int] | None:
    """(major, minor) of the device, None when it is not a usable CUDA device."""
    import torch

    if device is None or not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(torch.device(device))


_ARCH_TAG = re.compile(r"sm(\d+)(\d)[af]?$")


def tagged_archs(definition: Definition) -> set[tuple[int, int]]:
    """The compute capabilities a definition's `arch:` tags name (FlashInfer's traced files: "arch:sm90a",
    "arch:sm100", "arch:sm100_sm103"); empty where it has none, which says nothing about where it runs."""
    out = set()
    for value in definition.tag_values("arch"):
        for token in value.split("_"):
            m = _ARCH_TAG.match(token.strip().lower())
            if m:
                out.add((int(m.group(1)), int(m.group(2))))
    return out


def float_input_dtypes(definition: Definition) -> set[str]:
    # dtype None: an absent optional input of an fi_trace file ("unknown"): nothing to take
    return {s.dtype.value for s in definition.inputs.values()
            if s.shape is not None and s.dtype is not None and s.dtype.is_float}


# -- the availability pipeline --------------------------------------------------------------------
def availability(adapter: Adapter, definition: Definition, device: str | None, *,
                 prebuild: PrebuildLookup | None = None) -> tuple[ModuleType | None, Version | None]:
    """The imported module and version if the adapter can run this definition on this device;
    otherwise raises GroundTruthUnavailable with the first reason, in REASON_KINDS order.
    `prebuild`: the JIT prebuild's report, read by the caller from where the sweep wrote it."""
    why = adapter.applies(definition)
    if why:
        raise GroundTruthUnavailable("unsupported", f"{adapter.api}: {why}")
    for read in adapter.params:
        read(definition)
    module = version = None
    pkg = adapter.package
    if pkg is not None:
        if installed_version(pkg) is None:
            raise GroundTruthUnavailable("not-installed", pkg.label)
        module = import_package(pkg)
        version = module_version(module, pkg)
        if version is not None and adapter.versions and version not in adapter.versions:
            raise GroundTruthUnavailable(
                "api-missing", f"{pkg.label} {version} has no {adapter.api} (needs {adapter.versions})")
        for attr in adapter.requires:
            if not has_attr_path(module, attr):
                raise GroundTruthUnavailable("api-missing", f"{pkg.label} {version} has no {attr}")
        if adapter.resolve is not None:
            adapter.resolve(module, version, definition)
    if adapter.dtypes is not None:
        bad = sorted(float_input_dtypes(definition) - adapter.dtypes)
        if bad:
            raise GroundTruthUnavailable(
                "dtype-unsupported", f"{adapter.api} takes {', '.join(sorted(adapter.dtypes))}, "
                                     f"not {', '.join(bad)}")
    if adapter.needs_cuda or adapter.min_cc or adapter.max_cc:
        cc = cuda_capability(device)
        if cc is None:
            raise GroundTruthUnavailable("no-gpu", f"{adapter.api} needs a CUDA device, running on "
                                                   f"{device or 'cpu'}")
        if (adapter.min_cc and cc < adapter.min_cc) or (adapter.max_cc and cc > adapter.max_cc):
            raise GroundTruthUnavailable(
                "arch-unsupported", f"{adapter.api} needs {adapter.arch_range}, have sm{cc[0]}{cc[1]}")
        tagged = tagged_archs(definition) if adapter.source == "flashinfer" else set()
        if tagged and cc not in tagged:
            archs = ", ".join(f"sm{a}{b}" for a, b in sorted(tagged))
            raise GroundTruthUnavailable("arch-unsupported", f"{definition.name} is tagged for {archs} (its `arch:` "
                                                             f"tags), have sm{cc[0]}{cc[1]}")
    if prebuild is not None and pkg is not None:
        _check_prebuild(adapter, definition, prebuild)
    return module, version


def _check_prebuild(adapter: Adapter, definition: Definition, prebuild: PrebuildLookup) -> None:
    """A module the prebuild could not build is not built again inside a test's time; one it left to the
    combination's `jit-` session (`deferred`) is `building`: its cases are not run here (check.outcome_of), on every
    path of that source (the paths' APIs share the job's modules or may, and a module built inside a test holds the
    test past its time), and so are those of a definition the prebuild did not plan whose API, or an API of the same
    known module, it deferred for another."""
    record = prebuild(definition.name, adapter.source, api=adapter.api)
    if record is None:
        return
    if record.status == "deferred":
        raise GroundTruthUnavailable("building", f"{adapter.api}: {record.message or 'left to a jit- session'}")
    if record.api != adapter.api:
        return
    if record.status in ("build-failed", "build-timeout"):
        raise GroundTruthUnavailable(record.status, f"{adapter.api}: {record.message or record.status}")


# What FlashInfer 0.7.2.post1's kernels raise on a GPU they are not built for (seen on the H100, sm90):
# "does not support compute capability 90; supported compute capabilities: [100, 103, 107]", "requires SM120
# or SM121 (Blackwell)", "is only supported on SM12x GPUs", "requires a Blackwell GPU (SM100+ ...)",
# "does not support backend 'cutlass' with capability 90", "TGV GEMM requires SM100, SM103, SM107".
_ARCH_GATE = re.compile(
    r"(?:does not support (?:compute )?capability \d+|does not support backend \S+ with capability \d+"
    r"|requires? (?:an? )?(?:SM\s?\d{2,3}|Blackwell|Hopper)|only supported on SM\s?\d|requires SM\d{2,3}"
    r"|is only supported on (?:SM|sm)\d)", re.IGNORECASE)


def arch_gate(e: BaseException) -> str | None:
    """The kernel's own message when an exception says this GPU's architecture is not one it runs on."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text[:300] if _ARCH_GATE.search(text) else None


# -- what a kernel's signature takes (versions add and drop keywords) ------------------------------
@cache
def _params(fn: Any) -> frozenset[str] | None:
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def accepts(fn: Any, name: str) -> bool:
    """Whether a callable takes a keyword of that name (plain parameters only; **kwargs does not count,
    because some versions swallow unknown keywords there and warn instead of acting on them). A bound method is
    looked up by its function: cached by the method, every wrapper whose `run` was asked about stayed alive with
    its workspaces (8 MiB of device memory each; 160 MiB a case, 30-47 GiB per test process on an H200)."""
    params = _params(getattr(fn, "__func__", fn))
    return params is not None and name in params


def keywords(fn: Any, **maybe: Any) -> dict[str, Any]:
    """The subset of optional keywords this version's `fn` takes."""
    return {k: v for k, v in maybe.items() if accepts(fn, k)}
