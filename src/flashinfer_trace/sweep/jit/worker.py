"""The prebuild worker, a child process (`python -m flashinfer_trace.sweep.jit.worker --worker FD DEVICE`): it
reads jobs on stdin, makes each job's warm-up call of the ground truth so that its JIT modules get built, and
answers with what the call built and loaded. Compiler output goes to the job's log; a failure is told apart as a
build failure or a kernel error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

from .cache import cache_roots, libraries, loaded_libraries, new_modules

__all__ = ["BUILD_FRAMES", "NICE", "is_build_failure", "worker_main"]

NICE = 10  # the CPU priority of a long job (scheduler.py): the short builds, which comparisons wait for, get the cores


BUILD_FRAMES = (f"{os.sep}flashinfer{os.sep}jit{os.sep}", "cpp_extension", f"{os.sep}triton{os.sep}compiler")


def is_build_failure(exc: BaseException) -> bool:
    """Whether an exception came out of a JIT build (a frame of FlashInfer's jit package, torch's
    cpp_extension or Triton's compiler, or a compiler process), as opposed to a kernel's own error."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, subprocess.CalledProcessError) or "ninja" in str(e).lower():
            return True
        for frame in traceback.extract_tb(e.__traceback__):
            if any(mark in frame.filename for mark in BUILD_FRAMES):
                return True
        e = e.__cause__ or e.__context__
    return False


def _warm(job: dict, device: str) -> tuple[str, str | None]:
    from ...groundtruth import GroundTruthUnavailable

    try:
        from ...dataset import load_definition, load_path
        from ...groundtruth import get_ground_truth
        from ...inputs import generate_inputs

        d = load_path(job["path"]) if Path(job["path"]).is_file() else load_definition(job["definition"])
        gt = get_ground_truth(job["source"], d, device=device, prebuild=None)
        inputs = generate_inputs(d, "small", 0, device=device)
        gt(inputs)
        _warm_other_paths(job["source"], d, device, inputs)
        import torch

        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except GroundTruthUnavailable as e:
        return "error", f"unavailable while building: {e}"
    except Exception as e:  # noqa: BLE001 - every failure is a record
        text = " ".join(f"{type(e).__name__}: {e}".split())[:2000]
        return ("build-failed" if is_build_failure(e) else "error"), text
    return "ok", None


def _warm_other_paths(source: str, d, device: str, inputs) -> None:
    """The source's other paths that build modules of their own (tensor-core decode, fa3), so their tests do
    not compile; best effort: what fails here fails again in its test, which records it. Call modes of the
    same kernel (plan reuse, CUDA graphs) build nothing new."""
    from ...groundtruth import get_ground_truth, modes, paths, split_path

    for path in paths(source, d):
        if path is None or split_path(path)[1] in modes.GENERIC:
            continue
        try:
            get_ground_truth(source, d, device=device, prebuild=None, path=path)(inputs)
        except Exception:  # noqa: BLE001,S112 - recorded by the path's own tests
            continue


def broken_context(device: str) -> str | None:
    """Why this process's CUDA context cannot be trusted any more (a warm-up's kernel left a sticky error: an
    illegal address, a launch failure), else None. Every later job of the process would fail with that error,
    none of it theirs, so the worker answers this job and ends (`retire`); the scheduler starts a new one."""
    torch = sys.modules.get("torch")
    if not device.startswith("cuda") or torch is None or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - whatever CUDA raises here is the broken context's
        return " ".join(f"{type(e).__name__}: {e}".split())[:300]
    return None


def worker_main(answer_fd: int, device: str) -> int:
    out = os.fdopen(answer_fd, "wb", buffering=0)
    roots = None
    for line in sys.stdin:
        request = json.loads(line)
        job = request["job"]
        if request.get("low_priority") and os.getpriority(os.PRIO_PROCESS, 0) < NICE:
            # a long build takes the cores the short ones leave: on the H100 paged decode took 245 s to build
            # beside the fp8 MoE module and a hundred other compilers, 13 s alone. Its compilers inherit it;
            # the scheduler retires this worker after the job (a process cannot raise its priority again).
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)  # the compiler's output goes to the job's log: ninja inherits these
        os.dup2(log, 2)
        os.close(log)
        if roots is None:
            try:
                import flashinfer  # noqa: F401 - where its JIT cache is, before the first job
            except Exception:  # noqa: BLE001
                pass
            roots = cache_roots()
            if device.startswith("cuda"):  # its small warm-up cases are its standing lease of the device's budget
                from ...budget import device_budget

                device_budget(device).standing()
        before = libraries(roots)
        status, message = _warm(job, device)
        used = loaded_libraries(roots)
        modules = new_modules(before, used)
        if status == "ok":
            status = "built" if modules else "cached"
        broken = broken_context(device)
        answer = {"definition": job["definition"], "source": job["source"], "api": job["api"],
                  "op_type": job["op_type"], "status": status, "modules": modules, "message": message,
                  "uses": sorted(Path(p).stem for p in used), "libraries": used,
                  "nice": os.getpriority(os.PRIO_PROCESS, 0), "retire": broken}
        out.write((json.dumps(answer) + "\n").encode())
        if broken:
            return 0
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        sys.exit(worker_main(int(sys.argv[2]), sys.argv[3]))
    sys.exit("usage: python -m flashinfer_trace.sweep.jit.worker --worker FD DEVICE (the CLI is "
             "`flashinfer-trace jit build`)")
