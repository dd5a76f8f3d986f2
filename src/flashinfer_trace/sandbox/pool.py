"""The parent side: confined workers, started from a fork server, one reference's code each.

`compile_reference` returns a `ConfinedReference`: calling it lays the tensors into the shared arena,
asks the worker, and turns the answer into outputs or an exception that names the definition. The
worker's answer is untrusted and checked (`transport.decode`); its death is a result:

    timeout     no answer within Settings.timeout: the worker is killed (never a hang of the caller)
    crash       the worker died: "crash: the worker died of SIGSEGV"
    cpu-time    it used more CPU time in one call than Settings.cpu_seconds (SIGXCPU from RLIMIT_CPU)
    memory      a GPU worker's resident memory passed Settings.memory_bytes (CPU workers get MemoryError
                from RLIMIT_AS instead)

One worker lives at a time (per test process): a call for other code replaces it, so no two
references ever share a process, and a worker that escaped its confinement has no sibling to reach.
Nor an arena: each worker has a CPU arena of its own (sealed at its size, closed with it; a call that
needs more runs in a new worker with a larger one), and a device's CUDA arena, shared through CUDA
IPC, is zeroed before each new worker opens it.
The next call after a failure starts a fresh worker and compiles the reference again.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import os
import re
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401 - registers CUDA IPC for ForkingPickler (else a CUDA tensor pickles as a copy)

from .confine import scrubbed_environment
from .entry import entry_signature
from .errors import ConfinementUnavailable, ReferenceFailure, SandboxError, reference_raised
from .static import check_reference
from .transport import Arenas, HostArena, ProtocolError, decode, encode, needed

__all__ = ["ConfinedReference", "Settings", "compile_reference", "configure", "settings", "shutdown", "status"]

ENV_TIMEOUT = "FLASHINFER_TRACE_REFERENCE_TIMEOUT"
ENV_MEMORY = "FLASHINFER_TRACE_REFERENCE_MEMORY_GB"
ENV_ALLOW = "FLASHINFER_TRACE_ALLOW_UNCONFINED"
ENV_DISABLE = "FLASHINFER_TRACE_SANDBOX_DISABLE"  # comma-separated mechanisms to leave off (to see the refusal)
MAX_MESSAGE = 64 << 20
POLL_S = 0.05
MIN_CUDA_ARENA = 256 << 20
MIN_HOST_ARENA = 64 << 20  # address space only: a memfd's pages exist once written
# torch's warning on import where numpy is missing: the fork server shares the caller's stderr, and nothing
# in it uses numpy, so it filters this one warning before it imports torch
NUMPY_MISSING = re.escape("Failed to initialize NumPy: No module named 'numpy'")


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 << 30


@dataclass
class Settings:
    timeout: float = 900.0  # seconds per call (and per compile: the module body runs too)
    memory_bytes: int | None = None  # None: 80% of physical memory
    cpu_seconds: float | None = None  # per call; None: timeout x CPU count (a backstop behind timeout)
    allow_unconfined: bool = False  # run references where a confinement mechanism is missing
    disable: tuple[str, ...] = ()  # mechanisms to leave off on purpose (recorded as missing)
    start_timeout: float = 180.0

    @classmethod
    def from_env(cls) -> Settings:
        s = cls()
        if os.environ.get(ENV_TIMEOUT):
            s.timeout = float(os.environ[ENV_TIMEOUT])
        if os.environ.get(ENV_MEMORY):
            s.memory_bytes = int(float(os.environ[ENV_MEMORY]) * 2**30)
        s.allow_unconfined = os.environ.get(ENV_ALLOW, "") not in ("", "0", "false", "no")
        s.disable = tuple(m for m in os.environ.get(ENV_DISABLE, "").split(",") if m)
        return s

    @property
    def memory(self) -> int:
        return self.memory_bytes or int(0.8 * _total_memory())

    @property
    def cpu(self) -> float:
        return self.cpu_seconds or self.timeout * (os.cpu_count() or 1)


settings = Settings.from_env()


def configure(*, timeout: float | None = None, memory_gb: float | None = None, cpu_seconds: float | None = None,
              allow_unconfined: bool | None = None, disable: tuple[str, ...] | None = None) -> Settings:
    """Change the settings here and, through the environment, in the processes this one starts; the
    running worker is stopped, so the next call's worker has them."""
    shutdown()
    if cpu_seconds is not None:
        settings.cpu_seconds = float(cpu_seconds)
    if disable is not None:
        settings.disable = tuple(disable)
        os.environ[ENV_DISABLE] = ",".join(disable)
    if timeout is not None:
        settings.timeout = float(timeout)
        os.environ[ENV_TIMEOUT] = str(timeout)
    if memory_gb is not None:
        settings.memory_bytes = int(memory_gb * 2**30)
        os.environ[ENV_MEMORY] = str(memory_gb)
    if allow_unconfined is not None:
        settings.allow_unconfined = bool(allow_unconfined)
        os.environ[ENV_ALLOW] = "1" if allow_unconfined else "0"
    return settings


