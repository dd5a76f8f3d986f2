"""Standalone reproduction: chain_speculative_sampling's accepted count tests the rejected draft token twice.

The documented `output_accepted_token_num` counts the draft tokens that would be accepted "if each token is
considered independently" of the chain's stop. With one draft token accepted with probability a = target / draft,
that count is 1 with probability a. The kernel (include/flashinfer/sampling.cuh, ChainSpeculativeSampling,
0.2.3 .. 0.7.2.post1) counts from the stop on with a fresh uniform, `for (i = pos; i < n; ++i)`, so a rejected
token gets a second test: 1 with probability a + (1 - a) a = a (2 - a).

One draft token over a vocabulary of 2 (draft [1/2, 1/2] drawing token 0, target [a/2, 1 - a/2]), 200,000 requests
in one call, for a in 0.25, 0.5, 0.75: the share of accepted counts of 1 against a and a (2 - a), with its binomial
standard error, and the emitted count (the chain's own acceptance), which should be a.

Run on a GPU with a FlashInfer release >= 0.2.3 installed (imports: torch and flashinfer only):
    python docs/repro/chain_speculative_count.py
"""
import flashinfer
import torch

ROWS = 200_000


def main():
    dev = "cuda"
    print(f"flashinfer {flashinfer.__version__} torch {torch.__version__} {torch.cuda.get_device_name()}")
    for a in (0.25, 0.5, 0.75):
        draft = torch.tensor([[[0.5, 0.5]]], device=dev).expand(ROWS, 1, 2).contiguous()
        target = torch.tensor([[[a / 2, 1 - a / 2], [0.5, 0.5]]], device=dev).expand(ROWS, 2, 2).contiguous()
        ids = torch.zeros(ROWS, 1, dtype=torch.int32, device=dev)
        _, accepted, emitted = flashinfer.sampling.chain_speculative_sampling(draft, ids, target)
        acc, emi = accepted.double().mean().item(), emitted.double().mean().item()
        se = (a * (1 - a) / ROWS) ** 0.5
        print(f"a {a:.2f}: accepted share {acc:.4f} (documented {a:.4f}, z {(acc - a) / se:+.1f}; "
              f"re-tested {a * (2 - a):.4f}), emitted share {emi:.4f} (z {(emi - a) / se:+.1f})")


if __name__ == "__main__":
    main()
