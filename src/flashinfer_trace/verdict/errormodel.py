"""Per-element error scales: how large an error rounding alone can make in each output element.

An element passes when |actual - expected| <= atol + rtol * scale (compare.py). For most outputs the
scale is |expected| (torch.isclose). For a sum of products it is not: where large operands cancel to
a small result, a kernel that rounds or orders the sum differently differs by an ulp of the
*operands*, far above any tolerance relative to the small result (FlashInfer's fp16 gemm at
`large_values`: docs/evidence/ground-truth.md). The textbook
bound for a computed dot product is |fl(a.b) - a.b| <= gamma_K * sum|a_k b_k|, so the scale of
such an element is the sum of the absolute products that made it, per op family:

    gemm                          F.linear(|A|, |B|)             every output
    bmm_fp8                       (|A| a_s) @ (|B| b_s)          every output
    bmm_bf16                      |A| @ |B|                      every output
    gemm_fp8                      (|input| s_in) @ (|weight| s_w)^T,  every output
                                  each code by its block's scale
    gemm_bf16                     |act| @ |W| (+ |bias|)         every output
    segment_gemm                  |x| @ |W[segment]|             every output
    mhc_post                      |x| |post| + |comb|^T @ |residual|  every output
    gqa_paged / gqa_ragged /      softmax(QK^T) . |V|            `output` (probabilities are >= 0,
    mla_ragged / block_sparse /
    cascade_attention / pod /
    trtllm_paged / xqa
                                                                  so only V needs its absolute value)
    mamba_ssu                     |C| . (exp(dt A) |S| + dt |x| |B|) `output` and `new_state` (A and dt keep
                                  + |D x|                        their signs: the decay is what it is)
    gdn                           scale |q| . A_t, A_t = g A_{t-1}  every output (the family's own
                                  + beta (|v| + g A_{t-1} |k|) |k|^T  recurrence: torch_gdn.py)
    moe (bf16 / fp16 weights)     sum_e |w_e| |silu(gate) up| . |W2_e|  every output (GEMM2 and the expert
                                                                  sum; the activation as it is: torch_ref.py)

The scale is computed by the independent torch ground truth on those absolute values (float64), so
it cannot depend on the reference; it costs one more ground-truth call, paid only by comparisons
that fail against |expected| (`compare_with_model`). It widens the tolerance
only where cancellation happened: a transposed weight, a dropped scale or a wrong mask changes
elements by their own size and still fails (the planted-bug suite, mutants.py, keeps that honest).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..definition import Definition
from ..inputs import Inputs

__all__ = ["MODELS", "ErrorModel", "compare_with_model", "error_models", "error_scales", "magnitude", "model_for"]


@dataclass(frozen=True)
class ErrorModel:
    absolute_inputs: tuple[str, ...] | None  # None: every float tensor input
    outputs: tuple[str, ...] | None  # None: every output
    description: str
    # where absolute inputs through the ground truth are no bound (a recurrence that subtracts), the
    # family computes its scales itself: (definition, inputs) -> one tensor or None per output
    compute: Callable[[Definition, Inputs], list] | None = None
    # which definitions of the family it describes (None: all)
    applies: Callable[[Definition], bool] | None = None


MODELS: dict[str, ErrorModel] = {
    "gemm": ErrorModel(None, None, "operand scale: F.linear(|A|, |B|)"),
    # per-tensor fp8: the codes are exact, the kernel's only rounding is its float32 (on Hopper's fp8 tensor
    # cores narrower) sum over K and the one rounding of the scaled sum; |A|, |B| through the ground truth (the
    # scales are >= 0) give each element's sum of absolute products
    "bmm_fp8": ErrorModel(("A", "B"), None, "operand scale: (|A| A_scale) @ (|B| B_scale)"),
    "bmm_bf16": ErrorModel(("A", "B"), None, "operand scale: |A| @ |B|"),
    # mm_bf16 (A, B), tinygemm_bf16 (input, weight, bias), the router GEMMs (mat_a, mat_b): every float input's
    # absolute value through the float64 truth, so the bias enters as |bias|
    "gemm_bf16": ErrorModel(None, None, "operand scale: |act| @ |W| (+ |bias|)"),
    "segment_gemm": ErrorModel(("x", "weights"), None, "operand scale: |x| @ |W[segment]|"),
    # five float32 terms per element (x post_n and the four old streams o times comb[o, n]): |every input| through
    # the ground truth gives each element's sum of absolute terms
    "mhc_post": ErrorModel(None, None, "operand scale: |x| |post| + sum_o |residual_o| |comb_o,n|"),
    # block-scaled fp8: as bmm_fp8, each code with its own block's scale (>= 0): |input|, |weight| through the ground
    # truth give each element's sum of absolute products over every block
    "gemm_fp8": ErrorModel(("input", "weight"), None,
                           "operand scale: (|input| input_scale) @ (|weight| weight_scale)^T, per block"),
    "gqa_paged": ErrorModel(("v_cache",), ("output",), "operand scale: softmax(QK^T) . |V|"),
    "gqa_ragged": ErrorModel(("v",), ("output",), "operand scale: softmax(QK^T) . |V|"),
    "block_sparse": ErrorModel(("v",), ("output",), "operand scale: softmax(QK^T) . |V| over the listed blocks"),
    "cascade_attention": ErrorModel(("v_cache",), ("output",), "operand scale: softmax(QK^T) . |V| over every level"),
    "mla_ragged": ErrorModel(("v",), ("output",), "operand scale: softmax(QK^T) . |V|"),
    "pod": ErrorModel(("v_p", "v_cache"), ("output_p", "output_d"), "operand scale: softmax(QK^T) . |V|, both halves"),
    # paged (v_cache) or ragged (value): whichever the definition has
    "trtllm_paged": ErrorModel(None, ("output",), "operand scale: softmax(QK^T) . |V|",
                               compute=lambda d, x: _absolute_scales(d, x, tuple(n for n in ("v_cache", "value")
                                                                                 if n in d.inputs), ("output",))),
    # XQA decode: |V| (an fp8 cache's |codes|) through the ground truth, times bmm2_scale (> 0) as the kernel scales
    "xqa": ErrorModel(("v_cache",), ("output",), "operand scale: softmax(QK^T) . |V| * bmm2_scale"),
    # y = C . S' + D x with S' = exp(dt A) S + dt x B: a sum of products over dstate that cancels like a
    # dot product; |S|, |x|, |B|, |C|, |D| (never A or dt: the decay and the step stay what they are) give
    # each element's sum of absolute terms, for the output and the updated state alike
    "mamba_ssu": ErrorModel(("state", "x", "B", "C", "D"), None,
                            "operand scale: |C| . (exp(dt A) |S| + dt |x| |B|) + |D x|"),
    # the gated delta rule subtracts the state's prediction (u = beta (v - g S k)), so |inputs| through
    # the ground truth bound nothing: its own recurrence over absolute terms gives the scales
    # (groundtruth/torch_gdn.py `recurrence(absolute=True)`); a chunked bf16 kernel rounds those terms
    "gdn": ErrorModel(("q", "k", "v"), None,
                      "operand scale: the recurrence over |S0|, |k|, |v|, |g S k| (|S_t|-like), o: scale |q| . |S_t|",
                      compute=lambda d, x: _gdn_scales(d, x)),
    # Each MoE output element is sum_e w_e sum_i act_e,i W2_e,c,i: where it cancels (extreme_magnitudes: elements
    # of 1e5 beside one of 0.38) the float32 reference rounds at 2**-24 of those terms, in the order its GEMM runs
    # (an H200's cuBLAS order moved one element by 0.014: tests/unit/test_errormodel.py), and a kernel that rounds
    # the activation to bf16 before GEMM2 (the definitions allow it) at 2**-9 of them. Absolute inputs through
    # the whole ground truth would also take |.| inside GEMM1 and the activation, thousands of times larger
    # (|x| . |W1| squared by up x gate), so the family computes the scale with the activation as it is. fp8
    # MoE keeps its fp8 tolerance (matched_ratio, the cosine floor): its kernels round operands to fp8
    "moe": ErrorModel(None, None, "operand scale: sum_e w_e |silu(gate) up| . |W2_e|",
                      compute=lambda d, x: _moe_scales(d, x), applies=lambda d: not _fp8_moe(d)),
    # dequantize_fp4 has no entry: every output element is one product (e2m1 x e4m3 x global) rounded once, no sum
    # that cancels, so |expected| is its scale (one ulp of the output dtype: definitions/tolerances.toml).
    # dsa_paged has no entry. Sparse attention: ckv is both key and value (absorbed MLA), so |ckv| through
    # the ground truth would change the softmax too, not bound the sum; like mla_paged it keeps |expected|
    # (a softmax-weighted mean of bf16 latents: bf16's own tolerance holds it). The indexer's output is an
    # index set, judged by compare_topk.py with a tie band of 2e-5 x the score's sum of |terms|.
}


def _gdn_scales(definition: Definition, inputs: Inputs) -> list:
    from ..groundtruth.torch_gdn import run

    return list(run(definition, inputs.values, absolute=True))


def _moe_scales(definition: Definition, inputs: Inputs) -> list:
    from ..groundtruth.torch_ref import moe_operand_scale

    return [moe_operand_scale(definition, inputs.values)]


def _fp8_moe(definition: Definition) -> bool:
    """Not the model's: fp8 weights, or tensors the torch ground truth cannot map (semantics.moe_applies)."""
    from ..semantics import moe_applies

    spec = definition.inputs.get("gemm1_weights")
    return (spec is None or spec.dtype is None or spec.dtype.value.startswith("float8")
            or moe_applies(definition) is not None)


