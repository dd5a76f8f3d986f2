"""Installing one combination into a fresh environment, in one of three modes:

* fresh (default): torch for the combination's CUDA variant from a wheel index
  (FLASHINFER_TRACE_TORCH_INDEX, default https://download.pytorch.org/whl/<variant>; for the CPU
  variant pip's own index, which on CI serves the CPU wheel), then the other pins with the
  combination as constraints, then the project with its dev extras.
* offline (`--wheelhouse DIR [--extra-wheels DIR2]`): everything from DIR with no index; the pins go in
  with `--no-deps` (and every wheel of DIR2 after them, `--no-deps`: a pinned package's import closure)
  (a wheelhouse carries what the kernels need, not FlashInfer's whole optional closure) into one
  folder per combination ($FLASHINFER_TRACE_SITE/<combination>, layered in by a .pth file; a second
  one runs the .pth files the wheels put there, which Python reads only in a site directory:
  nvidia-cutlass-dsl's puts `cutlass` on sys.path that way), so every session of a combination sees
  the same paths: FlashInfer's JIT build files embed the include paths and compare source mtimes, and a
  reinstall would recompile every kernel. Two sessions of one combination (a `jit-` session beside its
  references session) install into it one at a time, and one that would rewrite it under the other is refused
  (`combination_lock`, `combination_in_use`). The
  project goes in through a .pth file onto its `src/` (an editable build would need setuptools
  from an index); its own dependencies are resolved from DIR. A wheelhouse with a manifest
  (`flashinfer-trace wheelhouse build`, wheelhouse.py) is checked first: a wheel whose sha256 differs
  from the build's, or one missing or added, fails the install before anything goes in.
* preinstalled torch (`--preinstalled-torch [PYTHON]`): the interpreter's existing torch is layered in
  with a .pth file pointing at its site-packages. `--system-site-packages` is not enough where
  torch lives in another virtual environment rather than the base interpreter.
  Its version and CUDA variant are checked against the combination; differences are recorded.

The noxfile calls `install()` from its own interpreter with the session's python: this module
needs only the standard library, `packaging` and combos.py, and knows nothing of nox.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from packaging.version import InvalidVersion, Version

from .combos import PROJECT_REQUIREMENTS, Combination

TORCH_INDEX_ENV = "FLASHINFER_TRACE_TORCH_INDEX"
WHEELHOUSE_ENV = "FLASHINFER_TRACE_WHEELHOUSE"
PREINSTALLED_ENV = "FLASHINFER_TRACE_PREINSTALLED_TORCH"
SITE_ENV = "FLASHINFER_TRACE_SITE"
STAMP = ".flashinfer-trace-combination"
LAYERS = ("zz_flashinfer_trace_base.pth", "flashinfer_trace_src.pth", "flashinfer_trace_combo.pth",
          "flashinfer_trace_combo_site.pth")
PTH_EXEC = ("import ", "import\t")  # a .pth line Python runs instead of adding it to sys.path (site.py)
INSTALLED = "flashinfer_trace_install.json"  # in the environment's site-packages: what the last install was
DEFAULT_TORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
SESSION_FLAGS = ("--wheelhouse", "--extra-wheels", "--preinstalled-torch", "--torch-index", "--jobs", "--test-timeout",
                 "--resume", "--jit-budget", "--mps", "--no-mps", "--jit-modules", "--no-ccache", "--ccache-dir",
                 "--cores", "--no-fi-trace", "--fi-trace-op-type")


@dataclass
class InstallOptions:
    wheelhouse: Path | None = None
    # offline only: every wheel in this folder goes in too, --no-deps, beside the pins. What a pinned package
    # imports but the combination does not pin (sglang's import closure: xgrammar, torchvision, ...): with
    # --no-deps pins it would be missing, and resolving sglang's whole dependency tree offline is not possible.
    extra_wheels: Path | None = None
    preinstalled_torch: str | None = None  # the python whose torch to reuse
    torch_index: str | None = None
    jobs: int | None = None
    test_timeout: float | None = None
    jit_budget: float | None = None  # seconds per JIT prebuild job
    jit_modules: Path | None = None  # another machine's JIT cache root: loaded, not rebuilt (prebuilt.py)
    resume: bool = False  # keep the tests a killed or interrupted run streamed, run the rest
    # GPU sessions: a CUDA MPS daemon of their own where one can start (`--mps`; sweep/mps.py). Off by default: under
    # MPS one kernel's fatal fault reaches every process on the GPU (docs/matrix-sessions.md, "CUDA MPS")
    mps: bool = False
    ccache: bool = True  # GPU sessions: ccache in front of FlashInfer's JIT compilers (compiler_cache.py)
    ccache_dir: Path | None = None  # the compiler cache (default ~/.cache/flashinfer-trace/ccache)
    cores: int | None = None  # the cores this session may use (MAX_JOBS, the prebuild's pool): sweep/host.py's share
    fi_trace: bool = True  # references sessions: import and check FlashInfer's own definitions (fitrace_step.py)
    fi_trace_op_types: list[str] = field(default_factory=list)  # only these op types of them (default all)

    @property
    def mode(self) -> str:
        parts = ["preinstalled-torch" if self.preinstalled_torch else None, "offline" if self.wheelhouse else None]
        return "+".join(p for p in parts if p) or "fresh"


@dataclass
class InstallResult:
    ok: bool
    mode: str
    log: str
    steps: list[str] = field(default_factory=list)
    torch: dict | None = None  # the torch found (preinstalled mode)
    differences: list[str] = field(default_factory=list)  # preinstalled torch vs the combination
    error: str | None = None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(Path(self.log).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return self.error or ""

    def as_dict(self) -> dict:
        return asdict(self)


def parse_session_args(posargs: Sequence[str], environ: dict[str, str] | None = None, combination: str | None = None
                       ) -> tuple[InstallOptions, list[str]]:
    """Split `nox -s X -- ...` into this project's session flags and the rest (for pytest). A folder's
    `{combination}` becomes the session's combination id: one set of arguments serves every session of a sweep
    (`sweep run ... -- --wheelhouse wh/{combination}`), each with its own wheelhouse."""
    env = os.environ if environ is None else environ
    opts = InstallOptions(wheelhouse=Path(env[WHEELHOUSE_ENV]) if env.get(WHEELHOUSE_ENV) else None,
                          preinstalled_torch=(env.get(PREINSTALLED_ENV) or None),
                          torch_index=env.get(TORCH_INDEX_ENV) or None)
    if opts.preinstalled_torch in ("1", "true", "yes"):
        opts.preinstalled_torch = "python3"
    rest: list[str] = []
    args = list(posargs)
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        if name not in SESSION_FLAGS:
            rest.append(a)
            i += 1
            continue
        if name in ("--resume", "--mps", "--no-mps", "--no-ccache", "--no-fi-trace"):
            opts.resume = opts.resume or name == "--resume"
            opts.mps = (opts.mps or name == "--mps") and name != "--no-mps" and "--no-mps" not in args
            opts.ccache = opts.ccache and name != "--no-ccache"
            opts.fi_trace = opts.fi_trace and name != "--no-fi-trace"
            i += 1
            continue
        takes_value = name != "--preinstalled-torch" or bool(eq) or (
            i + 1 < len(args) and not args[i + 1].startswith("-") and Path(args[i + 1]).name.startswith("python"))
        if not eq and takes_value:
            if i + 1 >= len(args):
                raise ValueError(f"{name} needs a value")
            value = args[i + 1]
            i += 1
        i += 1
        if name == "--wheelhouse":
            opts.wheelhouse = Path(value)
        elif name == "--extra-wheels":
            opts.extra_wheels = Path(value)
        elif name == "--preinstalled-torch":
            opts.preinstalled_torch = value or "python3"
        elif name == "--torch-index":
            opts.torch_index = value
        elif name == "--jobs":
            opts.jobs = int(value)
        elif name == "--test-timeout":
            opts.test_timeout = float(value)
        elif name == "--jit-budget":
            opts.jit_budget = float(value)
        elif name == "--jit-modules":
            opts.jit_modules = Path(value)
        elif name == "--ccache-dir":
            opts.ccache_dir = Path(value)
        elif name == "--fi-trace-op-type":
            if not value.isidentifier():
                raise ValueError(f"--fi-trace-op-type {value!r}: expected an op type (an identifier, e.g. rmsnorm)")
            opts.fi_trace_op_types.append(value)
        elif name == "--cores":
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"--cores {value!r}: expected a whole number of cores, at least 1")
            opts.cores = int(value)
    for attr in ("wheelhouse", "extra_wheels", "jit_modules"):
        folder = getattr(opts, attr)
        if folder is not None and "{combination}" in str(folder):
            if combination is None:
                flag = "--" + attr.replace("_", "-")
                raise ValueError(f"{flag} {folder}: {{combination}} outside a combination's session")
            setattr(opts, attr, Path(str(folder).replace("{combination}", combination)))
    for flag, folder in (("--wheelhouse", opts.wheelhouse), ("--extra-wheels", opts.extra_wheels),
                         ("--jit-modules", opts.jit_modules)):
        if folder is not None and not folder.is_dir():
            raise ValueError(f"{flag} {folder}: not a folder")
    if opts.extra_wheels is not None and opts.wheelhouse is None:
        raise ValueError("--extra-wheels needs --wheelhouse (offline mode: the pins go in with --no-deps)")
    return opts, rest


class _Runner:
    def __init__(self, log: Path, env: dict[str, str] | None):
        self.log, self.env, self.steps = log, env, []
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")

    def __call__(self, cmd: Sequence[str]) -> str:
        line = " ".join(shlex.quote(str(c)) for c in cmd)
        self.steps.append(line)
        with self.log.open("a") as f:
            f.write(f"$ {line}\n")
            f.flush()
            proc = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=self.env)
            f.write(proc.stdout)
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, line, proc.stdout)
        return proc.stdout


def _installer(python: str, run: _Runner) -> list[str]:
    """pip in the environment when it has one (virtualenv seeds it), else uv's pip interface."""
    try:
        run([python, "-m", "pip", "--version"])
        return [python, "-m", "pip", "install", "--disable-pip-version-check"]
    except subprocess.CalledProcessError:
        uv = shutil.which("uv")
        if not uv:
            raise
        return [uv, "pip", "install", "--python", python]


