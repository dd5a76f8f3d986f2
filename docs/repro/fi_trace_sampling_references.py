"""FlashInfer's own traced sampling references (flashinfer.trace, 0.7.x) against the rules its kernels apply.

Standalone: needs only torch and flashinfer-python (no GPU: the references are plain torch).

    pip install flashinfer-python==0.7.2.post1   # or --no-deps plus its pure-Python dependencies
    python fi_trace_sampling_references.py

Each check draws from a template's `reference` many times on a tiny row where the answer is known:
1. sampling_from_probs and min_p_sampling return the argmax, never a sample ("matches deterministic=True";
   the API's `deterministic` selects a reproducible kernel, the kernel still samples).
2. top_k_sampling keeps exactly k tokens by sort rank: at a tie at the k-th probability the kernel keeps the
   tie whole (a pivot is accepted when fewer than k tokens are strictly above it), the reference keeps
   whichever k tokens the sort put first.
3. top_p_sampling keeps the token whose preceding mass equals top_p exactly: the kernel's comparison is strict
   (the mass strictly above the pivot must be < top_p), so with probs (1/2, 1/4, 1/4) and top_p = 1/2 only the
   first token may come out.
"""

import collections

import torch
from flashinfer.trace.templates import sampling as t

N = 4000
torch.manual_seed(0)


def draws(fn, *args) -> collections.Counter:
    return collections.Counter(int(fn(*args)[0]) for _ in range(N))


probs = torch.tensor([[0.6, 0.4]])
print("sampling_from_probs, probs (0.6, 0.4):", dict(draws(t.sampling_from_probs_trace.reference, probs)),
      "(a sampler gives token 1 about 40% of the time)")
print("min_p_sampling, probs (0.6, 0.4), min_p 0.5:",
      dict(draws(t.min_p_sampling_trace.reference, probs, torch.tensor([0.5]))),
      "(both tokens pass min_p * max = 0.3)")

tied = torch.full((1, 8), 1 / 8)
seen = draws(t.top_k_sampling_trace.reference, tied, torch.tensor([4]))
print(f"top_k_sampling, 8 tokens of 1/8, top_k 4: {len(seen)} distinct tokens drawn {sorted(seen)}",
      "(the tie at the 4th probability is kept whole: all 8 tokens)")

exact = torch.tensor([[0.5, 0.25, 0.25]])
seen = draws(t.top_p_sampling_trace.reference, exact, torch.tensor([0.5]))
print(f"top_p_sampling, probs (1/2, 1/4, 1/4), top_p 1/2: {dict(seen)}",
      "(only token 0: the mass before token 1 is exactly top_p, not below it)")