def model_for(definition: Definition) -> ErrorModel | None:
    """The family's model where the definition has the inputs it names and the model describes it."""
    model = MODELS.get(definition.op_type)
    if model is None or (model.absolute_inputs and not set(model.absolute_inputs) <= set(definition.inputs)):
        return None
    if model.applies is not None and not model.applies(definition):
        return None
    return model


def error_models(definition: Definition) -> list[str]:
    """What rtol multiplies, per output, for the results ("|expected|" or the model's description)."""
    model = model_for(definition)
    return ["|expected|" if model is None or (model.outputs is not None and o not in model.outputs)
            else model.description for o in definition.outputs]


def compare_with_model(definition: Definition, inputs: Inputs, actual, expected, tolerance,
                       scales: Callable[[], list] | None = None) -> list:
    """DiffReports of outputs against the ground truth's: first against |expected|; only where that
    fails and the family has a model, again with the operand scales (the model can only widen, so
    the ground-truth call it costs is paid by the cases that need it). Top-k index outputs are sets,
    judged by the scores that chose them (compare_topk.py)."""
    from . import moe_routing, topk_select
    from . import topk as compare_topk
    from .compare import compare_outputs

    if compare_topk.applies(definition):
        return compare_topk.compare(definition, inputs, actual, expected, tolerance)
    if topk_select.applies(definition):
        return topk_select.compare(definition, inputs, actual, expected, tolerance)
    if moe_routing.applies(definition):
        return moe_routing.compare(definition, inputs, actual, expected, tolerance)
    names = list(definition.outputs)
    reports = compare_outputs(actual, expected, tolerance, names)
    if all(r.passed for r in reports) or model_for(definition) is None or not _per_output(actual, expected, names):
        return reports  # a model widens element-wise tolerances; a missing or extra output is no rounding
    found = scales() if scales is not None else error_scales(definition, inputs)
    return compare_outputs(actual, expected, tolerance, names, scales=found, error_models=error_models(definition))


