"""The fork server: a process that has imported torch once and forks a fresh worker per request.

Started by the parent (`pool.py`) with a scrubbed environment and one end of a socketpair; it is
single-threaded (so fork is safe) and never runs definition code itself. Requests, JSON with file
descriptors attached (SCM_RIGHTS):

    {"op": "spawn", "config": {...}}  + [worker's pipe end, arena memfd]  ->  {"pid": N}
    {"op": "wait", "pid": N}          ->  {"status": exit code, negative for a signal}

It exits when the parent's end closes; its workers die with it (PR_SET_PDEATHSIG, set in each).
Unlike multiprocessing's fork server it never imports the parent's `__main__` into a worker.
"""

from __future__ import annotations

import json
import os
import socket

MAX_REQUEST = 1 << 16


def _serve(ctl: socket.socket) -> None:
    from multiprocessing.connection import Connection

    from . import worker  # imports torch: every worker forked below starts with it loaded

    ctl.sendall(json.dumps({"ready": os.getpid()}).encode())
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctl, MAX_REQUEST, 4)
        except OSError:
            return
        if not data:
            return
        request = json.loads(data)
        if request["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                ctl.close()
                try:
                    worker.main(Connection(fds[0]), fds[1], request["config"])
                finally:
                    os._exit(0)
            for fd in fds:
                os.close(fd)
            ctl.sendall(json.dumps({"pid": pid}).encode())
        elif request["op"] == "wait":
            try:
                _, status = os.waitpid(int(request["pid"]), 0)
                code = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                code = None
            ctl.sendall(json.dumps({"status": code}).encode())


def main(fd: int) -> None:
    """Entry point: `python -I -c "import sys, json; sys.path[:] = json.loads(sys.argv[1]); from
    flashinfer_trace.sandbox.zygote import main; main(int(sys.argv[2]))" SYS_PATH FD` (the parent's
    sys.path is set before anything is imported, so the current directory cannot shadow a module)."""
    ctl = socket.socket(fileno=fd)
    try:
        _serve(ctl)
    finally:
        os._exit(0)
