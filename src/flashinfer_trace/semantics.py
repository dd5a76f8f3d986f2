"""What every ground truth reads off a definition besides its tensors: the parameters the kernel is
called with (eps, Neox or interleaved RoPE, the MoE block size, Mamba's dt softplus), the stage, the
page layout.

A parameter comes from the definition, never from its reference: the reference is what the checks
judge, so a ground truth that read EPS = 9e-3 out of it would agree with it. In order:
(a) a scalar input of that name (shape null: `"eps": {"shape": null, "dtype": "float32"}`, as the public
format and FlashInfer's fi_trace declare it), given per call, so its value is in the call's `values`;
(b) a `param:<name>=<value>` tag (`param:eps=1e-05`), for a value the model fixes (definition.param_tag);
(c) structure: the MoE block size from the weights' and their scales' shapes, Neox from the name.
A definition that declares none of these is `unsupported`, with the reason. The rest comes from axes,
input names, tags and the name, so a definition is interpreted the same way by the torch, FlashInfer and
SGLang adapters.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .status import GroundTruthUnavailable

if TYPE_CHECKING:
    from .definition import Definition

EPS_INPUTS = ("eps", "epsilon")  # FlashInfer's and SGLang's norms take `eps`


def declared_param(definition: Definition, name: str):
    """The value of a `param:<name>=` tag, or None; a malformed tag is `unsupported`, naming it."""
    try:
        return definition.declared_params.get(name)
    except ValueError as e:
        raise GroundTruthUnavailable("unsupported", f"{definition.name}: {e}") from None


def scalar_input(definition: Definition, names: tuple[str, ...]) -> str | None:
    """The first of `names` that the definition declares as a scalar input (shape null, or [] for a 0-d tensor)."""
    return next((n for n in names if n in definition.inputs and definition.inputs[n].shape in (None, [])), None)


def eps(definition: Definition, values: dict | None = None) -> float | None:
    """The norm's epsilon: the `eps` scalar input's value in this call (None when no call's `values` are
    given: the definition declares it, each call brings it), else a `param:eps=` tag. Never the reference's
    EPS: a definition that declares neither is `unsupported`."""
    name = scalar_input(definition, EPS_INPUTS)
    if name is not None:
        return None if values is None else float(values[name])
    tagged = declared_param(definition, "eps")
    if isinstance(tagged, (int, float)) and not isinstance(tagged, bool) and tagged > 0:
        return float(tagged)
    if tagged is not None:
        raise GroundTruthUnavailable("unsupported", f"{definition.name}: param:eps={tagged!r} is no positive number")
    raise GroundTruthUnavailable("unsupported", f"{definition.name} declares no eps: no scalar input "
                                                f"{' / '.join(EPS_INPUTS)} (shape null) and no param:eps=<number> "
                                                "tag (the reference's own EPS is never read: it is what is judged)")


def missing_inputs(definition: Definition, names: tuple[str, ...]) -> str | None:
    """Why an adapter cannot map this definition's tensors by name, or None."""
    absent = [n for n in names if n not in definition.inputs]
    return f"needs input(s) {', '.join(absent)}" if absent else None


# -- norms ------------------------------------------------------------------------------------------
def is_fused_add(definition: Definition) -> bool:
    return "residual" in definition.inputs


def gemma_norm(definition: Definition) -> str | None:
    """Why a plain RMSNorm ground truth does not apply: Gemma's RMSNorm scales by (weight + 1) (fi_trace's
    `gemma_rmsnorm_*`, tagged `fi_api:flashinfer.norm.gemma_*`). A plain kernel computes another function."""
    tagged = any("gemma" in t for t in definition.tag_values("fi_api"))
    if tagged or definition.name.startswith("gemma"):
        return "Gemma-style RMSNorm (weight + 1): the plain rmsnorm computes another function"
    return None


def plain_rmsnorm(definition: Definition) -> str | None:
    """Why a plain RMSNorm kernel (no residual add) does not apply: every source's rmsnorm adapter asks this."""
    return gemma_norm(definition) or ("a fused add + norm (the fused_add_rmsnorm kernel's)" if is_fused_add(definition)
                                      else missing_inputs(definition, ("hidden_states", "weight")))


def fused_add_rmsnorm(definition: Definition) -> str | None:
    """Why a fused add + RMSNorm kernel does not apply: every source's fused_add_rmsnorm adapter asks this."""
    return gemma_norm(definition) or (None if is_fused_add(definition) else "not a fused add + norm")


def norm_outputs(definition: Definition, output: torch.Tensor, residual: torch.Tensor | None) -> tuple:
    """Outputs in definition order. A fused add + norm has the normalised result first and the
    updated residual second when the definition lists it (public definitions may list only the
    first)."""
    if len(definition.outputs) == 1:
        return (output,)
    return (output, residual)


