"""The one status vocabulary, from the engine's verdict to the matrix cell.

A case ends in a `Status`; when it did not pass, a `Kind` says why in machine-readable form and the
record's `detail` says it in words. The matrix's cell states are a pure function of the two
(`cell_state`), so no layer above the engine ever parses a message. The JIT prebuild's records use
`BuildStatus`; its failures reach cases as the `Kind`s of the same names.

A leaf module: everything may import it, it imports nothing of the package.
"""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    """How a case ended."""

    PASS = "pass"
    FAIL = "fail"  # the outputs differ from the ground truth beyond tolerance, or a structural check failed
    ERROR = "error"  # a runtime or compile error, a crash of the test process
    TIMEOUT = "timeout"  # the case ran past its time limit and was killed
    SKIP = "skip"  # could not run here: `Kind` says why
    XFAIL = "xfail"  # a known issue (constraints/known-issues.toml), failing as recorded
    XPASS = "xpass"  # a known issue now passing: the entry should go
    NOT_RUN = "not-run"  # left out on purpose (a run=false known issue), never reached, or stopped by the harness
    # the outputs differ, in a regime the API does not promise (Kind.OUTSIDE_CONTRACT; docs/boundary/): shown and
    # counted apart, never red and never a pass
    INFO = "info"

    def __str__(self) -> str:
        return self.value


class Kind(str, enum.Enum):
    """Why a case did not pass: the skip's or the failure's machine-readable reason."""

    # the ground truth cannot run here (the order `availability` checks them)
    UNSUPPORTED = "unsupported"
    NOT_INSTALLED = "not-installed"
    IMPORT_FAILED = "import-failed"
    API_MISSING = "api-missing"
    DTYPE_UNSUPPORTED = "dtype-unsupported"
    NO_GPU = "no-gpu"
    ARCH_UNSUPPORTED = "arch-unsupported"
    BUILD_FAILED = "build-failed"
    BUILD_TIMEOUT = "build-timeout"
    # the case cannot be made here
    NO_GENERATOR = "no-generator"
    TOO_LARGE = "too-large"
    INPUT_LIMIT = "input-limit"  # the run's --max-fixed-mib leaves the definition out (a tier, not the device)
    FI_TRACE_INPUTS = "fi-trace-inputs"
    INPUTS = "inputs"  # the generator raised
    LOAD = "load"  # the definition file did not load
    KNOWN_ISSUE = "known-issue"
    BUILDING = "building"  # not-run: the kernel's JIT module is built by a `jit-` session of its own, not here
    # not-run, the harness's failure and never a kernel's: the device ran out of memory with the case alone on it,
    # or the case could not get its memory from the device's budget in time
    OUT_OF_MEMORY = "out-of-memory"
    # not-run, the harness's too: a reference worker could not start because the device refused a new process
    # ("CUDA-capable device(s) is/are busy or unavailable"), once more after a retry
    WORKER_START = "worker-start"
    # the case ran and was wrong
    MISMATCH = "mismatch"  # element-wise, beyond tolerance
    FLAKY_WRONG = "flaky-wrong"  # wrong in some of the repeated runs on the same inputs, right in others
    SAMPLES = "samples"  # a sampler's statistics differ
    SHAPE = "shape"
    DTYPE = "dtype"
    OUTSIDE_CONTRACT = "outside-contract"  # info: a difference where the API promises nothing (docs/boundary/)
    MUTATES_INPUTS = "mutates-inputs"  # the reference wrote into inputs it does not declare as outputs
    NONDETERMINISTIC = "nondeterministic"
    REFERENCE = "reference"  # the confined reference raised, timed out or crashed
    EXCEPTION = "exception"  # anything else raised
    CRASH = "crash"  # the test process died
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


# the kinds a GroundTruthUnavailable may carry (its constructor checks). `building` is the one that is no skip:
# the prebuild left the module to the combination's `jit-` session (BuildStatus.DEFERRED), and the case records
# not-run (check.outcome_of)
GROUND_TRUTH_KINDS = (Kind.UNSUPPORTED, Kind.NOT_INSTALLED, Kind.IMPORT_FAILED, Kind.API_MISSING,
                      Kind.DTYPE_UNSUPPORTED, Kind.NO_GPU, Kind.ARCH_UNSUPPORTED, Kind.BUILD_FAILED,
                      Kind.BUILD_TIMEOUT, Kind.BUILDING)


# not-run records of these kinds are the harness's failures, not the kernel's: a session with any is not clean
# (its summary counts them apart), and the matrix shows their cells as not-run, never as a verdict
HARNESS_KINDS = (Kind.OUT_OF_MEMORY, Kind.WORKER_START)


# Reason kinds, in the order `availability` checks them. The matrix maps them to cell states:
# not-installed -> skip:not-installed, api-missing -> skip:api-missing, arch-unsupported ->
# skip:arch, build-failed / build-timeout (the JIT prebuild's outcome, sweep/jit/) -> their own states,
# the rest -> skip:other.
REASON_KINDS = tuple(k.value for k in GROUND_TRUTH_KINDS)


class GroundTruthUnavailable(Exception):
    """This ground truth cannot run here; `str()` is the skip reason, `kind: detail`."""

    def __init__(self, kind: str | Kind, detail: str):
        kind = kind.value if isinstance(kind, Kind) else kind
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


class BuildStatus(str, enum.Enum):
    """How one JIT prebuild job ended."""

    BUILT = "built"
    CACHED = "cached"
    PREBUILT = "prebuilt"  # not built: FlashInfer's own prebuilt package (flashinfer-jit-cache) supplies the modules
    BUILD_FAILED = "build-failed"
    BUILD_TIMEOUT = "build-timeout"
    # not built by this session: expected to take longer than its budget, and not in the JIT cache; the
    # combination's `jit-` session builds it (the record's message names the command), its cases are not-run
    DEFERRED = "deferred"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


