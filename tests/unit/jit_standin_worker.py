"""A stand-in for the JIT prebuild worker (JitConfig.worker_command): the same protocol as jit/worker.py (jobs on
stdin, one JSON answer a line on the fd it is given), but a job's "build" is a sleep. Its plan (argv[1], JSON):
definition -> {"seconds": S, "status": "built" | "build-failed" | ..., "until": [FILE, TEXT] (optional: the
build ends once FILE holds TEXT, at most S seconds; "then": T seconds after that; "retire": why its CUDA context
broke, after which it answers and ends)}, and "_timeline": a file where
each job's start, end and CPU priority are appended."""

from __future__ import annotations

import json
import os
import sys
import time

NICE = 10


def _holds(until) -> bool:
    if not until:
        return False
    try:
        with open(until[0]) as f:
            return until[1] in f.read()
    except OSError:
        return False


def main(plan_file: str, answer_fd: int) -> int:
    plan = json.loads(open(plan_file).read())
    out = os.fdopen(answer_fd, "wb", buffering=0)
    for line in sys.stdin:
        request = json.loads(line)
        job = request["job"]
        if request.get("low_priority") and os.getpriority(os.PRIO_PROCESS, 0) < NICE:
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
        spec = plan.get(job["definition"], {})
        start = time.time()
        deadline = start + float(spec.get("seconds", 0.1))
        while time.time() < deadline and not _holds(spec.get("until")):
            time.sleep(0.05)
        if spec.get("until") and time.time() < deadline:
            time.sleep(float(spec.get("then", 0)))
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        with open(plan["_timeline"], "a") as f:
            f.write(json.dumps({"definition": job["definition"], "start": start, "end": time.time(),
                                "nice": nice, "pid": os.getpid()}) + "\n")
        status = spec.get("status", "built")
        answer = {"definition": job["definition"], "source": job["source"], "api": job["api"],
                  "op_type": job["op_type"], "status": status, "modules": [job["definition"]] if status == "built"
                  else [], "message": spec.get("message"), "uses": [], "libraries": {}, "nice": nice,
                  "retire": spec.get("retire")}
        out.write((json.dumps(answer) + "\n").encode())
        if spec.get("retire"):  # a broken CUDA context (worker.broken_context): this process ends here
            return 0
    return 0


if __name__ == "__main__":
    # argv: PLAN --worker FD DEVICE (the scheduler appends the last three)
    sys.exit(main(sys.argv[1], int(sys.argv[3])))
