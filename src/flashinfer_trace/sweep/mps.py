"""CUDA MPS for a GPU session: the test processes' kernels share the GPU instead of taking turns.

A GPU session runs `jobs` pytest processes, each with a confined reference worker: 16 CUDA contexts
on one GPU. Without MPS the GPU time-slices between contexts, and every small kernel or
synchronisation of one process waits for the others' slices (what MPS saved: docs/evidence/sessions.md).

It is opt-in (`--mps`): under MPS a fatal fault of one client (a kernel's illegal address) is delivered to every
client on the GPU, and the server takes no new client until all of them have exited. One faulting kernel then
fails every case running beside it and every process that starts meanwhile, none of them its doing
(docs/evidence/device-memory.md, "The seventh run"). Without MPS a fault stays in the process that made it, which
ends after that case (pytest_plugin.release_cuda_cache). `--mps` suits a run whose kernels are known not to fault.

The nox session starts a daemon of its own (`nvidia-cuda-mps-control -d`) with private pipe and
log directories, exports them to the session process it starts (and so to every test process and
reference worker), and quits it once that process has exited: no other process on the machine
connects to it. (Quitting waits for the daemon's clients to finish, so the session
process, itself a client, must not be the one that asks.) The state travels to the session
in FLASHINFER_TRACE_MPS, which records it in session.json. An MPS daemon the user already
runs (CUDA_MPS_PIPE_DIRECTORY set) is used as it is; so is the one the host runner starts for the
sessions that share a GPU (sweep/host.py: one daemon per GPU, owned by the runner, quit after its last
session). Where none can be started (no control binary, no permission, a GPU in a compute mode that
refuses it) the session runs without, and says why:

    with mps.session(enabled=True) as state:   # state: {"used": bool, "own": bool, "reason": str | None}
        subprocess.run([...session...])         # a child: it has exited before the daemon quits
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
STATE_ENV = "FLASHINFER_TRACE_MPS"
OWNER_ENV = "FLASHINFER_TRACE_MPS_OWNER"  # who started the daemon a session finds (the host runner says so)
START_TIMEOUT_S = 20


def _control(args: list[str], env: dict[str, str], stdin: str | None = None) -> tuple[int, str]:
    try:
        p = subprocess.run([CONTROL, *args], input=stdin, capture_output=True, text=True, env=env,
                           timeout=START_TIMEOUT_S, **({"stdin": subprocess.DEVNULL} if stdin is None else {}))
    except (OSError, subprocess.TimeoutExpired) as e:
        return 1, f"{type(e).__name__}: {e}"
    return p.returncode, (p.stdout + p.stderr).strip()


def start(root: Path | None = None, environ: dict[str, str] | None = None) -> tuple[dict, dict[str, str]]:
    """(state, environment for the processes that should use it); the state says why when unused. `environ`: the
    environment the daemon starts in (default this process's; its CUDA_VISIBLE_DEVICES are the daemon's GPUs)."""
    environ = dict(os.environ if environ is None else environ)
    if environ.get(PIPE_ENV):
        return {"used": True, "own": False,
                "reason": environ.get(OWNER_ENV) or f"the user's daemon ({PIPE_ENV} is set)"}, {}
    if shutil.which(CONTROL) is None:
        return {"used": False, "own": False, "reason": f"{CONTROL} not found"}, {}
    base = Path(tempfile.mkdtemp(prefix="flashinfer-trace-mps-", dir=root))
    env = {PIPE_ENV: str(base / "pipe"), LOG_ENV: str(base / "log")}
    for d in env.values():
        Path(d).mkdir()
    rc, out = _control(["-d"], dict(environ, **env))
    if rc != 0:
        shutil.rmtree(base, ignore_errors=True)
        return {"used": False, "own": False, "reason": f"{CONTROL} -d failed ({rc}): {out[-300:]}"}, {}
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible:  # the daemon sees only these GPUs, numbered from 0: its clients name them so (a client left with
        # CUDA_VISIBLE_DEVICES=1 under a daemon started with it saw no GPU at all: H200, 2026-11-28)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(visible.split(","))))
    return {"used": True, "own": True, "reason": None, "dir": str(base)}, env


def stop(state: dict, env: dict[str, str], environ: dict[str, str] | None = None) -> None:
    if not state.get("own"):
        return
    rc, out = _control([], dict(os.environ if environ is None else environ, **env), stdin="quit\n")
    if rc != 0:
        state["stop_error"] = out[-300:]
    shutil.rmtree(state["dir"], ignore_errors=True)


@contextmanager
def session(enabled: bool = True) -> Iterator[dict]:
    """MPS for everything started inside (this process's environment included), stopped after."""
    if enabled:
        state, env = start()
    else:
        state, env = {"used": False, "own": False, "reason": "off (the default; --mps turns it on)"}, {}
    env = {**env, STATE_ENV: json.dumps(state)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield state
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        stop(state, env)


def recorded() -> dict | None:
    """The state the nox session passed down (None: not started through nox, or not a GPU session)."""
    from .passdown import read

    return read(STATE_ENV)