def site_packages(python: str) -> Path:
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def combination_site(combo: Combination) -> Path:
    root = os.environ.get(SITE_ENV) or Path.home() / ".cache" / "flashinfer-trace" / "site"
    return Path(root) / combo.id


# -- the combination's folder, shared by its sessions --------------------------------------------------------
# A `jit-` session beside its combination's references session installs into the same folder. The install runs
# under an exclusive lock (`.<id>.lock` beside the folder); each process whose session uses the folder holds a
# shared lock on `.<id>.use` for as long as it lives (nox runs the session as its child), so an install that would
# rewrite the folder under a running session is refused instead.
_USING: dict[str, IO[str]] = {}  # folder -> this process's shared lock on it


def _lock_file(target: Path, suffix: str) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.parent / f".{target.name}.{suffix}"


@contextmanager
def combination_lock(target: Path, note: Callable[[str], None] | None = None) -> Iterator[None]:
    """The install into a combination's folder, one at a time (`note`: told when it waits for another)."""
    with open(_lock_file(target, "lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if note is not None:
                note(f"waited for another session's install into {target}")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _use(target: Path) -> IO[str]:
    f = open(_lock_file(target, "use"), "a")  # noqa: SIM115 - held open: the lock lasts as long as the process
    fcntl.flock(f, fcntl.LOCK_SH)
    return f


def hold(target: Path) -> None:
    """This process's session runs from the folder: its shared lock, held until the process ends."""
    earlier = _USING.pop(str(target), None)
    if earlier is not None:
        earlier.close()
    _USING[str(target)] = _use(target)


@contextmanager
def combination_in_use(target: Path) -> Iterator[None]:
    """Hold the folder as a running session does (its shared lock), for as long as the block runs."""
    f = _use(target)
    try:
        yield
    finally:
        f.close()


def combination_used_elsewhere(target: Path) -> bool:
    """Whether a session other than this process's runs from the folder (this process's own, earlier session has
    ended: nox runs one at a time)."""
    mine = _USING.pop(str(target), None)
    if mine is not None:
        mine.close()
    with open(_lock_file(target, "use"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def probe_torch(python: str) -> dict:
    """Version, CUDA and site-packages of the torch that `python` imports."""
    code = ("import json, os, torch; print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, "
            "'site': os.path.dirname(os.path.dirname(torch.__file__))}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{python} cannot import torch: {out.stderr.strip().splitlines()[-1:] or out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def torch_differences(combo: Combination, found: dict) -> list[str]:
    """What differs between a preinstalled torch and the combination (empty when it matches)."""
    diffs = []
    try:
        version = Version(found["version"])
    except (InvalidVersion, KeyError):
        return [f"torch version {found.get('version')!r} is unreadable"]
    if version.base_version != combo.torch.base_version:
        diffs.append(f"torch {version.base_version} instead of {combo.torch}")
    local = version.local or ("cpu" if not found.get("cuda") else None)
    if local and local != combo.torch_variant:
        diffs.append(f"torch variant {local} instead of {combo.torch_variant}")
    return diffs


def _find_torch(python: str) -> str | None:
    """Where `python`'s torch is, without importing it (a tenth of a second, not three)."""
    code = "import importlib.util as u; s = u.find_spec('torch'); print(s.origin if s else '')"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or None if out.returncode == 0 else None


def install_key(combo: Combination, python: str, options: InstallOptions, project: Path) -> str:
    """Everything an install depends on: the combination, the mode, the wheelhouse's files, the
    preinstalled torch (its files' mtime), the project's dependencies. The same key in a reused
    environment means the same install: it is not run again."""
    import hashlib

    torch_file = _find_torch(options.preinstalled_torch) if options.preinstalled_torch else None
    torch_stamp = None
    if torch_file:
        version = Path(torch_file).with_name("version.py")
        torch_stamp = [str(version), version.stat().st_mtime if version.is_file() else None]
    wheels = sorted((p.name, p.stat().st_size) for d in (options.wheelhouse, options.extra_wheels) if d
                    for p in d.iterdir()) if options.wheelhouse else None
    pyproject = project / "pyproject.toml"
    parts = [combo.sha256, options.mode, python, options.preinstalled_torch, torch_stamp, wheels, str(project),
             PROJECT_REQUIREMENTS, hashlib.sha256(pyproject.read_bytes()).hexdigest() if pyproject.is_file() else None,
             options.torch_index]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def install(combo: Combination, python: str, options: InstallOptions, *, project: str | Path, log: str | Path,
            env: dict[str, str] | None = None) -> InstallResult:
    """Install `combo` into the environment of `python`; never raises for an install failure. A
    reused environment whose last install had the same `install_key` is left as it is."""
    project = Path(project).resolve()
    try:
        site = site_packages(python)
        key = install_key(combo, python, options, project)
        before = json.loads((site / INSTALLED).read_text()) if (site / INSTALLED).is_file() else None
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError, ValueError):
        site, key, before = None, None, None
    same = isinstance(before, dict) and before.get("key") == key and before.get("result", {}).get("ok")
    if same and _layers_intact(site):
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text(f"unchanged since {before.get('at')}: the same combination, mode, wheels, torch and "
                             "project as the environment's last install; nothing installed\n")
        kept = InstallResult(**before["result"])
        kept.log, kept.steps = str(log), [f"unchanged since {before.get('at')}: nothing installed"]
        layered = site / "flashinfer_trace_combo.pth" if site else None
        for line in layered.read_text().splitlines() if layered and layered.is_file() else ():
            if line.strip():
                hold(Path(line.strip()))  # the session runs from the combination's folder: not rewritten under it
        return kept
    result = _install(combo, python, options, project=project, log=log, env=env)
    if result.ok and site is not None and key is not None:
        import time

        (site / INSTALLED).write_text(json.dumps({"key": key, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                  "result": result.as_dict()}))
    return result


def _layers_intact(site: Path | None) -> bool:
    """Every folder the install layered in by a .pth file is still there (a cleaned cache is not), and a
    combination folder's .pth files are run (an environment layered before they were is installed again)."""
    if site is not None and (site / "flashinfer_trace_combo.pth").is_file() \
            and not (site / "flashinfer_trace_combo_site.pth").is_file():
        return False
    for name in LAYERS:
        pth = site / name if site else None
        if pth is not None and pth.is_file() and not all(
                Path(line).is_dir() for line in pth.read_text().splitlines() if line.strip()
                and not line.startswith(PTH_EXEC)):
            return False
    return site is not None


def _install(combo: Combination, python: str, options: InstallOptions, *, project: Path, log: str | Path,
             env: dict[str, str] | None = None) -> InstallResult:
    run = _Runner(Path(log), env)
    result = InstallResult(False, options.mode, str(log))
    try:
        if options.wheelhouse:  # before anything is installed: a wheel damaged on the way is refused
            from .wheelhouse import WheelhouseError, verify

            for folder, combination in ((options.wheelhouse, combo.id), (options.extra_wheels, None)):
                try:
                    manifest = verify(folder, combination) if folder else None
                except WheelhouseError as e:
                    with run.log.open("a") as f:
                        f.write(f"refused: {e}\n")
                    raise
                if manifest is not None:
                    run.steps.append(f"{folder}: {len(manifest['wheels'])} wheel(s) match its wheelhouse.json")
        site = site_packages(python)
        (site / INSTALLED).unlink(missing_ok=True)
        for stale in LAYERS:  # a reused environment keeps only this install's layering
            (site / stale).unlink(missing_ok=True)
        if options.preinstalled_torch:  # first: pip must see the layered packages as installed
            found = probe_torch(options.preinstalled_torch)
            (site / "zz_flashinfer_trace_base.pth").write_text(found["site"] + "\n")
            run.steps.append(f"layered {found['site']} (torch {found['version']}) via zz_flashinfer_trace_base.pth")
            result.torch, result.differences = found, torch_differences(combo, found)
        # pip, the environment's or the layered base's; uv only without one (uv's resolver does not
        # see packages that .pth files add, seen on a node whose nox made uv environments)
        pip = _installer(python, run)
        wh = ["--no-index", "--find-links", str(options.wheelhouse)] if options.wheelhouse else []
        constraints = Path(log).with_suffix(".constraints.txt")
        constraints.write_text(combo.constraints_text())
        if options.wheelhouse and not options.preinstalled_torch:
            run([*pip, *wh, f"torch=={combo.torch}"])
        elif not options.preinstalled_torch:
            index = options.torch_index or (DEFAULT_TORCH_INDEX.format(variant=combo.torch_variant)
                                            if combo.torch_variant != "cpu" else None)
            run([*pip, *(["--index-url", index] if index else []), f"torch=={combo.torch}"])
        others = combo.requirements(without=("torch",))
        if options.wheelhouse:
            target = combination_site(combo)
            stamp = target / STAMP
            extra = sorted(str(p) for p in options.extra_wheels.glob("*.whl")) if options.extra_wheels else []
            want = combo.sha256 + "".join(f"\n{Path(p).name}" for p in extra)
            if others:  # one session of the combination at a time, and never under one that runs from it
                with combination_lock(target, run.steps.append):
                    if not (stamp.is_file() and stamp.read_text() == want):
                        if combination_used_elsewhere(target):
                            raise RuntimeError(
                                f"{target} is in use by another session of {combo.id}, installed from other wheels; "
                                "give this one the same --wheelhouse / --extra-wheels, or wait for that one to end")
                        shutil.rmtree(target, ignore_errors=True)
                        run([*pip, *wh, "--no-deps", "--target", str(target), *others])
                        if extra:  # after the pins: a pin's own wheel wins where the folder has another version
                            run([*pip, "--no-index", "--no-deps", "--target", str(target), *extra])
                        stamp.write_text(want)
                    hold(target)
            if others:
                (site / "flashinfer_trace_combo.pth").write_text(str(target) + "\n")
                run.steps.append(f"layered {target} via flashinfer_trace_combo.pth")
                # the .pth files the pins' wheels put into the folder (nvidia-cutlass-dsl's adds the folder that
                # holds `cutlass`): Python runs those of a site directory only, not of a folder a .pth names
                hook = f"import site; site.addsitedir({str(target)!r})\n"
                (site / "flashinfer_trace_combo_site.pth").write_text(hook)
                hooks = sorted(p.name for p in target.glob("*.pth"))
                if hooks:
                    run.steps.append(f"{', '.join(hooks)} of {target} run via flashinfer_trace_combo_site.pth")
            (site / "flashinfer_trace_src.pth").write_text(str(project / "src") + "\n")
            run.steps.append(f"layered {project / 'src'} via flashinfer_trace_src.pth")
            run([*pip, *wh, "-c", str(constraints), *PROJECT_REQUIREMENTS])
        else:
            if others:  # a combination's own indexes: FlashInfer's, for its prebuilt flashinfer-jit-cache
                run([*pip, "-c", str(constraints), *(a for i in combo.indexes for a in ("--extra-index-url", i)),
                     *others])
            run([*pip, "-c", str(constraints), "-e", f"{project}[dev]"])
        result.ok = True
    except (subprocess.CalledProcessError, OSError, RuntimeError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}".splitlines()[0][:500]
    result.steps = run.steps
    return result
