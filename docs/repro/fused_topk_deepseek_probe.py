"""Standalone probe: flashinfer.fused_moe.fused_topk_deepseek around fused_topk_deepseek_e384_k1_fp16.

On an H200 with flashinfer-python 0.7.2.post1 the first call of that definition (384 experts, n_group 1,
topk_group 1, topk 1, float16 scores and bias, routed_scaling_factor 2.827) died with "CUDA error: an illegal
memory access was encountered". A reading of csrc/fused_moe/noAuxTcKernels.cu (0.6.0 .. 0.7.2.post1) suggests why:
with n_group 1 and more than 128 experts, three warps each write only `topk` of their 8 slots of a shared
intermediate top-k buffer, and one warp then reduces all 24 slots, the unwritten ones included (flashinfer PR 3224,
closed unmerged; PR 5165). A stale slot can win, and its index then reads shared memory out of range, or comes
back as a wrong expert. So the fault may depend on what earlier kernels left in shared memory. Before each call
the child runs a few torch kernels that use shared memory (`--no-dirty` skips them).

Grid: num_experts (256, 384) x topk (1, 8) x (n_group, topk_group) ((1, 1), (8, 4)) x scores dtype (float32,
bfloat16, float16). Some of these the API's own check rejects (n_group 1 takes topk 1 only, and 384 experts do not
fit 8 groups of <= 32). Each configuration runs in a fresh child process, because an illegal address poisons
the CUDA context. It prints one line: the exception text, or "ok" with the rows whose expert set differs from a
float64 torch routing (sigmoid + bias; group score = sum of the group's top-2; topk_group groups; topk experts)
beyond a near tie, ids outside [0, E), and the largest relative error of the weights (unbiased sigmoid of the
kernel's own ids, renormalised, times routed_scaling_factor).

Run on a GPU with a FlashInfer release installed (imports: torch, flashinfer, and the standard library only):
    python docs/repro/fused_topk_deepseek_probe.py [--tokens 256] [--reps 20] [--no-dirty]
One configuration alone (its RESULT line), e.g. under compute-sanitizer to name the faulting access:
    compute-sanitizer --tool memcheck python docs/repro/fused_topk_deepseek_probe.py --one 384,1,1,1,float16
"""
import itertools
import subprocess
import sys

SCALE = 2.827
GRID = list(itertools.product((256, 384), (1, 8), ((1, 1), (8, 4)), ("float32", "bfloat16", "float16")))
WEIGHT_TOL = {"float32": 1e-4, "bfloat16": 1.6e-2, "float16": 2e-3}  # relative, output rounding + float32 math
TIE = 1e-5  # biased-score gap below which two selections count as equally good (float32 sigmoid vs float64)