class CellState(str, enum.Enum):
    """A matrix cell's state (the legend's order)."""

    PASS = "pass"
    FAIL = "fail"
    FLAKY_WRONG = "flaky-wrong"
    MUTATES_INPUTS = "mutates-inputs"
    ERROR = "error"
    TIMEOUT = "timeout"
    SKIP_ARCH = "skip:arch"
    SKIP_API_MISSING = "skip:api-missing"
    SKIP_NOT_INSTALLED = "skip:not-installed"
    SKIP_OTHER = "skip:other"
    BUILD_FAILED = "build-failed"
    BUILD_TIMEOUT = "build-timeout"
    INSTALL_FAILED = "install-failed"
    XFAIL = "xfail"
    XPASS = "xpass"
    INFO = "info"
    NOT_RUN = "not-run"

    def __str__(self) -> str:
        return self.value


_SKIP_STATES = {Kind.ARCH_UNSUPPORTED: CellState.SKIP_ARCH, Kind.API_MISSING: CellState.SKIP_API_MISSING,
                Kind.NOT_INSTALLED: CellState.SKIP_NOT_INSTALLED, Kind.BUILD_FAILED: CellState.BUILD_FAILED,
                Kind.BUILD_TIMEOUT: CellState.BUILD_TIMEOUT}
_FAIL_STATES = {Kind.MUTATES_INPUTS: CellState.MUTATES_INPUTS, Kind.FLAKY_WRONG: CellState.FLAKY_WRONG}
_DIRECT = {Status.PASS: CellState.PASS, Status.FAIL: CellState.FAIL, Status.ERROR: CellState.ERROR,
           Status.TIMEOUT: CellState.TIMEOUT, Status.XFAIL: CellState.XFAIL, Status.XPASS: CellState.XPASS,
           Status.NOT_RUN: CellState.NOT_RUN, Status.INFO: CellState.INFO}


def cell_state(status: Status, kind: Kind | None) -> CellState:
    """The matrix state of one case: its status, a skip or a failure refined by its kind."""
    if status is Status.SKIP:
        return _SKIP_STATES.get(kind, CellState.SKIP_OTHER) if kind is not None else CellState.SKIP_OTHER
    if status is Status.FAIL and kind in _FAIL_STATES:
        return _FAIL_STATES[kind]
    return _DIRECT[status]


# how a state reads in the matrix (build.py writes these into matrix.json; the pages show them)
MEANING = {
    CellState.PASS: "the reference agrees with the kernel's ground truth",
    CellState.FAIL: "outputs differ beyond tolerance (numerical)",
    CellState.FLAKY_WRONG: "wrong in k of N runs on the same inputs (a race): never a pass",
    CellState.MUTATES_INPUTS: "the reference writes into inputs it does not declare as outputs",
    CellState.ERROR: "a runtime or compile error (or a crash)",
    CellState.TIMEOUT: "a test ran past its time limit and was killed",
    CellState.SKIP_ARCH: "the kernel does not run on this GPU arch",
    CellState.SKIP_API_MISSING: "this version has no such API",
    CellState.SKIP_NOT_INSTALLED: "the ground-truth package is not installed",
    CellState.SKIP_OTHER: "skipped for another reason (see the cell)",
    CellState.BUILD_FAILED: "the kernel's JIT module failed to compile (the prebuild's log tail is in the cell)",
    CellState.BUILD_TIMEOUT: "the kernel's JIT module was not built within its prebuild budget",
    CellState.INSTALL_FAILED: "the combination could not be installed",
    CellState.XFAIL: "a known issue (constraints/known-issues.toml), failing as recorded",
    CellState.XPASS: "a known issue now passing: the entry should go",
    CellState.INFO: "differs where the API promises nothing (docs/boundary/): informational, never red",
    CellState.NOT_RUN: "no result for this cell (left out, or `not-run: building`: its JIT module is the "
                       "combination's `jit-` session's to build)",
}
SYMBOL = {CellState.PASS: "✅", CellState.FAIL: "❌", CellState.FLAKY_WRONG: "🎲", CellState.MUTATES_INPUTS: "✍",
          CellState.ERROR: "💥", CellState.TIMEOUT: "⏱", CellState.SKIP_ARCH: "🚫", CellState.SKIP_API_MISSING: "➖",
          CellState.SKIP_NOT_INSTALLED: "⬜", CellState.SKIP_OTHER: "⏭", CellState.BUILD_FAILED: "🔨",
          CellState.BUILD_TIMEOUT: "⌛", CellState.INSTALL_FAILED: "📦", CellState.XFAIL: "🟡", CellState.XPASS: "⭐",
          CellState.INFO: "ℹ", CellState.NOT_RUN: "·"}
# the states a cell shows before any other, worst first (a cell is its worst case)
WORST_FIRST = (CellState.ERROR, CellState.TIMEOUT, CellState.MUTATES_INPUTS, CellState.FAIL, CellState.FLAKY_WRONG,
               CellState.XPASS)
# how an environment's column sorts, most severe first
SEVERITY = (CellState.ERROR, CellState.FAIL, CellState.FLAKY_WRONG, CellState.MUTATES_INPUTS, CellState.TIMEOUT,
            CellState.BUILD_FAILED, CellState.BUILD_TIMEOUT, CellState.INSTALL_FAILED, CellState.XFAIL, CellState.XPASS,
            CellState.INFO, CellState.SKIP_API_MISSING, CellState.SKIP_ARCH, CellState.SKIP_OTHER,
            CellState.SKIP_NOT_INSTALLED, CellState.PASS, CellState.NOT_RUN)
