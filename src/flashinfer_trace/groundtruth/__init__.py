"""Ground truth for a definition, from one of three sources: FlashInfer's kernels (preferred),
SGLang's (fallback) and an independent torch computation (runs anywhere).

    gt = get_ground_truth("flashinfer", definition, device="cuda")   # or GroundTruthUnavailable
    expected = gt(inputs)                                              # outputs, definition order

One module per source declares its adapters (`ADAPTERS`); this module only looks them up.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from packaging.version import Version

from . import (
    fi_api,
    flashinfer,
    flashinfer_block_sparse,
    flashinfer_bmm,
    flashinfer_cascade,
    flashinfer_cascade_attention,
    flashinfer_dequantize_fp4,
    flashinfer_dsa,
    flashinfer_gemm_bf16,
    flashinfer_gemm_fp8,
    flashinfer_gemma_norm,
    flashinfer_layernorm,
    flashinfer_mhc,
    flashinfer_moe_routing,
    flashinfer_page_append,
    flashinfer_pod,
    flashinfer_samplers,
    flashinfer_segment_gemm,
    flashinfer_single,
    flashinfer_speculative,
    flashinfer_topk,
    flashinfer_topk_select,
    flashinfer_trtllm_paged,
    flashinfer_xqa,
    modes,
    sglang,
    sglang_cascade,
    sglang_gemma_norm,
    sglang_samplers,
    sglang_topk,
    torch_block_sparse,
    torch_bmm,
    torch_cascade,
    torch_cascade_attention,
    torch_dequantize_fp4,
    torch_gemm_bf16,
    torch_gemm_fp8,
    torch_gemma_norm,
    torch_layernorm,
    torch_mhc,
    torch_moe_routing,
    torch_page_append,
    torch_pod,
    torch_ref,
    torch_samplers,
    torch_segment_gemm,
    torch_speculative,
    torch_topk,
    torch_topk_select,
    torch_trtllm_paged,
    torch_xqa,
)
from .base import (
    ALL_SOURCES,
    KERNEL,
    SOURCES,
    Adapter,
    Call,
    GroundTruthUnavailable,
    PrebuildLookup,
    arch_gate,
    availability,
)
from .kernel import adapter as kernel_adapter  # get_ground_truth's `kernel` argument names the user's function

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs

__all__ = ["ALL_SOURCES", "KERNEL", "SOURCES", "Adapter", "GroundTruth", "GroundTruthUnavailable", "adapters_for",
           "get_ground_truth", "ground_truths", "default_device", "paths", "split_path"]

ADAPTERS: dict[str, list[Adapter]] = {
    "flashinfer": flashinfer.ADAPTERS + flashinfer_dsa.ADAPTERS + flashinfer_cascade.ADAPTERS
                  + flashinfer_page_append.ADAPTERS + flashinfer_single.ADAPTERS + flashinfer_topk.ADAPTERS
                  + flashinfer_layernorm.ADAPTERS + flashinfer_gemma_norm.ADAPTERS + flashinfer_samplers.ADAPTERS
                  + flashinfer_topk_select.ADAPTERS + flashinfer_bmm.ADAPTERS + flashinfer_moe_routing.ADAPTERS
                  + flashinfer_segment_gemm.ADAPTERS
                  + flashinfer_block_sparse.ADAPTERS + flashinfer_cascade_attention.ADAPTERS
                  + flashinfer_pod.ADAPTERS + flashinfer_mhc.ADAPTERS
                  + flashinfer_dequantize_fp4.ADAPTERS + flashinfer_speculative.ADAPTERS
                  + flashinfer_gemm_fp8.ADAPTERS + flashinfer_gemm_bf16.ADAPTERS
                  + flashinfer_trtllm_paged.ADAPTERS + flashinfer_xqa.ADAPTERS,
    "sglang": sglang.ADAPTERS + sglang_cascade.ADAPTERS + sglang_topk.ADAPTERS + sglang_gemma_norm.ADAPTERS
              + sglang_samplers.ADAPTERS,
    "torch": torch_ref.ADAPTERS + torch_cascade.ADAPTERS + torch_page_append.ADAPTERS + torch_topk.ADAPTERS
             + torch_layernorm.ADAPTERS + torch_gemma_norm.ADAPTERS + torch_samplers.ADAPTERS
             + torch_topk_select.ADAPTERS + torch_bmm.ADAPTERS + torch_moe_routing.ADAPTERS
             + torch_segment_gemm.ADAPTERS
             + torch_block_sparse.ADAPTERS + torch_cascade_attention.ADAPTERS
             + torch_pod.ADAPTERS + torch_mhc.ADAPTERS + torch_dequantize_fp4.ADAPTERS
             + torch_speculative.ADAPTERS + torch_gemm_fp8.ADAPTERS
             + torch_gemm_bf16.ADAPTERS + torch_trtllm_paged.ADAPTERS + torch_xqa.ADAPTERS,
}


# every mode some adapter declares: a path named by a mode alone is a mode of the plain path
_ALL_MODES = frozenset(m for adapters in ADAPTERS.values() for a in adapters for m in a.modes)


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def adapters_for(op_type: str, source: str | None = None) -> list[Adapter]:
    """Adapters for an op type, in preference order (FlashInfer, SGLang, torch)."""
    sources = (source,) if source else SOURCES
    return [a for s in sources for a in ADAPTERS.get(s, ()) if a.op_type == op_type]


@dataclass(frozen=True)
class GroundTruth:
    """An adapter that can run here, bound to its imported package and device."""

    adapter: Adapter
    definition: Definition
    device: str
    module: ModuleType | None
    version: Version | None
    # the source's adapters for this definition tried first that cannot run here, (api, reason): on sm90
    # trtllm-gen's fp8 MoE is arch-unsupported and the cutlass kernel runs; the record keeps the gate visible
    passed_over: tuple[tuple[str, str], ...] = ()
    mode: str | None = None  # the call mode of the path (Adapter.modes); None: the adapter's plain call

    @property
    def path(self) -> str | None:
        """The path's name as `paths` lists it: None for the source's plain path."""
        return join_path(self.adapter.path, self.mode)

    @property
    def source(self) -> str:
        return self.adapter.source

    @property
    def kind(self) -> str:
        return self.adapter.kind

    @property
    def api(self) -> str:
        return self.adapter.api

    def describe(self) -> dict:
        out = {"source": self.source, "api": self.api, "version": str(self.version) if self.version else None,
               "device": self.device}
        if self.path:
            out["path"] = self.path
        if self.passed_over:
            out["passed_over"] = [{"api": api, "reason": reason} for api, reason in self.passed_over]
        return out

    def __call__(self, inputs: Inputs, *, draws: int = 1) -> tuple:
        """Outputs in the definition's order (for a sampler: samples [batch, draws] per output)."""
        call = Call(self.definition, inputs.on(self.device), self.module, self.version, draws, self.mode)
        try:
            out = modes.run(self.adapter, call) if self.mode in modes.GENERIC else self.adapter.fn(call)
        except GroundTruthUnavailable:
            raise
        except Exception as e:  # a kernel refusing this GPU in its own words is a skip, whatever the adapter
            gate = arch_gate(e)
            if gate is None:
                raise
            raise GroundTruthUnavailable("arch-unsupported", f"{self.api}: {gate}") from e
        return out if isinstance(out, tuple) else (out,)