def reference(scores, bias, n_group, topk_group, topk):
    """float64 ids [T, topk] and biased/unbiased sigmoid scores of the documented grouped routing."""
    import torch

    s = torch.sigmoid(scores.double())
    biased = s + bias.double()[None, :]
    t, e = biased.shape
    grouped = biased.view(t, n_group, e // n_group)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros(t, n_group, dtype=torch.bool, device=scores.device)
    keep.scatter_(1, group_scores.topk(topk_group, dim=-1).indices, True)
    cand = grouped.masked_fill(~keep[:, :, None], float("-inf")).view(t, e)
    return cand.topk(topk, dim=-1).indices, s, biased


def dirty(dtype):
    """Leave non-zero data in shared memory: a sort, a softmax and a matmul on random data."""
    import torch

    x = torch.randn(1 << 20, device="cuda") * 1e4
    x.sort()
    torch.softmax(torch.randn(4096, 384, device="cuda", dtype=dtype) * 50, dim=-1)
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    (a @ a).sum()
    torch.cuda.synchronize()


def child(e, k, ng, kg, dtype_name, tokens, reps, make_dirty):
    import flashinfer
    import torch

    dtype = getattr(torch, dtype_name)
    fn = flashinfer.fused_moe.fused_topk_deepseek
    gen = torch.Generator(device="cuda").manual_seed(1234 + e + 10 * k + 100 * ng)
    bad_rows = bad_ids = 0
    worst = 0.0
    for _ in range(reps):
        scores = (torch.randn(tokens, e, device="cuda", generator=gen) * 2).to(dtype)
        bias = (torch.randn(e, device="cuda", generator=gen) * 0.05).to(dtype)
        values = torch.full((tokens, k), float("nan"), dtype=dtype, device="cuda")
        ids = torch.full((tokens, k), -7, dtype=torch.int32, device="cuda")
        if make_dirty:
            dirty(dtype)
        fn(scores, bias, ng, kg, k, SCALE, values, ids)
        torch.cuda.synchronize()
        ref_ids, s, biased = reference(scores, bias, ng, kg, k)
        got = ids.long()
        out_of_range = (got < 0) | (got >= e)
        bad_ids += int(out_of_range.any(dim=1).sum())
        got = got.clamp(0, e - 1)
        same = got.sort(dim=1).values.eq(ref_ids.sort(dim=1).values).all(dim=1)
        gap = (biased.gather(1, got).sort(dim=1).values - biased.gather(1, ref_ids).sort(dim=1).values).abs()
        tie = gap.max(dim=1).values <= TIE
        bad_rows += int((~same & ~tie | out_of_range.any(dim=1)).sum())
        w = s.gather(1, got)
        want = w / w.sum(dim=1, keepdim=True) * SCALE
        rel = ((values.double() - want).abs() / want.abs()).nan_to_num(float("inf"))
        kept = rel[~out_of_range.any(dim=1)]
        worst = max(worst, float(kept.max()) if kept.numel() else 0.0)
    verdict = "match" if bad_rows == 0 and worst <= WEIGHT_TOL[dtype_name] else "MISMATCH"
    return (f"ok, {verdict}: {bad_rows}/{tokens * reps} rows wrong experts, {bad_ids} rows ids out of range, "
            f"weights max rel err {worst:.2e} (tol {WEIGHT_TOL[dtype_name]:.0e})")


def main(argv):
    opts = {"--tokens": 256, "--reps": 20}
    for name in opts:
        if name in argv:
            opts[name] = int(argv[argv.index(name) + 1])
    make_dirty = "--no-dirty" not in argv
    if "--one" in argv:
        e, k, ng, kg, dtype_name = argv[argv.index("--one") + 1].split(",")
        try:
            line = child(int(e), int(k), int(ng), int(kg), dtype_name, opts["--tokens"], opts["--reps"], make_dirty)
        except Exception as exc:  # the API's ValueError, a TVM-FFI check, or a CUDA fault
            line = f"raised {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        print("RESULT " + line, flush=True)
        return 0
    import flashinfer
    import torch

    print(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()} "
          f"(sm{''.join(map(str, torch.cuda.get_device_capability()))}); tokens {opts['--tokens']}, "
          f"reps {opts['--reps']}, dirty {make_dirty}", flush=True)
    for e, k, (ng, kg), dtype_name in GRID:
        spec = f"{e},{k},{ng},{kg},{dtype_name}"
        cmd = [sys.executable, __file__, "--one", spec, "--tokens", str(opts["--tokens"]),
               "--reps", str(opts["--reps"])] + (["--no-dirty"] if not make_dirty else [])
        try:  # the first child JIT-compiles the module when no prebuilt cache is installed
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
            found = [ln[7:] for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            tail = (done.stderr.strip().splitlines() or [""])[-1]
            line = found[0] if found else f"child died rc={done.returncode}: {tail}"
        except subprocess.TimeoutExpired:
            line = "child timed out"
        print(f"E={e:3d} topk={k} n_group={ng} topk_group={kg} {dtype_name:8s}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
