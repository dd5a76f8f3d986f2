"""The confined worker: the only process that executes a definition's code.

Forked from the fork server (`zygote.py`), which has already imported torch (so a new worker costs milliseconds), it
takes its arenas from the parent, confines itself (`confine.py`) and then serves JSON requests on its
pipe, one at a time:

    {"op": "compile", "id": N, "code": ..., "definition": ..., "entry": "run", "names": null | [...]}
    {"op": "call", "id": N, "args": [...], "keywords": [...], "seed": S, "input_end": {kind: BYTES}}
                                              the last len(keywords) args go by those keywords

Its CPU arena is its own and sealed at the size the parent chose: outputs that do not fit behind the
inputs are answered with {"need": {kind: BYTES}}, and the parent runs the call again in a new worker
with a larger arena (as for the CUDA arena, which no worker can grow either).

Every call starts from the same torch state (grad mode on, inference mode and autocast off, no torch
function or dispatch modes, the default dtype and device, matmul and cuDNN flags, thread count as
at start, the RNG seeded with the call's seed), so nothing one call leaves behind reaches the next.
A worker runs one reference's code only (the parent starts a new one for other code), so no
reference can reach another's state at all.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import pickle
import traceback
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401 - registers the CUDA IPC reductions the arena arrives by

from . import confine
from .errors import SandboxError
from .namespace import compile_in_namespace, source_name, traceback_line
from .transport import Arenas, decode, encode, map_host_arena, needed

__all__ = ["main"]

MAX_MESSAGE = 64 << 20


class _State:
    """Torch's process-global settings as the worker found them; `restore` puts them back."""

    def __init__(self) -> None:
        self.dtype = torch.get_default_dtype()
        self.threads = torch.get_num_threads()
        self.matmul_precision = torch.get_float32_matmul_precision()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.flags = self._flags()

    @staticmethod
    def _flags() -> dict[tuple[Any, str], Any]:
        out = {}
        for obj, names in ((torch.backends.cuda.matmul, ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                                                          "allow_bf16_reduced_precision_reduction")),
                           (torch.backends.cudnn, ("allow_tf32", "deterministic", "benchmark", "enabled"))):
            for n in names:
                try:
                    out[(obj, n)] = getattr(obj, n)
                except (AttributeError, RuntimeError):
                    pass
        return out

    def restore(self, seed: int) -> None:
        _pop_modes()
        torch.set_grad_enabled(True)
        for device_type in ("cpu", "cuda"):
            try:
                torch.set_autocast_enabled(device_type, False)
            except (TypeError, RuntimeError):
                pass
        torch.clear_autocast_cache()
        torch.set_default_dtype(self.dtype)
        if hasattr(torch, "set_default_device"):
            torch.set_default_device(None)
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        torch.set_float32_matmul_precision(self.matmul_precision)
        if torch.are_deterministic_algorithms_enabled() != self.deterministic:  # the setter imports dynamo
            torch.use_deterministic_algorithms(self.deterministic)
        if torch.is_anomaly_enabled():
            torch.autograd.set_detect_anomaly(False)
        for (obj, n), v in self.flags.items():
            try:
                setattr(obj, n, v)
            except (AttributeError, RuntimeError):
                pass
        torch.default_generator.manual_seed(seed)  # torch.manual_seed costs ~80 us more, for the same
        if torch.cuda.is_initialized():
            for g in torch.cuda.default_generators:
                g.manual_seed(seed)


def _pop_modes() -> None:
    """Leave no torch function / dispatch mode active (`with torch.device("meta")` is one)."""
    c = torch._C
    for length, pop in (("_len_torch_function_stack", "_pop_torch_function_stack"),
                        ("_len_torch_dispatch_stack", "_pop_torch_dispatch_stack")):
        if hasattr(c, length):
            while getattr(c, length)() > 0:
                getattr(c, pop)()


def _send(conn, message: dict) -> None:
    conn.send_bytes(json.dumps(message).encode())


