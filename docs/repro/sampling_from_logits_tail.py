"""Standalone probe: does FlashInfer's sampling_from_logits draw the softmax of the logits, token ranks far down too?

The sixth GPU run (docs/evidence/device-memory.md, "The sixth run") failed sampling_from_logits_v128256 and
_v151936_bf16 on every FlashInfer path of 0.6.6 and 0.7.2.post1: over 350k draws a row, the share of draws below the
16,384 most likely tokens was off (p down to 1e-106), while float64 torch.multinomial passed the same test on the same
rows. Here: Zipf rows over a random permutation of a 128,256-token vocabulary (exponents 0.8, 1.2, 2.0; logits = log p
in float32), drawn by

  flashinfer   sampling_from_logits (FlashInfer's Gumbel-max kernel)
  probs        sampling_from_probs on the float32 softmax of the same row (FlashInfer's inverse-CDF kernel)
  multinomial  torch.multinomial on the float64 softmax (a control)
  emulated     argmax(logits + g) in torch, g made as FlashInfer's sampling.cuh makes it: a float32 uniform of
               cuRAND's form (x * 2**-32 + 2**-33, x a 32-bit integer), scaled by 1 - 2**-23, g = -ln2 * log2(-log2(u))

and for each, the share of draws in bands of descending-probability rank against the float64 probability of the band,
as a z-score (|z| > 5: the sampler does not draw that distribution).

Run on a GPU with the release to test installed: python docs/repro/sampling_from_logits_tail.py
"""
import math
import sys

VOCAB = 128256
DRAWS = 1 << 18  # per row
BATCH = 1024
BANDS = [(0, 1), (1, 16), (16, 256), (256, 4096), (4096, 16384), (16384, VOCAB)]


def row(exponent: float, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    p = torch.arange(1, VOCAB + 1, dtype=torch.float64) ** -exponent
    p = (p / p.sum())[torch.randperm(VOCAB, generator=g)]
    return p.log().to(torch.float32)


def draws(name: str, logits, n: int):
    import flashinfer
    import torch

    out = []
    for _ in range(n // BATCH):
        rows = logits.expand(BATCH, -1).contiguous()
        if name == "flashinfer":
            out.append(flashinfer.sampling.sampling_from_logits(rows))
        elif name == "probs":
            out.append(flashinfer.sampling.sampling_from_probs(torch.softmax(rows, dim=-1)))
        elif name == "multinomial":
            out.append(torch.multinomial(torch.softmax(rows.double(), dim=-1), 1).squeeze(1))
        else:
            x = torch.randint(0, 1 << 32, rows.shape, device=rows.device, dtype=torch.int64)
            u = x.to(torch.float32) * 2.0 ** -32 + 2.0 ** -33
            g = -0.6931471806 * torch.log2(-torch.log2(u * (1.0 - 2.0 ** -23)))
            out.append((rows + g).argmax(dim=-1))
    return torch.cat(out).long()


def main():
    import flashinfer
    import torch

    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
    for exponent, seed in ((0.8, 1), (1.2, 2), (2.0, 3)):
        logits = row(exponent, seed).cuda()
        p = torch.softmax(logits.double(), dim=-1)
        rank = torch.empty_like(p, dtype=torch.long)
        rank[p.argsort(descending=True)] = torch.arange(VOCAB, device=p.device)
        expected = [float(p[(rank >= a) & (rank < b)].sum()) for a, b in BANDS]
        print(f"\nZipf exponent {exponent}: band probabilities " + "  ".join(
            f"[{a},{b}) {e:.4g}" for (a, b), e in zip(BANDS, expected)))
        for name in ("multinomial", "flashinfer", "probs", "emulated"):
            r = rank[draws(name, logits, DRAWS)]
            cells = []
            for (a, b), e in zip(BANDS, expected):
                share = float(((r >= a) & (r < b)).double().mean())
                z = (share - e) / math.sqrt(max(e * (1 - e), 1e-300) / DRAWS)
                cells.append(f"{share:.4g} (z {z:+.1f})")
            print(f"  {name:11s} " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    sys.exit(main())
