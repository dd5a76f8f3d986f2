"""Standalone: FlashInfer's cascade merges of two (or n) empty attention states, (v 0, lse -inf).

The empty softmax is (0, -inf), FlashInfer's own convention for a position with no states
(docs/boundary/cascade.md). Prints, per kernel, whether the merged output has NaN and what the merged lse is.
Run on a GPU with the release to test installed: python docs/repro/cascade_both_empty.py
"""
import torch

import flashinfer

dev, seq, heads, dim = "cuda", 4, 8, 128
empty_v = torch.zeros(seq, heads, dim, device=dev, dtype=torch.float16)
empty_s = torch.full((seq, heads), float("-inf"), device=dev, dtype=torch.float32)
print("flashinfer", flashinfer.__version__, torch.cuda.get_device_name())

v, s = flashinfer.merge_state(empty_v, empty_s, empty_v.clone(), empty_s.clone())
print(f"merge_state:          v NaN {bool(v.isnan().any())}, lse {sorted(set(s.flatten().tolist()))}")

v_in, s_in = empty_v.clone(), empty_s.clone()
flashinfer.merge_state_in_place(v_in, s_in, empty_v.clone(), empty_s.clone())
print(f"merge_state_in_place: v NaN {bool(v_in.isnan().any())}, lse {sorted(set(s_in.flatten().tolist()))}")

states = 3
vs = torch.zeros(seq, states, heads, dim, device=dev, dtype=torch.float16)
ss = torch.full((seq, states, heads), float("-inf"), device=dev, dtype=torch.float32)
v, s = flashinfer.merge_states(vs, ss)
print(f"merge_states (n={states}):  v NaN {bool(v.isnan().any())}, lse {sorted(set(s.flatten().tolist()))}")
print("expected everywhere: v 0 (no NaN), lse [-inf]")