# -- attention --------------------------------------------------------------------------------------
def stage(definition: Definition) -> str:
    tagged = definition.stage
    if tagged in ("decode", "prefill"):
        return tagged
    return "prefill" if "qo_indptr" in definition.inputs else "decode"


def is_causal(definition: Definition) -> bool:
    """Prefill definitions say so in their name (`..._prefill_causal_...`); decode sees every key."""
    return stage(definition) == "prefill" and "causal" in definition.name.split("_")


def page_size(definition: Definition) -> int:
    return int(definition.const_axes.get("page_size", 1))


def last_page_lens(kv_indptr: torch.Tensor, page: int, given: torch.Tensor | None) -> torch.Tensor:
    """Tokens on each request's last page: the definition's `kv_last_page_len` input when it has one,
    else full pages (a definition without that input stores whole pages only). A request with no
    pages has 0 (FlashInfer computes kv_len = (pages - 1) * page_size + last_page_len)."""
    if given is not None:  # one entry per request (a definition may declare it as long as kv_indptr)
        return given[: kv_indptr.numel() - 1].to(torch.int32)
    pages = kv_indptr[1:] - kv_indptr[:-1]
    return torch.where(pages > 0, page, 0).to(torch.int32)


def request_token_slots(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, page: int,
                        last_len: torch.Tensor) -> list[torch.Tensor]:
    """Per request, the flat slot (page * page_size + offset) of each of its tokens, in order."""
    indptr = kv_indptr.cpu().tolist()
    pages = kv_indices.to(torch.int64)
    lasts = last_len.cpu().tolist()
    out = []
    for b in range(len(indptr) - 1):
        p = pages[indptr[b]:indptr[b + 1]]
        if p.numel() == 0:
            out.append(p)
            continue
        slots = (p[:, None] * page + torch.arange(page, device=p.device)[None, :]).flatten()
        out.append(slots[: (p.numel() - 1) * page + int(lasts[b])])
    return out


# -- rope -------------------------------------------------------------------------------------------
ROPE_TABLES = ("positions", "cos_sin_cache")


def rope_rotated(definition: Definition) -> list[str]:
    """The tensors a RoPE definition rotates, in input order: every input but the positions and the
    cache, whatever their names (`query`/`key` here, `q`/`k` in the public files)."""
    return [n for n in definition.inputs if n not in ROPE_TABLES]


def rope_is_neox(definition: Definition) -> bool:
    """Neox (pairs i, i + rd/2) or interleaved GPT-J (pairs 2i, 2i+1) RoPE: from the name (`neox`, or
    `interleave` / `gptj`), else a `param:is_neox=true|false` tag; never from the reference."""
    name = definition.name
    if "neox" in name:
        return True
    if re.search(r"interleave|gptj|gpt_j", name):
        return False
    tagged = declared_param(definition, "is_neox")
    if isinstance(tagged, bool):
        return tagged
    raise GroundTruthUnavailable("unsupported", f"{definition.name}: cannot tell Neox from interleaved RoPE (no "
                                                "'neox' / 'interleave' / 'gptj' in the name, no "
                                                "param:is_neox=true|false tag)")


# -- moe --------------------------------------------------------------------------------------------
MOE_INPUTS = ("hidden_states", "gemm1_weights", "gemm2_weights")
LOGITS, ROUTED = "routing_logits", "topk_ids"  # router logits, or pre-computed packed (expert, weight) pairs
OFFSET = "local_expert_offset"


def expert_offset(definition: Definition, values: dict) -> int:
    """The first local expert's global id: the input, or 0 where the definition has none, which the
    public files do only when every expert is local (moe_applies checks that)."""
    return int(values[OFFSET]) if OFFSET in definition.inputs else 0


@dataclass(frozen=True)
class MoeRouting:
    kind: str  # "deepseek" (sigmoid + bias, grouped), "renormalize" (softmax, top-k, renormalised),
    #            "llama4" (sigmoid, top-k, the weight scales the token's input) or
    #            "precomputed" (topk_ids: expert id << 16 | bfloat16 weight bits, per token and choice)
    top_k: int
    n_group: int | None = None
    topk_group: int | None = None
    scales_input: bool = False  # Llama-4 (routing_method_type=3): the weight multiplies the token's input


# TensorRT-LLM's RoutingMethodType values, which the public files' descriptions quote
ROUTING_METHOD_TYPES = {1: "renormalize", 2: "deepseek", 3: "llama4"}
_ROUTING_WORDS = (("llama4", "llama4"), ("deepseek", "deepseek"), ("renormalize", "renormalize"))