# -- the fork server ---------------------------------------------------------------------------------
class _Zygote:
    """Our end of the fork server (`zygote.py`): spawn a worker, collect its exit status."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        boot = ("import sys, json, warnings; sys.path[:] = json.loads(sys.argv[1]); "
                "warnings.filterwarnings('ignore', message=sys.argv[3], category=UserWarning); "
                "from flashinfer_trace.sandbox.zygote import main; main(int(sys.argv[2]))")
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", boot, json.dumps(sys.path), str(theirs.fileno()),
                                      NUMPY_MISSING],
                                     pass_fds=[theirs.fileno()], env=scrubbed_environment(), stdin=subprocess.DEVNULL)
        theirs.close()
        self.ctl = ours
        self.ctl.settimeout(settings.start_timeout)
        try:
            ready = self._receive()
        except (OSError, ValueError) as e:
            raise ReferenceFailure("<sandbox>", "crash", f"the fork server did not start: {e}") from None
        if "ready" not in ready:
            raise ReferenceFailure("<sandbox>", "crash", f"the fork server did not start: {ready}")

    def _receive(self) -> dict:
        data = self.ctl.recv(1 << 16)
        if not data:
            raise OSError("the fork server exited")
        return json.loads(data)

    def spawn(self, conn_fd: int, arena_fd: int, config: dict) -> int:
        socket.send_fds(self.ctl, [json.dumps({"op": "spawn", "config": config}).encode()], [conn_fd, arena_fd])
        return int(self._receive()["pid"])

    def wait(self, pid: int) -> int | None:
        self.ctl.sendall(json.dumps({"op": "wait", "pid": pid}).encode())
        return self._receive()["status"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Close our end: the fork server exits, and its workers with it (PR_SET_PDEATHSIG)."""
        self.ctl.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_zygote_lock = threading.Lock()
_zygote: _Zygote | None = None


def _fork_server() -> _Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive():
            _zygote = _Zygote()
        return _zygote


