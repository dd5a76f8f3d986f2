"""Standalone reproduction: fp8_blockscale_gemm_sm90 accepts per-token weight scales and reads them as per-block.

flashinfer.gemm.fp8_blockscale_gemm_sm90 documents two weight-scale granularities, per-token (1x128 blocks,
[N, K/128]) and per-block (128x128 blocks, [ceil(N/128), K/128]), and its Python and C++ checks accept both shapes.
The W8A8 runner it calls (fp8_gemm_run in csrc/nv_internal/.../fp8_blockscale_gemm) is given the scale pointer
only, no granularity, and reads it as 128x128 blocks: row n // 128 of a per-token grid, which is the scale of weight
row n // 128, not of row n.

The script makes fp8 input and weight (K = 256, N = 384, M = 16 and 64, the swapAB and the normal kernel) with a
different scale for each 128-row block of the weight, and calls the API twice with the same values: the block grid,
and the same scales spread to one row per weight row (row n carries its block's scale, so the product is the same).
It prints each call's largest error against a float64 block-dequantised product.

Run on an sm90 GPU with FlashInfer >= 0.6.0 installed (imports: torch and flashinfer only):
    python docs/repro/fp8_blockscale_per_token.py
"""
import flashinfer
import torch

K, N, BLOCK = 256, 384, 128


def main():
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    print(f"flashinfer {flashinfer.__version__} torch {torch.__version__} {torch.cuda.get_device_name()}")
    for m in (16, 64):
        a = (torch.randn(m, K, generator=g, device=dev) * 4).to(torch.float8_e4m3fn)
        w = (torch.randn(N, K, generator=g, device=dev) * 4).to(torch.float8_e4m3fn)
        sa = torch.rand(m, K // BLOCK, generator=g, device=dev) + 0.5
        sw = 2.0 ** torch.arange(N // BLOCK * (K // BLOCK), device=dev, dtype=torch.float32).reshape(N // BLOCK, -1)
        # the input scale as the kernel reads it: M-major [K/128, M], M padded to 4 (FlashInfer's own test does so)
        sa_mm = torch.zeros(K // BLOCK, -(-m // 4) * 4, device=dev)[:, :m]
        sa_mm.copy_(sa.t())
        ad = a.double() * sa.double().repeat_interleave(BLOCK, 1)
        wd = w.double() * sw.double().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        want = ad @ wd.t()
        per_token = sw.repeat_interleave(BLOCK, 0).contiguous()  # [N, K/128], row n = its block's scale
        for name, scale in (("per-block [N/128, K/128]", sw), ("per-token [N, K/128]", per_token)):
            out = flashinfer.gemm.fp8_blockscale_gemm_sm90(a, w, sa_mm, scale)
            torch.cuda.synchronize()
            err = (out.double() - want).abs()
            rel = float(err.max() / want.abs().max())
            cols = [float(err[:, i * BLOCK:(i + 1) * BLOCK].max() / want.abs().max()) for i in range(N // BLOCK)]
            print(f"M {m:3d} {name:26s} max error / max |out| {rel:.3g}; per 128-column block "
                  + " ".join(f"{c:.3g}" for c in cols))


if __name__ == "__main__":
    main()
