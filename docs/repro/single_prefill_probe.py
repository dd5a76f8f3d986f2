"""Standalone probe: FlashInfer's single_prefill_with_kv_cache, causal, bf16, over backends, layouts and head shapes.

The fifth GPU run (docs/evidence/device-memory.md, "The fifth run") saw the process die with SIGFPE on every call of
single_prefill_causal_h16_kv2_d256's plain path (fa2, NHD) and wrong outputs on its fa3 + HND path, while fa2 + HND
and fa3 + NHD passed; the JIT warm-up of h16_kv2_d256 and of h8_kv1_d128 died with SIGFPE too. A SIGFPE is a host-side
integer division by zero, so each call runs in a child process here: a signal is reported, not inherited. For each
call that returns, the largest difference from a float64 causal attention (bottom-right aligned: query i sees keys
j <= i + kv_len - qo_len) is printed; bf16 output is within about 1e-2 of it.

Run on a GPU with the release to test installed: python docs/repro/single_prefill_probe.py
"""
import itertools
import multiprocessing as mp
import sys

SHAPES = [(16, 2, 256), (8, 1, 128), (32, 8, 128)]  # (query heads, kv heads, head dim)
LENGTHS = [(1, 1), (1, 37), (7, 33), (128, 128), (64, 1000)]  # (qo_len, kv_len)


def truth(q, k, v):
    import torch

    qo, heads, dim = q.shape
    kv = k.shape[0]
    group = heads // k.shape[1]
    q64, k64, v64 = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q64, k64) / dim ** 0.5
    seen = torch.arange(kv)[None, :] <= (torch.arange(qo)[:, None] + kv - qo)
    scores = scores.masked_fill(~seen.to(scores.device), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v64)


def one(args, out):
    import flashinfer
    import torch

    (heads, kv_heads, dim), (qo, kv), backend, layout = args
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(qo, heads, dim, device="cuda", generator=g).bfloat16()
    k = torch.randn(kv, kv_heads, dim, device="cuda", generator=g).bfloat16()
    v = torch.randn(kv, kv_heads, dim, device="cuda", generator=g).bfloat16()
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    o = flashinfer.prefill.single_prefill_with_kv_cache(q, kk, vv, causal=True, kv_layout=layout, backend=backend)
    torch.cuda.synchronize()
    out.put(float((o.double() - truth(q, k, v)).abs().max()))


def main():
    import flashinfer
    import torch

    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
    ctx = mp.get_context("spawn")
    for shape, lengths, backend, layout in itertools.product(SHAPES, LENGTHS, ("fa2", "fa3"), ("NHD", "HND")):
        out = ctx.Queue()
        p = ctx.Process(target=one, args=((shape, lengths, backend, layout), out))
        p.start()
        p.join(600)
        if p.exitcode is None:
            p.kill()
            what = "timeout"
        elif p.exitcode < 0:
            what = f"died with signal {-p.exitcode}"
        elif p.exitcode:
            what = f"raised (exit {p.exitcode})"
        else:
            err = out.get()
            what = f"max |output - float64| {err:.3g}" + ("" if err < 5e-2 else "  <-- wrong")
        print(f"h{shape[0]} kv{shape[1]} d{shape[2]} qo {lengths[0]:4d} kv {lengths[1]:4d} {backend} {layout}: {what}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
