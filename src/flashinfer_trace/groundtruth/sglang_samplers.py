"""SGLang ground truth for the samplers of inputs/samplers.py that sgl_kernel has: `min_p_sampling_from_probs`.

Read in sgl-kernel/python/sgl_kernel/sampling.py (sglang, 2025-2026): `min_p_sampling_from_probs(probs, min_p,
indices=None, deterministic=True, generator=None, check_nan=False)`, FlashInfer's kernel vendored (a float32 cast,
int32 samples), with a Python scalar or a per-row tensor; earlier releases took a `uniform_samples` tensor in
place of the generator (a different API: `api-missing` here, decided from the signature, not the version), and
sglang-kernel 0.4.x exports no sampler at all (sglang calls FlashInfer's). It allocates its output by the rows of
`probs`, not by `indices`, so the `indices` mode is not offered; sgl_kernel has no sampling_from_probs,
sampling_from_logits or top_k_top_p_sampling_from_logits. Modes: the definition's form and the other one
(flashinfer_samplers.py's `scalar` / `per-row`), and `replay`.
"""

from __future__ import annotations

from types import ModuleType

from packaging.version import Version

from .base import Adapter, Call, GroundTruthUnavailable, accepts
from .flashinfer_samplers import PER_ROW, REPLAY, SCALAR, Drawer, applies_to, draw_all
from .sglang import KERNELS

API = "min_p_sampling_from_probs"


def _generator_api(module: ModuleType, version: Version | None, definition) -> None:
    if not accepts(getattr(module, API), "generator"):
        raise GroundTruthUnavailable("api-missing", f"sgl_kernel {version} {API} takes uniform_samples (the API "
                                                    "before its generator argument)")


def min_p(call: Call) -> tuple:
    fn = getattr(call.module, API)
    return draw_all(Drawer(call, fn, API), call.draws)


ADAPTERS = [
    Adapter("sglang", "sampling", f"sgl_kernel.{API}", min_p, package=KERNELS, requires=(API,),
            resolve=_generator_api, applies=applies_to("min_p", scalar, API), needs_cuda=True, kind="sampler",
            modes=((PER_ROW,) if scalar else (SCALAR,)) + (REPLAY,))
    for scalar in (False, True)
]