def declared_routing(definition: Definition) -> str | None:
    """The routing the description names: `routing_method_type=N`, else "<Llama4|DeepSeek|Renormalize>
    routing"; None when it names none (or several)."""
    text = (definition.description or "").lower()
    m = re.search(r"routing_method_type\s*=\s*(\d+)", text)
    if m:
        return ROUTING_METHOD_TYPES.get(int(m.group(1)))
    named = {kind for word, kind in _ROUTING_WORDS if f"{word} routing" in text}
    return named.pop() if len(named) == 1 else None


@dataclass(frozen=True)
class Routing:
    top_k: int
    n_group: int | None = None
    topk_group: int | None = None


def routing_params(definition) -> Routing | None:
    """top_k / n_group / topk_group from axes of those names, else from the name (`topk8_ng8_kg4`)."""
    ax = definition.const_axes

    def find(axis_names, pattern):
        for a in axis_names:
            if a in ax:
                return ax[a]
        m = re.search(pattern, definition.name)
        return int(m.group(1)) if m else None

    top_k = find(("top_k", "topk"), r"topk(\d+)")
    if top_k is None:
        return None
    return Routing(top_k, find(("n_group", "num_groups"), r"_ng(\d+)"),
                   find(("topk_group", "num_topk_groups"), r"_kg(\d+)"))


def moe_routing(definition: Definition) -> MoeRouting:
    """The routing a MoE definition uses: pre-computed when it has a topk_ids input; else the one its
    description declares (Llama4's sigmoid top-k has a routing_bias input that it ignores); else
    DeepSeek-V3's when it has a routing_bias input (top_k, n_group, topk_group from axes or the
    name, `topk8_ng8_kg4`); else renormalize (top_k only)."""
    r = routing_params(definition)
    if r is None:
        raise GroundTruthUnavailable("unsupported", f"{definition.name}: top_k not found (topkN in the name or a "
                                                    f"top_k axis)")
    declared = declared_routing(definition)
    if ROUTED in definition.inputs:
        return MoeRouting("precomputed", r.top_k, scales_input=declared == "llama4")
    if declared in ("llama4", "renormalize"):
        return MoeRouting(declared, r.top_k, scales_input=declared == "llama4")
    if "routing_bias" in definition.inputs:
        if r.n_group is None or r.topk_group is None:
            raise GroundTruthUnavailable("unsupported", f"{definition.name}: DeepSeek routing needs n_group and "
                                                        f"topk_group (ngN_kgN in the name or axes)")
        return MoeRouting("deepseek", r.top_k, r.n_group, r.topk_group)
    return MoeRouting("renormalize", r.top_k)


def moe_is_fp8(definition: Definition) -> bool:
    return definition.inputs["gemm1_weights"].dtype.is_low_precision


MOE_SCALES = ("hidden_states_scale", "gemm1_weights_scale", "gemm2_weights_scale")
# per-tensor fp8: one float32 per expert scaling GEMM1's up half, its gate half, and GEMM2's output
MOE_OUTPUT_SCALES = ("output1_scales_scalar", "output1_scales_gate_scalar", "output2_scales_scalar")


def moe_quant(definition: Definition) -> str:
    """"unquantised", "fp8-block" (128-wide block scales) or "fp8-per-tensor" (per-expert output scales);
    "fp8-unscaled" when fp8 weights come with neither."""
    if not moe_is_fp8(definition):
        return "unquantised"
    if all(n in definition.inputs for n in MOE_SCALES):
        return "fp8-block"
    if all(n in definition.inputs for n in MOE_OUTPUT_SCALES):
        return "fp8-per-tensor"
    return "fp8-unscaled"


def moe_applies(definition: Definition) -> str | None:
    """Why a MoE definition's tensors cannot be mapped (any ground truth), or None."""
    missing = missing_inputs(definition, MOE_INPUTS)
    if missing:
        return missing
    if LOGITS not in definition.inputs and ROUTED not in definition.inputs:
        return f"needs input(s) {LOGITS} (or pre-routed {ROUTED})"
    if OFFSET not in definition.inputs and LOGITS in definition.inputs:
        consts = definition.const_axes
        experts = definition.inputs[LOGITS].shape[-1]
        local = (definition.inputs["gemm1_weights"].shape or [None])[0]
        if experts != local and (consts.get(experts) is None or consts.get(experts) != consts.get(local)):
            return (f"no {OFFSET} input, and routing_logits' experts ({experts} = {consts.get(experts, 'var')}) "
                    f"are not gemm1_weights' ({local} = {consts.get(local, 'var')}): cannot tell which are local")
    if moe_quant(definition) == "fp8-unscaled":
        return (f"fp8 weights need block scales ({', '.join(MOE_SCALES)}) or per-expert output scales "
                f"({', '.join(MOE_OUTPUT_SCALES)})")
    return None


