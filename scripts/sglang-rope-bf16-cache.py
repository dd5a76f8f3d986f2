"""What rounding the cos/sin cache to bf16 does to a RoPE output, on the CPU.

sglang's JIT `rotary_embedding` reads the cache in the query's dtype, so its ground truth for a
definition with a float32 cache computes with a bf16 one. This runs the independent torch ground
truth twice, with the definition's cache and with that cache rounded to bf16, on the inputs the
reference suite uses, and reports the comparison the suite would make. On the H100 the SGLang
combination failed exactly these cases (docs/ground-truth.md); the worst elements here sit at the
same indices.

    python scripts/sglang-rope-bf16-cache.py [DEFINITION.json ...]
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from flashinfer_trace.verdict.compare import compare_outputs, tolerance_for
from flashinfer_trace.groundtruth import get_ground_truth
from flashinfer_trace.testing import generate_inputs, load_definition

ROOT = Path(__file__).resolve().parents[1]
CASES = (("small", 0, "large_values"), ("medium", 0, None), ("medium", 1, None))  # the suite's edge case and seeds


def main(paths: list[str]) -> int:
    for path in paths or sorted(str(p) for p in (ROOT / "definitions" / "rope").glob("*.json")):
        d = load_definition(path)
        gt = get_ground_truth("torch", d, device="cpu")
        for size, seed, case in CASES:
            x = generate_inputs(d, size, seed=seed, case=case)
            rounded = {**x.values, "cos_sin_cache": x.values["cos_sin_cache"].to(torch.bfloat16).to(torch.float32)}
            reports = compare_outputs(list(gt(x)), list(gt(dataclasses.replace(x, values=rounded))), tolerance_for(d),
                                      list(d.outputs))
            print(f"{d.name} {size} seed {seed} {case or ''}")
            for r in reports:
                print(f"    {r.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
