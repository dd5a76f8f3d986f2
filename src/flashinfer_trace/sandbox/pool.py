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
import os
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401 - registers CUDA IPC for ForkingPickler (else a CUDA tensor pickles as a copy)

from .entry import entry_signature
from .errors import ConfinementUnavailable, ReferenceFailure, SandboxError, reference_raised
from .static import check_reference
from .transport import Arenas, ProtocolError, decode, encode, needed

__all__ = ["ConfinedReference", "Settings", "compile_reference", "configure", "settings", "shutdown", "status"]

from .process import (  # noqa: F401 - worker_starts and _signal_name re-exported (the tests read them here)
    _arena_size,
    _host_arena,
    _signal_name,
    _Worker,
    _Zygote,
    close_fork_server,
    worker_starts,
)
from .settings import (  # noqa: F401 - re-exported: pool.settings, pool.Settings are the sandbox's API
    ENV_ALLOW,
    ENV_DISABLE,
    ENV_MEMORY,
    ENV_TIMEOUT,
    MAX_MESSAGE,
    MIN_CUDA_ARENA,
    MIN_HOST_ARENA,
    NUMPY_MISSING,
    POLL_S,
    Settings,
    _total_memory,
    settings,
)


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
    with _pool.lock:
        _pool.close()
        if fork_server:
            close_fork_server()


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
