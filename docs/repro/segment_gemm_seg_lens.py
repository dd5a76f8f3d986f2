"""Standalone reproduction: SegmentGEMMWrapper.run(seg_lens=) rounds a segment length through x's dtype.

`run` turns `seg_lens` into offsets with `get_indptr(seg_lens.to(x))` (flashinfer/gemm/gemm_base.py, 0.5.3 ..
0.7.2.post1): the int64 lengths are cast to the activations' dtype first, so a length float16 cannot hold (past
2048) or bfloat16 cannot (past 256) is rounded. Two segments of 5 and 2049 rows, float16: with `seg_lens` the second
segment's offsets come out one row short (its last row stays 0), with `seg_indptr` they are right.

Run on a GPU with a FlashInfer release installed (imports: torch and flashinfer only):
    python docs/repro/segment_gemm_seg_lens.py
"""
import flashinfer
import torch

K, N, LENS = 64, 32, (5, 2049)


def main():
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    rows = sum(LENS)
    x = torch.randn(rows, K, generator=g, device=dev).half()
    w = (torch.randn(len(LENS), K, N, generator=g, device=dev) / K ** 0.5).half()  # row-major [W, K, N]
    lens = torch.tensor(LENS, dtype=torch.int64, device=dev)
    indptr = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
    want = torch.cat([x[indptr[i]:indptr[i + 1]].double() @ w[i].double() for i in range(len(LENS))])
    seg = flashinfer.SegmentGEMMWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev))
    print(f"flashinfer {flashinfer.__version__} torch {torch.__version__} {torch.cuda.get_device_name()}")
    print(f"seg_lens {list(LENS)} as float16: {lens.to(x).tolist()}")
    for name, kw in (("seg_indptr", dict(seg_indptr=indptr)), ("seg_lens", dict(seg_lens=lens))):
        out = seg.run(x, w, len(LENS), False, **kw)
        torch.cuda.synchronize()
        err = (out.double() - want).abs().max(dim=1).values
        bad = torch.nonzero(err > 0.05).flatten().tolist()
        print(f"{name:10s} rows off by > 0.05: {len(bad)}" + (f" (rows {bad[0]} .. {bad[-1]})" if bad else ""))


if __name__ == "__main__":
    main()