def _error(e: BaseException, definition: str) -> dict:
    if isinstance(e, SandboxError):
        return {"error": {"kind": "sandbox", "line": e.line, "message": e.message}}
    text = str(e)
    return {"error": {"kind": "raised", "type": type(e).__name__, "message": text[:2000],
                      "line": traceback_line(e.__traceback__, source_name(definition))}}


def _compile_escaped(code: str, definition: str, entry: str):
    """Plain Python with the real builtins: what a reference that escaped the static check and the
    module views would have. Tests use it to show the OS confinement holds on its own."""
    namespace: dict[str, Any] = {"__name__": "escaped_reference"}
    exec(compile(code, source_name(definition), "exec"), namespace)
    return namespace[entry]


def _task_module(name: str | None):
    """The parent's named task: a module of this package with `preload()` (run before confinement: the
    third-party imports it needs) and `run(message, device) -> answer` (run confined). Imported by name,
    so the worker depends on no layer above the sandbox."""
    if name is None:
        return None
    if not (isinstance(name, str) and name.startswith(TASK_PREFIX)):
        raise ValueError(f"not a task module of this package: {name!r}")
    return importlib.import_module(name)


TASK_PREFIX = "flashinfer_trace."


class _Server:
    def __init__(self, conn, fd: int, settings: dict) -> None:
        self.conn = conn
        self.device = settings["device"]
        self.gpu = self.device.startswith("cuda")
        self.escaped = bool(settings.get("escaped"))  # only the parent's test API sets this
        self.functions: dict[int, tuple[Any, str]] = {}
        self.fd = fd  # this worker's own memfd arena, sealed at its size
        self.buffers: dict[str, torch.Tensor] = {}
        self.state = _State()
        self.state.restore(0)  # whatever it imports lazily, it imports before the file system closes
        if self.gpu:
            # CUDA comes up before any confinement: its driver fails to initialise under Landlock (error
            # 304, "OS call failed", seen on the H100 with reads of / and the device files allowed), and
            # once up it needs no new files. The arena arrives by CUDA IPC now too, and a first matmul
            # loads cuBLAS; no definition code has run yet.
            torch.cuda.set_device(torch.device(self.device).index or 0)
            probe = torch.ones(8, 8, device=self.device)
            (probe @ probe).sum().item()
            self.buffers["cuda"] = pickle.loads(conn.recv_bytes(MAX_MESSAGE))
            torch.cuda.synchronize()
        self.task = _task_module(settings.get("task"))
        if self.task is not None:
            # A task's third-party library (FlashInfer, trusted like torch) is imported now, like CUDA above:
            # its import writes under ~/.cache, which the confined worker cannot. What it runs of third-party
            # code (FlashInfer's trace templates and their init) runs only when asked, confined.
            self.task.preload()
        self.confinement = confine.apply(memory_bytes=settings.get("memory_bytes"), gpu=self.gpu,
                                         disable=settings.get("disable", ()))
        confine.finish(self.confinement, gpu=self.gpu)

    def map_cpu(self) -> None:
        """Mapped at the first call, after confinement: the parent's RLIMIT_AS for a call counts the arena
        on top of the address space measured at confinement (vm_base)."""
        if "cpu" not in self.buffers:
            self.buffers["cpu"] = map_host_arena(self.fd)

    def handle(self, msg: dict) -> dict | None:
        op = msg.get("op")
        if op == "compile":
            try:
                if msg.get("escaped") and self.escaped:
                    fn = _compile_escaped(msg["code"], msg["definition"], msg["entry"])
                else:
                    fn = compile_in_namespace(msg["code"], definition=msg["definition"], entry=msg["entry"])
            except Exception as e:  # SandboxError, or anything the module body could raise past it
                return _error(e, msg["definition"])
            names = msg.get("names")
            if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
                return {"error": {"kind": "protocol", "message": "names must be a list of strings"}}
            self.functions[msg["id"]] = (fn, msg["definition"], names)
            return {"ok": True}
        if op == "call":
            return self.call(msg)
        if op == "task" and self.task is not None:
            return self.task.run(msg, self.device)
        if op == "exit":
            return None
        return {"error": {"kind": "protocol", "message": f"unknown op {op!r}"}}

    def call(self, msg: dict) -> dict:
        fn, definition, names = self.functions[msg["id"]]
        keywords = msg.get("keywords") or []
        if not (isinstance(keywords, list) and all(isinstance(k, str) for k in keywords)
                and len(keywords) <= len(msg["args"]) and (names is None or not keywords)):
            return {"error": {"kind": "protocol", "message": "keywords must be names of the last arguments"}}
        self.map_cpu()
        arenas = Arenas(self.buffers)
        args = decode({"t": "seq", "kind": "list", "v": msg["args"]}, arenas, clone=False)
        split = len(args) - len(keywords)
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        versions = [t._version for t in inputs]
        input_end = dict(msg.get("input_end", {}))
        self.state.restore(int(msg.get("seed") or 0))
        if self.gpu:  # the call's own peak, for the parent's memory planner (budget/)
            torch.cuda.reset_peak_memory_stats()
        try:
            with torch.inference_mode(False):
                # by keyword where the parent named the arguments (an fi_trace entry point), else by position
                # and then the call's own keywords
                out = (fn(**dict(zip(names, args, strict=True))) if names is not None else
                       fn(*args[:split], **dict(zip(keywords, args[split:], strict=True))))
        except BaseException as e:  # noqa: BLE001 - SystemExit / KeyboardInterrupt from a reference too
            return _error(e, definition)
        finally:
            _pop_modes()
            torch.set_grad_enabled(True)
        mutated = [i for i, (t, v) in enumerate(zip(inputs, versions, strict=True)) if t._version != v]
        try:
            need = needed(out, input_end)
        except TypeError as e:
            return {"error": {"kind": "raised", "type": "TypeError", "message": f"run() returned {e}", "line": None}}
        if any(need.get(kind, 0) > self.buffers.get(kind, torch.empty(0)).numel() for kind in ("cpu", "cuda")):
            return {"need": need}
        arenas = Arenas(self.buffers, cursor=dict(input_end))
        try:
            encoded = encode(out, arenas)
        except Exception as e:  # noqa: BLE001 - an output that cannot be laid out is the reference's error
            return {"error": {"kind": "raised", "type": type(e).__name__, "message": f"run() returned {e}"[:2000],
                              "line": None}}
        if self.gpu:
            torch.cuda.synchronize()
            return {"ok": {"outputs": encoded, "mutated": mutated, "device_peak": torch.cuda.max_memory_reserved()}}
        return {"ok": {"outputs": encoded, "mutated": mutated}}

    def serve(self) -> None:
        gc.freeze()  # torch's objects are permanent: a collection after each call scans only what it made
        while True:
            msg = json.loads(self.conn.recv_bytes(MAX_MESSAGE))
            reply = self.handle(msg)
            if reply is None:
                return
            _send(self.conn, reply)
            gc.collect()  # finalizers of what the reference left (generators holding contexts) run now
            if self.gpu:  # what the reference allocated goes back to the GPU, not this process's cache
                with contextlib.suppress(RuntimeError):  # a memory courtesy: never the call's outcome
                    torch.cuda.empty_cache()


def main(conn, arena_fd: int, settings: dict) -> None:
    """The worker process's entry point, in a child of the fork server."""
    try:
        server = _Server(conn, arena_fd, settings)
        status = server.confinement.as_dict() | {"pid": os.getpid(), "device": server.device}
        if not server.confinement.complete and not settings.get("allow_unconfined"):
            _send(conn, {"refused": status})
            return
        _send(conn, {"ready": status})
        server.serve()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass
    except BaseException:  # noqa: BLE001 - the parent reads a crash from the closed pipe and this text
        try:
            _send(conn, {"error": {"kind": "worker", "message": traceback.format_exc()[-2000:]}})
        except OSError:
            pass
    finally:
        os._exit(0)
