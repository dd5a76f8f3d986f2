"""Standalone reproduction: a CUDA graph of POD attention computes on its first replay only.

flashinfer.pod.PODWithPagedKVCacheWrapper.run launches one kernel that hands its thread blocks out through
counters in a `static int* tbAssign` buffer (include/flashinfer/attention/pod.cuh), reset by a host-side
`cudaMemset` before each launch. A captured graph holds the kernel, not that reset: the first replay starts from
the counters the capture left at zero; every later replay finds them at their totals, each block's id past its
op's range, and every block returns at once. The outputs keep what the previous replay wrote.

The script plans one POD batch (a causal prefill of 64 queries over 96 keys, a decode batch of 8 requests with
pages of 16), runs it eagerly, captures run() in a graph, then puts new random data into the same input tensors
three times, replays, and compares each replay with an eager run on the same data, and with the previous replay's
output. Expected from the source: replay 1 equal to eager, replays 2 and 3 equal to the previous replay's output
and far from eager.

Run on a GPU with a FlashInfer release installed (imports: torch and flashinfer only):
    python docs/repro/pod_graph_replay.py [--dtype float16|bfloat16]
"""
import argparse

import flashinfer
import torch

H, KV, D, PAGE = 32, 32, 128, 16
QO, KVLEN, BATCH, DECODE_KV = 64, 96, 8, 40


def fill(tensors, gen):
    for t in tensors:
        t.copy_(torch.randn(t.shape, generator=gen, device="cuda").to(t.dtype))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    dtype = getattr(torch, p.parse_args().dtype)
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    pages_per = -(-DECODE_KV // PAGE)
    q_p = torch.empty(QO, H, D, dtype=dtype, device=dev)
    k_p = torch.empty(KVLEN, KV, D, dtype=dtype, device=dev)
    v_p = torch.empty(KVLEN, KV, D, dtype=dtype, device=dev)
    q_d = torch.empty(BATCH, H, D, dtype=dtype, device=dev)
    kc = torch.empty(BATCH * pages_per, PAGE, KV, D, dtype=dtype, device=dev)
    vc = torch.empty_like(kc)
    data = (q_p, k_p, v_p, q_d, kc, vc)
    fill(data, gen)
    indptr = torch.arange(0, BATCH * pages_per + 1, pages_per, dtype=torch.int32, device=dev)
    indices = torch.arange(BATCH * pages_per, dtype=torch.int32, device=dev)
    last = torch.full((BATCH,), DECODE_KV - (pages_per - 1) * PAGE, dtype=torch.int32, device=dev)
    w = flashinfer.pod.PODWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD")
    w.plan(indptr, indices, last, H, KV, D, PAGE, q_data_type=dtype, kv_data_type=dtype)

    def launch():
        return w.run(q_p, k_p, v_p, q_d, (kc, vc), causal_p=True)

    print(f"flashinfer {flashinfer.__version__} torch {torch.__version__} {torch.cuda.get_device_name()} {dtype}")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = launch()
    previous = None
    for replay in (1, 2, 3):
        fill(data, gen)
        graph.replay()
        got = [t.clone() for t in captured]
        eager = [t.clone() for t in launch()]  # the same data, run eagerly (resets the counters itself)
        torch.cuda.synchronize()
        err = [float((g.float() - e.float()).abs().max()) for g, e in zip(got, eager)]
        stale = "" if previous is None else \
            "  equal to the previous replay: " + ", ".join(str(bool(torch.equal(g, q))) for g, q in zip(got, previous))
        print(f"replay {replay}: max |replay - eager| prefill {err[0]:.4g} decode {err[1]:.4g}{stale}")
        previous = got


if __name__ == "__main__":
    main()
