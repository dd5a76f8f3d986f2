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
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs

SOURCES = ("flashinfer", "sglang", "torch")

# Reason kinds, in the order `availability` checks them. The matrix maps them to cell states:
# not-installed -> skip:not-installed, api-missing -> skip:api-missing, arch-unsupported ->
# skip:arch, build-failed / build-timeout (the JIT prebuild's outcome, sweep/jit.py) -> their own states,
# the rest -> skip:other.
REASON_KINDS = ("unsupported", "not-installed", "import-failed", "api-missing", "dtype-unsupported",
                "no-gpu", "arch-unsupported", "build-failed", "build-timeout")


class GroundTruthUnavailable(Exception):
    """This ground truth cannot run here; `str()` is the skip reason, `kind: detail`."""

    def __init__(self, kind: str, detail: str):
        if kind not in REASON_KINDS:
            raise ValueError(f"unknown reason kind {kind!r}")
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail

    @property
    def progress(self) -> int:
        """How far the availability pipeline got; among several adapters the furthest is the most
        telling reason (arch-unsupported says more than api-missing)."""
        return REASON_KINDS.index(self.kind)

    def __reduce__(self):
        return (type(self), (self.kind, self.detail))


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

    def __post_init__(self):
        if self.source not in SOURCES:
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


def float_input_dtypes(definition: Definition) -> set[str]:
    # dtype None: an absent optional input of an fi_trace file ("unknown"): nothing to take
    return {s.dtype.value for s in definition.inputs.values()
            if s.shape is not None and s.dtype is not None and s.dtype.is_float}


# -- the availability pipeline --------------------------------------------------------------------
def availability(adapter: Adapter, definition: Definition, device: str | None, *, prebuilt: bool = True
                 ) -> tuple[ModuleType | None, Version | None]:
    """The imported module and version if the adapter can run this definition on this device;
    otherwise raises GroundTruthUnavailable with the first reason, in REASON_KINDS order.
    `prebuilt`: also consult the JIT prebuild's report, when this process has one."""
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
    if prebuilt and pkg is not None:
        _check_prebuild(adapter, definition)
    return module, version


def _check_prebuild(adapter: Adapter, definition: Definition) -> None:
    """A module the prebuild could not build is not built again inside a test's time."""
    from ..sweep.jit import prebuild_outcome

    record = prebuild_outcome(definition.name, adapter.source)
    if record is not None and record.api == adapter.api and record.status in ("build-failed", "build-timeout"):
        detail = record.message or record.status
        raise GroundTruthUnavailable(record.status, f"{adapter.api}: {detail}")


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
