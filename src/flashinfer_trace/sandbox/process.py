"""One confined reference worker, from our side: the fork server that starts it (zygote.py), the socket it answers
on, and its own CPU arena. pool.py hands calls to one worker at a time."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING

import torch
import torch.multiprocessing  # noqa: F401 - registers CUDA IPC for ForkingPickler (else a CUDA tensor pickles as a copy)

from .confine import scrubbed_environment
from .errors import ConfinementUnavailable, ReferenceFailure
from .settings import ENV_ALLOW, MAX_MESSAGE, MIN_HOST_ARENA, NUMPY_MISSING, POLL_S, settings
from .transport import HostArena, ProtocolError

if TYPE_CHECKING:
    from .pool import _Pool


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


def close_fork_server() -> None:
    """End the fork server: the next worker's starts one with this process's environment as it is now."""
    global _zygote
    with _zygote_lock:
        if _zygote is not None:
            _zygote.close()
            _zygote = None


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