def _per_output(actual, expected, names: list[str]) -> bool:
    """Both sides give one value per declared output: only then is there an element to widen."""
    def count(x) -> int:
        return len(x) if isinstance(x, (tuple, list)) else 1
    return count(actual) == count(expected) == len(names)


def magnitude(t: torch.Tensor) -> torch.Tensor:
    """|t| in t's dtype. CUDA has no abs for the one-byte floats (fp8): their sign is the top bit, cleared exactly."""
    if t.is_floating_point() and t.element_size() == 1:
        return (t.view(torch.uint8) & 0x7F).view(t.dtype)
    return t.abs()


def error_scales(definition: Definition, inputs: Inputs) -> list[torch.Tensor | None]:
    """One scale per output, in output order (None: |expected|)."""
    none: list[torch.Tensor | None] = [None] * len(definition.outputs)
    model = model_for(definition)
    if model is None:
        return none
    if model.compute is not None:
        return model.compute(definition, inputs)
    names = model.absolute_inputs or tuple(n for n, v in inputs.values.items()
                                           if isinstance(v, torch.Tensor) and v.is_floating_point())
    return _absolute_scales(definition, inputs, names, model.outputs)


def _absolute_scales(definition: Definition, inputs: Inputs, names: tuple[str, ...], outputs: tuple[str, ...] | None
                     ) -> list[torch.Tensor | None]:
    """|outputs| of the torch ground truth on the inputs `names` made absolute (None where not modelled)."""
    from ..groundtruth import GroundTruthUnavailable, get_ground_truth

    none: list[torch.Tensor | None] = [None] * len(definition.outputs)
    values = {k: magnitude(v) if k in names and isinstance(v, torch.Tensor) else v for k, v in inputs.values.items()}
    absolute = Inputs(inputs.definition, inputs.size, inputs.seed, inputs.case, values, dict(inputs.axes),
                      inputs.ignored)
    try:
        outs = get_ground_truth("torch", definition, device=inputs.device)(absolute)
    except GroundTruthUnavailable:
        return none
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return [o.abs() if isinstance(o, torch.Tensor) and (outputs is None or name in outputs) else None
            for name, o in zip(definition.outputs, outs, strict=True)]