def fp8_moe_applies(definition: Definition) -> str | None:
    """For the fp8 block-scale kernels: a bf16 MoE has no kernel adapter here yet (cutlass_fused_moe
    without quantization has not been run on a GPU in this project, so it is not claimed)."""
    why = moe_applies(definition)
    if why:
        return why
    if LOGITS not in definition.inputs:
        return f"pre-routed ({ROUTED}): the fp8 block-scale kernels take router logits"
    quant = moe_quant(definition)
    return None if quant == "fp8-block" else f"{quant} experts: only the fp8 block-scale kernels are wired up"


def moe_block(definition: Definition, values: dict | None = None) -> int | None:
    """The side of the fp8 scale blocks: each weight dimension over its scale's (gemm1 [E, 2I, H] with
    scales [E, 2I/b, H/b], gemm2 [E, H, I] with [E, H/b, I/b], hidden_states [T, H] with [H/b, T]), from
    the call's tensors where given, else the const axes. None when the definition has no block scales;
    `unsupported` when the shapes disagree on one block size or do not divide: the structure, not the
    reference, says what a block is."""
    def dims(name: str) -> list[int | None]:
        if values is not None and isinstance(values.get(name), torch.Tensor):
            return list(values[name].shape)
        consts = definition.const_axes
        return [consts.get(a) for a in definition.inputs[name].shape or ()]

    pairs = []  # (full size, blocks, what)
    for w, s in (("gemm1_weights", "gemm1_weights_scale"), ("gemm2_weights", "gemm2_weights_scale")):
        if w in definition.inputs and s in definition.inputs:
            pairs += [(f, n, f"{w} / {s}") for f, n in zip(dims(w)[-2:], dims(s)[-2:], strict=False)]
    if "hidden_states" in definition.inputs and "hidden_states_scale" in definition.inputs:
        pairs.append((dims("hidden_states")[-1], dims("hidden_states_scale")[0], "hidden_states / hidden_states_scale"))
    if not pairs:
        return None
    found: set[int] = set()
    for full, blocks, what in pairs:
        if full is None or blocks is None:
            continue
        if blocks <= 0 or full % blocks:
            raise GroundTruthUnavailable("unsupported", f"{definition.name}: {what}: {full} is not a multiple of "
                                                        f"{blocks} blocks")
        found.add(full // blocks)
    if len(found) != 1:
        raise GroundTruthUnavailable("unsupported", f"{definition.name}: cannot tell the scale block size from "
                                                    f"the tensors and their scales (found {sorted(found) or 'none'})")
    return found.pop()


# -- mamba ------------------------------------------------------------------------------------------
MAMBA_INPUTS = ("state", "x", "dt", "A", "B", "C")
MAMBA_PAD_SLOT_ID = -1  # a request whose state_batch_indices entry is this is skipped (vLLM/SGLang PAD_SLOT_ID)


def mamba_applies(definition: Definition) -> str | None:
    """Why a mamba_ssu definition's tensors cannot be mapped (any ground truth), or None."""
    missing = missing_inputs(definition, MAMBA_INPUTS)
    if missing:
        return missing
    if len(definition.inputs["state"].shape or ()) != 4 or len(definition.inputs["x"].shape or ()) != 3:
        return "expects state [cache, nheads, head_dim, dstate] and x [batch, nheads, head_dim] (one token each)"
    if list(definition.outputs)[:1] != ["output"]:
        return "expects `output` as the first output (then optionally the updated state)"
    return None


def mamba_dt_softplus(definition: Definition, values: dict | None = None) -> bool:
    """Whether dt (+ dt_bias) goes through softplus: a `dt_softplus` input decides per call (its value in
    `values`; True when none are given, to plan), else a `param:dt_softplus=true|false` tag; never whether
    the reference happens to call softplus."""
    if "dt_softplus" in definition.inputs:
        return True if values is None else bool(values["dt_softplus"])
    tagged = declared_param(definition, "dt_softplus")
    if isinstance(tagged, bool):
        return tagged
    raise GroundTruthUnavailable("unsupported", f"{definition.name} declares no dt_softplus: no dt_softplus input "
                                                "and no param:dt_softplus=true|false tag")


def sm_scale(values: dict, head_dim: int) -> float:
    """The softmax scale an attention call is given; absent (fi_trace's inits pass `sm_scale=None`, the
    APIs' default) it is FlashInfer's default, 1 / sqrt(head_dim of the query-key product)."""
    given = values.get("sm_scale")
    return 1.0 / math.sqrt(head_dim) if given is None else float(given)