# -- one worker --------------------------------------------------------------------------------------
class _Channel:
    """Our end of a worker's socket, framed like multiprocessing.Connection (the worker uses one), but
    every read and write has a deadline: a worker that sends half a message and stalls, or stops
    reading, cannot block the caller."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @property
    def closed(self) -> bool:
        return self.sock.fileno() < 0

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes, timeout: float) -> None:
        self.sock.settimeout(max(timeout, 0.001))
        self.sock.sendall(struct.pack("!i", len(data)) + data)

    def readable(self, timeout: float) -> bool:
        return bool(select.select([self.sock], [], [], max(timeout, 0))[0])

    def recv(self, timeout: float) -> bytes:
        self.sock.settimeout(max(timeout, 0.001))
        (size,) = struct.unpack("!i", self._exactly(4))
        if not 0 <= size <= MAX_MESSAGE:
            raise ProtocolError(f"a message of {size} bytes")
        return self._exactly(size)

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("the worker closed its end")
            buf += chunk
        return bytes(buf)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


_starts = 0  # workers started by this process (a test records how many it cost)


def worker_starts() -> int:
    return _starts


def _arena_size(n: int) -> int:
    """A CPU arena's size for `n` bytes: a power of two, at least MIN_HOST_ARENA (fewer new workers for
    a reference whose inputs grow from call to call)."""
    return max(MIN_HOST_ARENA, 1 << max(int(n) - 1, 0).bit_length())


def _host_arena(size: int, definition: str) -> HostArena:
    """A new sealed CPU arena; a ReferenceFailure, never a raw OSError, where it cannot be sized, sealed
    or mapped (no memfd, a tmpfs limit, the caller's RLIMIT_AS)."""
    try:
        return HostArena(size)
    except (OSError, ValueError, OverflowError) as e:
        raise ReferenceFailure(definition, "memory", f"could not size or map a shared arena of {size} bytes: "
                               f"{type(e).__name__}: {e}") from None


class _Worker:
    """One worker process and its own CPU arena (`arena_bytes`, sealed; closed when the worker ends)."""

    def __init__(self, key: tuple[str, str], device: str, pool: _Pool, definition: str, arena_bytes: int) -> None:
        global _starts
        _starts += 1
        self.key, self.device = key, device
        self.exitcode: int | None = None
        self.zygote = _fork_server()
        self.arena = _host_arena(arena_bytes, definition)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config = {"device": device, "memory_bytes": settings.memory, "allow_unconfined": settings.allow_unconfined,
                  "escaped": key[1] == "escaped", "disable": list(settings.disable),
                  "task": key[0].split(":")[1] if key[0].startswith("task:") else None}
        try:
            self.pid = self.zygote.spawn(theirs.fileno(), self.arena.fd, config)
        except (OSError, ValueError, KeyError) as e:
            ours.close()
            self.arena.close()
            raise ReferenceFailure(definition, "crash", f"the fork server could not start a worker: {e}") from None
        finally:
            theirs.close()
        self.conn = _Channel(ours)
        if device.startswith("cuda"):
            try:
                self.conn.send(bytes(ForkingPickler.dumps(pool.cuda_arena(device))), settings.start_timeout)
            except OSError:
                pass  # the worker died at once: receive() reports how
        answer = self.receive(definition, settings.start_timeout)
        if "refused" in answer:
            self.kill()
            refused = answer["refused"] if isinstance(answer["refused"], dict) else {}
            pool.last_status = refused | {"complete": False, "allow_unconfined": False}
            missing = refused.get("missing", {})
            raise ConfinementUnavailable(definition, "cannot confine the reference worker on this machine: "
                                         + "; ".join(f"{k} unavailable ({v})" for k, v in missing.items())
                                         + f". Pass --allow-unconfined-references (or {ENV_ALLOW}=1) to run "
                                         "untrusted references without it; the results record that you did.")
        if "ready" not in answer or not isinstance(answer["ready"], dict):
            self.kill()
            error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
            why = str(error.get("message") or answer).strip()  # a traceback ends with what went wrong
            raise ReferenceFailure(definition, "crash", f"the worker did not start: {why[-800:]}")
        self.status = answer["ready"]
        self.compiled: set[int] = set()

    def kill(self) -> None:
        """SIGKILL, then collect the exit status from the fork server (idempotent)."""
        if self.exitcode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.exitcode = self.zygote.wait(self.pid)
            except (OSError, ValueError, KeyError):
                self.exitcode = -signal.SIGKILL
        self.conn.close()
        self.arena.close()  # nothing of this worker's calls outlives it

    def alive(self) -> bool:
        return self.exitcode is None and not self.conn.closed

    def _rss(self) -> int:
        try:
            with open(f"/proc/{self.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    def limit_memory(self, arena_bytes: int, budget: int | None = None) -> None:
        """RLIMIT_AS of a CPU worker: its base, the shared arena it maps, and the reference's budget
        (`budget`, or the --reference-memory setting)."""
        base = self.status.get("vm_base")
        if type(base) is not int or base <= 0:
            return
        try:
            _, hard = resource.prlimit(self.pid, resource.RLIMIT_AS)
            soft = base + arena_bytes + min(budget or settings.memory, settings.memory)
            resource.prlimit(self.pid, resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard),
                                                           hard))
        except (OSError, ValueError):
            pass

    def limit_cpu(self) -> None:
        """RLIMIT_CPU of the worker: what it has used so far plus one call's budget."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            used = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            _, hard = resource.prlimit(self.pid, resource.RLIMIT_CPU)
            soft = int(used + settings.cpu) + 1
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.prlimit(self.pid, resource.RLIMIT_CPU, (soft, hard))
        except (OSError, ValueError, IndexError):
            pass

    def receive(self, definition: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        watch = self.device.startswith("cuda")
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise ReferenceFailure(definition, "timeout", f"no result after {timeout:g} s; the worker was killed")
            try:
                data = self.conn.recv(remaining) if self.conn.readable(min(remaining, POLL_S)) else None
            except TimeoutError:
                self.kill()
                raise ReferenceFailure(definition, "timeout", f"no complete answer after {timeout:g} s; the worker "
                                       "was killed") from None
            except ProtocolError as e:
                self.kill()
                raise ReferenceFailure(definition, "protocol", f"{e}; the worker was killed") from None
            except (EOFError, OSError):
                raise self._died(definition) from None
            if data is not None:
                try:
                    answer = json.loads(data)
                except (ValueError, UnicodeDecodeError, RecursionError):
                    answer = None
                if not isinstance(answer, dict):
                    self.kill()
                    raise ReferenceFailure(definition, "protocol", "the worker sent a message that is not a JSON "
                                           "object; it was killed")
                return answer
            if watch and self._rss() > settings.memory:
                rss = self._rss()
                self.kill()
                raise ReferenceFailure(definition, "memory", f"resident memory {rss / 2**30:.1f} GiB passed the "
                                       f"limit of {settings.memory / 2**30:.1f} GiB; the worker was killed")

    def _died(self, definition: str) -> ReferenceFailure:
        self.kill()  # the pipe closed: dead, dying (its signal stays the exit status) or pretending
        code = self.exitcode
        if code is not None and code < 0:
            name = _signal_name(-code)
            if name == "SIGXCPU":
                return ReferenceFailure(definition, "cpu-time", f"more than {settings.cpu:g} s of CPU time in one "
                                        "call (RLIMIT_CPU)")
            return ReferenceFailure(definition, "crash", f"the worker died of {name}")
        return ReferenceFailure(definition, "crash", f"the worker exited with status {code}")

    def request(self, message: dict, definition: str, timeout: float) -> dict:
        try:
            self.conn.send(json.dumps(message).encode(), timeout)
        except TimeoutError:
            self.kill()
            raise ReferenceFailure(definition, "timeout", f"the worker read no request for {timeout:g} s; "
                                   "it was killed") from None
        except (OSError, ValueError):
            raise self._died(definition) from None
        return self.receive(definition, timeout)


# -- the pool: one worker at a time, the arenas ---------------------------------------------------------
@dataclass
class _Pool:
    lock: threading.RLock = field(default_factory=threading.RLock)
    worker: _Worker | None = None
    cuda: dict[str, torch.Tensor] = field(default_factory=dict)
    last_status: dict | None = None
    arena_hint: int = MIN_HOST_ARENA  # the last worker's CPU arena: the next one starts as large
    device_peak: int = 0  # the largest device memory a worker's call reserved since `take_device_peak`

    def cuda_arena(self, device: str, size: int = 0, definition: str = "<sandbox>") -> torch.Tensor:
        """The CUDA arena of a device, at least `size` bytes. Growing it means new workers (theirs is
        mapped once, before confinement); it grows to what the call needs and a quarter more, not by doubling
        (device memory is planned per case: budget/), and `trim` gives a large one back after its case."""
        arena = self.cuda.get(device)
        if arena is None or arena.numel() < size:
            new = max(MIN_CUDA_ARENA, size + size // 4)
            if self.worker is not None and self.worker.device == device:
                self.close()
            self.cuda.pop(device, None)
            _collect_ipc()  # the old arena, which its dead worker still held through CUDA IPC
            try:
                self.cuda[device] = torch.empty(new, dtype=torch.uint8, device=device)
            except RuntimeError as e:  # torch.cuda.OutOfMemoryError among them
                raise ReferenceFailure(definition, "memory", f"could not allocate a CUDA arena of {new} bytes: "
                                       f"{_text(e, 300)}") from None
        return self.cuda[device]

    def get(self, key: tuple[str, str], device: str, definition: str, cpu_bytes: int = 0,
            cpu_size: int = 0) -> _Worker:
        """The worker for `key` on `device` whose CPU arena holds at least `cpu_bytes`; a new one (with an
        arena of about `cpu_size`, and never a smaller one than the last) where there is none."""
        w = self.worker
        if w is not None and (w.key != key or w.device != device or not w.alive() or w.arena.size < cpu_bytes):
            self.close()
        if self.worker is None:
            if device.startswith("cuda"):
                self.clear_cuda(device, definition)
            size = _arena_size(max(cpu_bytes, min(cpu_size, settings.memory), self.arena_hint))
            self.worker = _Worker(key, device, self, definition, size)
            self.arena_hint = self.worker.arena.size
            self.last_status = self.worker.status | {"allow_unconfined": settings.allow_unconfined}
        return self.worker

    def clear_cuda(self, device: str, definition: str) -> None:
        """Zero the device's CUDA arena before a new worker maps it: it is shared by every worker on the
        device (through CUDA IPC), and the last one's inputs and outputs are still in it. All of it, not
        only what the last calls used (an escaped worker writes where it likes); a memset of the arena
        costs well under a millisecond next to a worker start."""
        try:
            arena = self.cuda_arena(device, definition=definition)
            arena.zero_()
            torch.cuda.synchronize(device)
        except RuntimeError as e:
            raise ReferenceFailure(definition, "crash", f"could not clear the CUDA arena: {_text(e, 300)}") from None

    def close(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None
            _collect_ipc()


    def trim(self) -> None:
        """A CUDA arena grown past its minimum goes back to the device, with the worker that maps it (a worker
        holds nothing else: it empties its allocator's cache after every call)."""
        with self.lock:
            large = [d for d, a in self.cuda.items() if a.numel() > MIN_CUDA_ARENA]
            if large and self.worker is not None and self.worker.device in large:
                self.close()
            for d in large:
                del self.cuda[d]
            _collect_ipc()

    def reset_after_fork(self) -> None:
        self.lock = threading.RLock()
        self.worker, self.cuda = None, {}
        self.device_peak = 0


_pool = _Pool()
os.register_at_fork(after_in_child=_pool.reset_after_fork)


def _collect_ipc() -> None:
    """Free what CUDA IPC keeps for a dead consumer: torch holds a block shared with another process until that
    process lets go of it, and a killed worker never does; `ipc_collect` frees the blocks whose consumers are gone
    (torch warns "Producer process has been terminated before all shared CUDA tensors released" otherwise)."""
    if torch.cuda.is_initialized():
        try:
            torch.cuda.ipc_collect()
        except RuntimeError:
            pass


def trim() -> None:
    """Give a large CUDA arena (and its worker) back: the memo calls it when a case group ends."""
    _pool.trim()


def cuda_arena_bytes() -> int:
    """The bytes of this process's CUDA arenas (they hold the reference worker's inputs and outputs)."""
    return sum(a.numel() for a in _pool.cuda.values())


def take_device_peak() -> int:
    """The largest device memory a worker's call reserved since the last ask (its own allocator: the arena is the
    parent's), and forget it."""
    peak, _pool.device_peak = _pool.device_peak, 0
    return peak


def shutdown(*, fork_server: bool = False) -> None:
    """Stop the worker (the next call starts a new one); with `fork_server`, the fork server too, so the
    next one starts with this process's environment as it is now (workers inherit the fork server's)."""
    global _zygote
    with _pool.lock:
        _pool.close()
        if fork_server:
            with _zygote_lock:
                if _zygote is not None:
                    _zygote.close()
                    _zygote = None


def status(*, probe: bool = False) -> dict | None:
    """The confinement of the latest worker: {"complete", "active", "missing", "allow_unconfined", ...};
    with `probe`, starts a worker to find out if none has run yet."""
    if _pool.last_status is None and probe:
        try:
            compile_reference("def run():\n    return 0\n", definition="<probe>")
        except ConfinementUnavailable:
            pass
        except (ReferenceFailure, OSError) as e:
            return {"complete": False, "error": str(e)}
    return None if _pool.last_status is None else dict(_pool.last_status)


# -- references --------------------------------------------------------------------------------------
def canonical_device(device: str | torch.device) -> str:
    """"cpu" or "cuda:N": a worker (and its arena) is kept per device, and "cuda" and "cuda:0" are
    one device (compiled for "cuda", called with "cuda:0", each definition started two workers)."""
    d = torch.device(device)
    if d.type != "cuda":
        return d.type
    return f"cuda:{d.index if d.index is not None else torch.cuda.current_device()}"


def _device_of(args: Any) -> str:
    from .transport import _tensors

    devices = {canonical_device(t.device) for t in _tensors(list(args))}
    if len(devices) > 1:
        raise ValueError(f"a reference's tensors must be on one device, got {', '.join(sorted(devices))}")
    return devices.pop() if devices else "cpu"


def _has_tensor(args: Any) -> bool:
    from .transport import _tensors

    return next(iter(_tensors(list(args))), None) is not None


_ids = itertools.count(1)


def _text(value: Any, limit: int = 2000) -> str:
    return str(value)[:limit] if value is not None else ""


def _line(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


class ConfinedReference:
    """A compiled reference: call it like `run` (arguments by position, by keyword, or both); it runs in
    a confined worker.

    The arguments are bound in this process against the entry's parameter list, read from the code's
    AST (`entry.entry_signature`; nothing of the code runs here), so a missing, unexpected or doubled
    argument is a TypeError before any worker is asked, and the worker gets them in parameter order."""

    def __init__(self, code: str, definition: str, entry: str, *, escaped: bool = False,
                 names: list[str] | None = None) -> None:
        self.code, self.definition, self.entry, self.escaped = code, definition, entry, escaped
        self.names = list(names) if names is not None else None  # call by keyword, args in this order
        # what a call binds against: the entry's own parameters, or with `names` those names, each required
        # (the worker passes every one by keyword); None: the code does not show them (positional calls only)
        self.signature = entry_signature(code, entry) if names is None else inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
        # tighter bounds than the settings' for this code's calls (an fi_trace init); None: the settings'
        self.timeout: float | None = None
        self.memory_bytes: int | None = None
        self.id = next(_ids)
        self.key = (hashlib.sha256(f"{entry}\0{code}".encode()).hexdigest(), "escaped" if escaped else "checked")

    def __repr__(self) -> str:
        return f"<ConfinedReference {self.definition}.{self.entry}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values, keywords = self.bind(args, kwargs)
        return self.call(values, keywords=keywords)

    def bind(self, args: tuple | list, kwargs: dict[str, Any]) -> tuple[list, tuple[str, ...]]:
        """(values, keywords): the call's arguments in parameter order, the last len(keywords) of them to
        be passed by those keywords (keyword-only parameters, **kwargs, and any given by name after an
        omitted default). TypeError, worded like Python's, for arguments the entry would not take."""
        if self.signature is None:
            if kwargs:
                raise TypeError(f"{self.definition}: {self.entry}() takes its arguments by position only here: "
                                f"the code has no top-level `def {self.entry}` to read its parameters from "
                                f"(got keyword argument(s) {', '.join(map(repr, kwargs))})")
            return list(args), ()
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.definition}: {self.entry}() {e}") from None
        positional: list[Any] = []
        by_keyword: dict[str, Any] = {}
        skipped = False  # a positional parameter left to its default: those after it go by keyword
        for p in self.signature.parameters.values():
            if p.name not in bound.arguments:
                skipped = skipped or p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                continue
            value = bound.arguments[p.name]
            if p.kind is p.VAR_POSITIONAL:
                positional.extend(value)  # only bound when every positional parameter before it was
            elif p.kind is p.VAR_KEYWORD:
                by_keyword.update(value)
            elif p.kind is p.KEYWORD_ONLY or skipped:
                by_keyword[p.name] = value
            else:
                positional.append(value)
        return positional + list(by_keyword.values()), tuple(by_keyword)

    @property
    def _timeout(self) -> float:
        return min(self.timeout, settings.timeout) if self.timeout is not None else settings.timeout

    def _worker(self, device: str, cpu_bytes: int = 0, cpu_size: int = 0) -> _Worker:
        w = _pool.get(self.key, device, self.definition, cpu_bytes, cpu_size)
        if self.id not in w.compiled:
            answer = w.request({"op": "compile", "id": self.id, "code": self.code, "definition": self.definition,
                                "entry": self.entry, "escaped": self.escaped, "names": self.names},
                               self.definition, settings.timeout)
            self._raise_for(answer, w)
            w.compiled.add(self.id)
        return w

    def compile(self, device: str = "cpu") -> ConfinedReference:
        with _pool.lock:
            self._worker(canonical_device(device))
        return self

    def call(self, args: tuple | list, *, seed: int | None = None, device: str | None = None,
             keywords: tuple[str, ...] = ()) -> Any:
        """run(*args) in the worker, the last len(keywords) of `args` passed by those keywords (`bind` makes
        both); `seed` seeds its RNG (0 when None: every call starts the same). `device`: the worker's device
        where no argument is a tensor (an fi_trace init gets only numbers)."""
        if len(keywords) > len(args) or (keywords and self.names is not None):
            raise ValueError("`keywords` names at most len(args) trailing arguments, and none where the "
                             "reference was compiled with `names`")
        device = _device_of(args) if device is None or _has_tensor(args) else canonical_device(device)
        args = list(args)
        need = needed(args)
        cpu_bytes = need.get("cpu", 0)  # what the worker's arena must hold: the inputs, or all a "need" asked
        with _pool.lock:
            for _ in range(3):  # at most two arena growths that need a new worker
                # a new worker's arena: room for outputs as large as the inputs behind them
                w = self._worker(device, cpu_bytes, 2 * cpu_bytes)
                answer, specs, buffers, cpu_bytes = self._call(w, args, device, seed, tuple(keywords), need,
                                                               cpu_bytes)
                if answer is not None:
                    break
            else:
                raise ReferenceFailure(self.definition, "protocol", "the arena kept growing")
            self._raise_for(answer, w)
            return self._outputs(answer, w, args, specs, buffers)

    def _call(self, w: _Worker, args: list, device: str, seed: int | None, keywords: tuple[str, ...],
              need: dict[str, int], cpu_bytes: int):
        """One request: (answer, specs, buffers, cpu_bytes), the answer None when an arena was too small
        (the worker was replaced; cpu_bytes: what the next one's CPU arena must hold)."""
        buffers = {"cpu": w.arena.tensor}
        if device.startswith("cuda"):
            if _pool.cuda_arena(device).numel() < need.get("cuda", 0):
                _pool.cuda_arena(device, need["cuda"], self.definition)
                return None, None, None, cpu_bytes
            buffers["cuda"] = _pool.cuda[device]
        arenas = Arenas(buffers)
        specs = [encode(a, arenas) for a in args]
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        w.limit_cpu()
        w.limit_memory(w.arena.size, budget=self.memory_bytes)
        answer = w.request({"op": "call", "id": self.id, "args": specs, "keywords": list(keywords), "seed": seed,
                            "input_end": arenas.cursor}, self.definition, self._timeout)
        if "need" not in answer:
            return answer, specs, buffers, cpu_bytes
        want = answer["need"] if isinstance(answer["need"], dict) else {}
        cuda, cpu = want.get("cuda", 0), want.get("cpu", 0)
        if type(cpu) is not int or type(cuda) is not int or cpu > settings.memory or (
                cuda and cuda > torch.cuda.get_device_properties(torch.device(device)).total_memory):
            w.kill()
            raise ReferenceFailure(self.definition, "memory", f"outputs of {_text(max(cpu, cuda), 40)} bytes asked "
                                   "for: more than the device has")
        grow_cuda = cuda > buffers.get("cuda", torch.empty(0)).numel()
        if not grow_cuda and cpu <= w.arena.size:
            w.kill()
            raise ReferenceFailure(self.definition, "protocol", "the worker asked for an arena it has")
        _pool.close()  # its arena cannot grow (sealed): the call runs again in a new worker
        if grow_cuda:
            _pool.cuda_arena(device, cuda, self.definition)
        return None, None, None, max(cpu_bytes, cpu)

    def _raise_for(self, answer: dict, w: _Worker) -> None:
        error = answer.get("error")
        if error is None:
            return
        if not isinstance(error, dict):
            error = {"kind": "protocol", "message": "malformed error"}
        kind = error.get("kind")
        if kind == "sandbox":
            raise SandboxError(self.definition, _line(error.get("line")), _text(error.get("message")))
        if kind == "raised":
            remote = _text(error.get("type"), 100)
            remote = remote if remote.isidentifier() else "Exception"
            raise reference_raised(self.definition, remote, _text(error.get("message")), _line(error.get("line")))
        w.kill()  # the pool replaces a dead worker at the next call
        raise ReferenceFailure(self.definition, "crash" if kind == "worker" else "protocol",
                               _text(error.get("message")))

    def _outputs(self, answer: dict, w: _Worker, args: list, specs: list, buffers: dict) -> Any:
        ok = answer.get("ok")
        peak = ok.get("device_peak") if isinstance(ok, dict) else None
        if type(peak) is int and 0 <= peak < 1 << 50:  # the worker's word, bounded: it only informs the planner
            _pool.device_peak = max(_pool.device_peak, peak)
        try:
            if not isinstance(ok, dict):
                raise ProtocolError("no outputs in the answer")
            arenas = Arenas(dict(buffers))
            out = decode(ok.get("outputs"), arenas, clone=True)
            mutated = ok.get("mutated", [])
            tensors = [(a, s) for a, s in zip(args, specs, strict=True) if isinstance(a, torch.Tensor)]
            if not isinstance(mutated, list) or not all(type(i) is int and 0 <= i < len(tensors) for i in mutated):
                raise ProtocolError("malformed list of mutated inputs")
        except ProtocolError as e:
            w.kill()
            raise ReferenceFailure(self.definition, "protocol", f"invalid answer from the worker: {e}") from None
        for i in mutated:  # a reference that writes into its inputs does so for the caller too
            tensor, spec = tensors[i]
            tensor.copy_(decode(spec, arenas, clone=False))
        w.arena.release()
        return out


def compile_reference(code: str, *, definition: str = "<reference>", entry: str = "run",
                      device: str | None = None, names: list[str] | None = None) -> ConfinedReference:
    """Check a reference, then compile it in a confined worker; the result is called like `run`.

    `names`: call the entry with its arguments by keyword, in this order (FlashInfer fi_trace references).
    Raises SandboxError (definition, line, message) when the static check refuses the code or its module
    body fails in the worker; ConfinementUnavailable when this machine cannot confine the worker and the
    user did not allow running without it; ReferenceFailure when the module body times out or crashes.
    """
    if not isinstance(code, str):
        raise SandboxError(definition, None, f"must be a str, got {type(code).__name__}")
    if not isinstance(entry, str) or not entry.isidentifier():
        raise SandboxError(definition, None, f"entry {entry!r} is not a function name")
    violations = check_reference(code)
    if violations:
        raise SandboxError(definition, violations[0].line, violations[0].message)
    if names is not None and not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise SandboxError(definition, None, "argument names must be identifiers")
    if names is not None and len(set(names)) != len(names):
        raise SandboxError(definition, None, "argument names must be distinct")
    return ConfinedReference(code, definition, entry, names=names).compile(device or "cpu")


def _compile_as_escaped(code: str, *, definition: str = "<escaped>", entry: str = "run",
                        device: str = "cpu") -> ConfinedReference:
    """For tests: compile plain Python, unchecked and with the real builtins, in a confined worker of
    its own, as if a reference had escaped the static check and the module views (a torch gadget)."""
    return ConfinedReference(code, definition, entry, escaped=True).compile(device)


class TaskUnavailable(RuntimeError):
    """A worker task found what it needs missing (e.g. the installed FlashInfer has no flashinfer.trace)."""


def run_task(module: str, payload: dict, *, label: str, timeout: float | None = None,
             memory_bytes: int | None = None, device: str = "cpu") -> Any:
    """One task of this project's own code that runs third-party code (`module`: a module of this package
    with `preload()` and `run(message, device)`, e.g. flashinfer_trace.fitrace.emit, which runs FlashInfer's
    trace templates and their init) in a confined worker of its
    own on `device` (a CUDA worker brings CUDA up before it confines itself, as for references),
    killed afterwards. Returns the answer's `ok` value: untrusted JSON, for the caller to check.
    Raises TaskUnavailable, ReferenceFailure (timeout, crash, raised) or ConfinementUnavailable."""
    with _pool.lock:
        w = _pool.get((f"task:{module}:{next(_ids)}", "checked"), canonical_device(device), label)
        try:
            w.limit_cpu()
            w.limit_memory(w.arena.size, budget=memory_bytes)
            answer = w.request({"op": "task", **payload}, label, timeout or settings.timeout)
        finally:
            _pool.close()  # the task imported third-party modules: no reference runs after it there
    error = answer.get("error")
    if isinstance(error, dict) and error.get("kind") == "unavailable":
        raise TaskUnavailable(_text(error.get("message")))
    if error is not None:
        error = error if isinstance(error, dict) else {}
        raise ReferenceFailure(label, "raised" if error.get("kind") == "raised" else "protocol",
                               _text(error.get("message")) or "malformed answer")
    if "ok" not in answer:
        raise ReferenceFailure(label, "protocol", "the worker's answer has no result")
    return answer["ok"]


def describe_settings() -> dict:
    return asdict(settings) | {"memory_bytes": settings.memory, "cpu_seconds": settings.cpu}