def join_path(path: str, mode: str | None) -> str | None:
    return "+".join(p for p in (path, mode) if p) or None


def split_path(path: str | None) -> tuple[str, str | None]:
    """"tensor-cores+graph" -> ("tensor-cores", "graph"); "graph" -> ("", "graph") when it is a mode."""
    if not path:
        return "", None
    head, plus, mode = path.partition("+")
    if plus:
        return head, mode
    return ("", path) if path in modes.GENERIC or path in _ALL_MODES else (path, None)


def _candidates(source: str, definition: Definition) -> list[Adapter]:
    hand_written = adapters_for(definition.op_type, source)
    if source == "flashinfer" and not any(a.applies(definition) is None for a in hand_written):
        # fallback: the definition's `fi_api:` tag says what to call (fi_api.py); a hand-written adapter
        # that applies knows layouts, clones and parameters the tag cannot say, so it always goes first
        return hand_written + fi_api.adapters(definition)
    return hand_written


def paths(source: str, definition: Definition) -> list[str | None]:
    """The ground-truth paths of a source for a definition, each checked on its own: one per `Adapter.path`
    among the adapters that apply to it, then each call mode of those. Decided from the definition alone
    (nothing imported): whether the installed release has a path is the case's to find out (api-missing).
    A user's kernel has one path, its plain call."""
    if source == KERNEL:
        return [None]
    out: list[str | None] = []
    applying = [a for a in _candidates(source, definition) if a.applies(definition) is None]
    for path in dict.fromkeys(a.path for a in applying):
        out.append(path or None)
        for mode in dict.fromkeys(m for a in applying if a.path == path for m in a.modes):
            out.append(join_path(path, mode))
    return out or [None]


