#!/usr/bin/env python3
"""Import the SGLang modules the ground truths use, each in a fresh interpreter, and say per module
whether it imports, which of the names the adapters call it has, or the exception and the import
chain that raised it (scripts/node-steps.sh sgl-install / sgl-probe, on the GPU node).

    python3 scripts/sgl-probe.py [--versions] [--json FILE] [--timeout S] [module[:name,name] ...]

With no modules: the Triton attention, the Triton fused MoE entry and the types it needs, the RoPE
JIT kernel, sgl_kernel's operators, FlashInfer's sampler, and cuda.bindings (needed by
flashinfer.comm, which sglang.srt.layers.moe.fused_moe_triton imports). Paths are those of sglang
0.5.16 / 0.5.17 (the RoPE kernel moved from sglang.jit_kernel.rope to sglang.kernels.ops.attention.rope
in 0.5.17). Standard library only: it runs before anything else is known to import.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

TARGETS = (
    "sglang.kernels.ops.attention.decode_attention:decode_attention_fwd",
    "sglang.kernels.ops.attention.extend_attention:extend_attention_fwd",
    "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:fused_experts",
    "sglang.srt.layers.moe.topk:StandardTopKOutput",
    "sglang.srt.layers.moe.moe_runner:MoeRunnerConfig",
    "sglang.srt.server_args:ServerArgs,set_global_server_args_for_scheduler,get_global_server_args",
    "sglang.srt.layers.moe.fused_moe_triton:fused_experts",
    "sglang.jit_kernel.rope:apply_rope_with_cos_sin_cache_inplace",
    "sglang.kernels.ops.attention.rope:apply_rope_with_cos_sin_cache_inplace",
    "sgl_kernel:rmsnorm,fused_add_rmsnorm,silu_and_mul,apply_rope_with_cos_sin_cache_inplace,"
    "top_k_top_p_sampling_from_probs,moe_sum_reduce,sgl_per_token_group_quant_fp8",
    "flashinfer.sampling:top_k_top_p_sampling_from_probs",
    "cuda.bindings.driver",
)
DISTRIBUTIONS = ("torch", "triton", "sglang", "sglang-kernel", "flashinfer-python", "apache-tvm-ffi", "transformers",
                 "xgrammar", "torchvision", "cuda-bindings", "nvidia-cutlass-dsl")

# runs in the child: one module, its names, or the exception with the chain of frames that raised it
CHILD = r"""
import importlib, json, sys, time, traceback
name, attrs = sys.argv[1], [a for a in sys.argv[2].split(",") if a]
t = time.time()
try:
    mod = importlib.import_module(name)
    res = {"ok": True, "names": {a: hasattr(mod, a) for a in attrs}, "file": getattr(mod, "__file__", None)}
except BaseException as e:
    frames = [f"{f.filename.rsplit('site-packages/', 1)[-1].rsplit('/tmp/sgl/', 1)[-1]}:{f.lineno}"
              for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
    res = {"ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}",
           "via": list(reversed(frames))[:8]}
res["seconds"] = round(time.time() - t, 2)
print("SGLPROBE " + json.dumps(res))
"""


def probe(target: str, timeout: float) -> dict:
    name, _, attrs = target.partition(":")
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, name, attrs], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"module": name, "ok": False, "error": f"timed out after {timeout:.0f} s", "via": []}
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("SGLPROBE ")), None)
    if line is None:  # the interpreter died (a crash in a native library, not an exception)
        tail = " ".join((r.stderr or r.stdout).split())[-400:]
        return {"module": name, "ok": False, "error": f"exit {r.returncode}: {tail}", "via": []}
    return {"module": name, **json.loads(line[len("SGLPROBE "):])}


def versions() -> dict:
    from importlib import metadata

    found = {}
    for d in DISTRIBUTIONS:
        try:
            found[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            found[d] = None
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*", help="module or module:name,name (default: the ground truths' modules)")
    ap.add_argument("--versions", action="store_true", help="print the installed versions first")
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per module")
    args = ap.parse_args(argv)
    found = versions()
    if args.versions:
        print("versions: " + ", ".join(f"{k} {v}" for k, v in found.items() if v) +
              "; absent: " + (", ".join(k for k, v in found.items() if not v) or "none"))
    results, start = [], time.time()
    for target in args.targets or TARGETS:
        res = probe(target, args.timeout)
        results.append(res)
        if res["ok"]:
            missing = [a for a, present in res["names"].items() if not present]
            names = f"; missing names: {', '.join(missing)}" if missing else ""
            print(f"ok   {res['module']} ({res['seconds']} s){names}", flush=True)
        else:
            print(f"FAIL {res['module']}: {res['error']}", flush=True)
            if res.get("via"):
                print(f"       via {' <- '.join(res['via'])}", flush=True)
    print(f"{sum(r['ok'] for r in results)} of {len(results)} modules import ({time.time() - start:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": found, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