def get_ground_truth(source: str, definition: Definition | str, *, device: str | None = None,
                     prebuild: PrebuildLookup | None = None, path: str | None = None,
                     kernel: str | None = None) -> GroundTruth:
    """The first adapter of `source` on `path` (None: the plain path, `paths`) that can run `definition` on
    `device`; otherwise raises GroundTruthUnavailable with the most telling reason among the source's
    adapters. For FlashInfer, a definition no hand-written adapter applies to is tried with the API its
    `fi_api:` tag names. With `prebuild` (the JIT prebuild's report), a module it failed to build makes the
    adapter unavailable. The source "kernel" is the user's function `kernel` names (MODULE:FUNCTION)."""
    if source not in ALL_SOURCES:
        raise ValueError(f"unknown ground-truth source {source!r}; expected one of {', '.join(ALL_SOURCES)}")
    if (source == KERNEL) != (kernel is not None):
        raise ValueError("the ground-truth source 'kernel' is the function --kernel MODULE:FUNCTION names, and "
                         f"--kernel goes with it only (source {source!r}, kernel {kernel!r})")
    if isinstance(definition, str):
        from ..dataset import load_definition

        definition = load_definition(definition)
    device = device or default_device()
    hand_written = adapters_for(definition.op_type, source)
    every = [kernel_adapter(kernel, definition)] if kernel is not None else _candidates(source, definition)
    fallback = every[len(hand_written):]
    if not every:
        raise GroundTruthUnavailable("unsupported", f"no {source} ground truth for op_type "
                                                    f"{definition.op_type!r}")
    on_path, mode = split_path(path)
    candidates = [a for a in every if a.path == on_path]
    if not candidates:
        raise GroundTruthUnavailable("unsupported", f"no {source} ground truth has a path {path!r} for "
                                                    f"{definition.name}")
    hand_written = [a for a in hand_written if a.path == on_path]
    fallback = [a for a in fallback if a.path == on_path]
    reasons: list[GroundTruthUnavailable] = []
    for adapter in candidates:
        try:
            if mode is not None and mode not in adapter.modes:
                raise GroundTruthUnavailable("unsupported", f"{adapter.api}: no call mode {mode!r}")
            module, version = availability(adapter, definition, device, prebuild=prebuild)
        except GroundTruthUnavailable as e:
            reasons.append(e)
            continue
        passed_over = tuple((a.api, str(e)) for a, e in zip(candidates, reasons, strict=False)
                            if e.kind != "unsupported")  # an adapter for other definitions says nothing here
        return GroundTruth(adapter, definition, device, module, version, passed_over, mode)
    if hand_written and fallback:  # why the op type's own adapters do not apply says more; the tag's reason follows
        best = max(reasons[:len(hand_written)], key=lambda e: e.progress)
        tag = max(reasons[len(hand_written):], key=lambda e: e.progress)
        raise GroundTruthUnavailable(best.kind, f"{best.detail}; by its fi_api tag: {tag}")
    raise max(reasons, key=lambda e: e.progress)


def ground_truths(definition: Definition, *, device: str | None = None
                  ) -> dict[str, GroundTruth | GroundTruthUnavailable]:
    """Every source, available or with its reason."""
    out: dict[str, GroundTruth | GroundTruthUnavailable] = {}
    for source in SOURCES:
        try:
            out[source] = get_ground_truth(source, definition, device=device)
        except GroundTruthUnavailable as e:
            out[source] = e
    return out
