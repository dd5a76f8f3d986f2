"""Mixture-of-experts inputs (op_type `moe`), e.g. the DeepSeek-V3 fp8 block-scale MoE:
routing logits and bias, fp8 hidden states and expert weights with their block scales, the
offset of this rank's local experts and the routed scaling factor.

Every dimension comes from the definition's axes and shapes (nothing is hard-coded to
DeepSeek-V3's 256 experts or 7168 hidden), so other definitions of the same family work.

* fp8 tensors are made from random bytes mapped to finite codes of magnitude 0.125..1.875
  (`rng.random_fp8`), cheap enough for the ~1.4 GB of DeepSeek-V3 expert weights.
* Any input `<x>_scale` next to an fp8 input `<x>` is a block scale, drawn with the shape the
  definition gives, positive and log-uniform over 1.5 binades around a centre chosen so the
  dequantised values are O(1) for activations and O(1/sqrt(K)) for weights ([.., N, K] layout,
  K last): each GEMM then keeps its outputs O(1) and the bf16 output is finite.
* `local_expert_offset` is a multiple of the number of local experts, chosen by the seed.
* Routing is steered: for most tokens, 2..3 experts of a small hot set of local experts get
  their logits raised by 5 and the other local experts are pushed down. With 256 experts and 32
  local ones, plain random logits often route no token of a small batch to this rank, and then
  the kernel computes nothing and any implementation "passes". The
  `no_local_tokens` case does the opposite on purpose (local logits pushed to -30): the output
  must then be all zeros. Both are checked after generation with the DeepSeek-V3 routing when
  the definition names its routing parameters (topk/ng/kg in the name or as axes).
* Pre-routed MoE (`topk_ids`, the public `*_routed_moe` files): no logits; each token's top-k
  experts and weights come packed in one int32, expert id in the high 16 bits, the bfloat16
  weight's bits in the low 16. The ids are drawn from a hot set of experts (distinct per token)
  so experts receive several tokens, and the weights are a softmax, so they sum to 1 (for top-1 or
  Llama-4 routing, sigmoid scores in (0, 1), so that where the weight is applied matters).
* Per-tensor fp8 (`output1_scales_scalar`, `output1_scales_gate_scalar`, `output2_scales_scalar`,
  one float32 per expert): the fp8 codes carry no scale of their own, so these per-expert output
  scales are what make each GEMM's result O(1): centred on 1 / (sqrt(K) * rms of the codes).
"""

from __future__ import annotations

import math

import torch

from ..semantics import Routing, declared_routing, routing_params
from .common import FP8_CODE_RMS, Builder, log_uniform, normal, permutation, randint, uniform

OP_TYPES = ("moe",)
ROWS = {"small": 2, "medium": 8, "large": 64}
CASES = ("single_token", "no_local_tokens")
ROUTED_SCALING_FACTOR = 2.5
LOCAL_TOKEN_FRACTION = 0.75  # tokens steered to local experts
HOT_EXPERTS = {"small": 2, "medium": 3, "large": 8}  # local experts the steered tokens share
# A steered token sends 2..3 of its top-k choices to local experts. Not 1: DeepSeek-V3 ranks
# groups by their best two experts, so one boosted expert in an otherwise suppressed group
# would not get its group kept (32 local experts are exactly one group there).
MIN_LOCAL_CHOICES, MAX_LOCAL_CHOICES = 2, 3
BOOST = 5.0  # added to the logits of a steered token's chosen local experts: sigmoid ~ 0.99
SUPPRESSED = -30.0  # local logits in `no_local_tokens`: sigmoid ~ 1e-13, below every other expert
ROUTING_BIAS_STD = 0.1
SCALE_SPREAD = 0.75  # block scales vary over +-0.75 binades around their centre

LOGITS, BIAS, HIDDEN, ROUTED = "routing_logits", "routing_bias", "hidden_states", "topk_ids"
# per-expert output scales of a per-tensor fp8 MoE -> the weight whose GEMM output each scales
OUTPUT_SCALES = {"output1_scales_scalar": "gemm1_weights", "output1_scales_gate_scalar": "gemm1_weights",
                 "output2_scales_scalar": "gemm2_weights"}
OFFSET, SCALING = "local_expert_offset", "routed_scaling_factor"

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def edge_cases(definition) -> list[str]:
    """no_local_tokens needs experts on other ranks: without expert parallelism every token is local."""
    ax = definition.const_axes
    if OFFSET not in definition.inputs or ROUTED in definition.inputs or (
            "num_local_experts" in ax and "num_experts" in ax and ax["num_local_experts"] >= ax["num_experts"]):
        return [c for c in CASES if c != "no_local_tokens"]
    return list(CASES)


def route(logits: torch.Tensor, bias: torch.Tensor | None, r: Routing) -> torch.Tensor:
    """Selected expert ids [T, top_k]: DeepSeek-V3 grouped routing when bias and groups are
    known (sigmoid + bias, groups ranked by their best two, top-k inside the best groups),
    else plain top-k of the logits."""
    if bias is None or r.n_group is None or r.topk_group is None:
        return logits.float().topk(r.top_k, dim=-1).indices
    t, e = logits.shape
    biased = torch.sigmoid(logits.float()) + bias.float()
    per_group = e // r.n_group
    group_score = biased.view(t, r.n_group, per_group).topk(min(2, per_group), dim=-1).values.sum(-1)
    groups = group_score.topk(r.topk_group, dim=-1).indices
    keep = torch.zeros(t, r.n_group, dtype=torch.bool).scatter_(1, groups, True)
    masked = biased.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
    return masked.topk(r.top_k, dim=-1).indices


def _is_fp8(b: Builder, name: str) -> bool:
    s = b.spec(name)
    return s.shape is not None and b.torch_dtype(name) in _FP8


def generate(b: Builder) -> None:
    d = b.definition
    names = list(d.inputs)
    fp8 = [n for n in names if _is_fp8(b, n)]
    scales = [n for n in names if n.endswith("_scale") and n[: -len("_scale")] in fp8]
    output_scales = [n for n in names if n in OUTPUT_SCALES]
    weights = [n for n in names if "weight" in n and n not in scales]
    known = {LOGITS, BIAS, HIDDEN, OFFSET, SCALING, ROUTED, *fp8, *scales, *output_scales, *weights}
    extra = [n for n in names if n not in known]
    if extra:
        raise b.error(f"the moe generator does not know input(s) {', '.join(extra)}")
    routing = LOGITS if LOGITS in d.inputs else ROUTED if ROUTED in d.inputs else None
    if routing is None:
        raise b.error(f"a moe definition needs a {LOGITS!r} input (or pre-routed {ROUTED!r})")

    rows = 1 if b.case == "single_token" else ROWS[b.size]
    b.set_dim(routing, 0, rows)
    if HIDDEN in d.inputs:
        b.set_dim(HIDDEN, 0, rows)
    num_local = _num_local_experts(b, weights)
    num_experts = b.dim(LOGITS, -1) if routing == LOGITS else num_local
    if num_local < 1 or num_local > num_experts:
        raise b.error(f"{num_local} local experts of {num_experts}: cannot place them")
    if OFFSET in d.inputs:
        offset = num_local * int(randint(0, num_experts // num_local, (1,), b.rng(OFFSET)))
        b.put_scalar(OFFSET, offset)
    elif num_local == num_experts:  # no offset input: every expert is local (the public Qwen-style files)
        offset = 0
    else:
        raise b.error(f"no {OFFSET!r} input, yet {num_local} local experts of {num_experts}: which are local?")
    if SCALING in d.inputs:
        b.put_scalar(SCALING, ROUTED_SCALING_FACTOR)

    if routing == LOGITS:
        logits = _routing_logits(b, rows, num_experts, offset, num_local)
        b.put(LOGITS, logits.to(b.torch_dtype(LOGITS)))
    else:
        b.put(ROUTED, _packed_topk(b, rows, num_experts))
    if BIAS in d.inputs:
        b.put_random(BIAS, scale=ROUTING_BIAS_STD)

    for name in names:
        if name in scales:
            base = name[: -len("_scale")]
            centre = -math.log2(FP8_CODE_RMS)
            if base in weights:
                centre -= 0.5 * math.log2(max(b.dim(base, -1), 1))
            t = log_uniform(b.shape(name), b.rng(name), centre - SCALE_SPREAD, centre + SCALE_SPREAD,
                            device=b.device)
            b.put(name, t.to(b.torch_dtype(name)))
        elif name in output_scales:
            b.put(name, _output_scale(b, name, fp8))
        elif name in fp8 or name in weights or name == HIDDEN:
            # fp8 codes ignore the scale (their block scales carry it); bf16 weights are N(0, 1/K)
            k = b.dim(name, -1)
            b.put_random(name, scale=1.0 / math.sqrt(max(k, 1)) if name in weights else 1.0)

    if routing == LOGITS:
        _check_routing(b, offset, num_local)


def _packed_topk(b: Builder, rows: int, num_experts: int) -> torch.Tensor:
    """[rows, top_k] int32: expert id << 16 | the bfloat16 bits of its weight (see the module docstring)."""
    r = routing_params(b.definition)
    top_k = r.top_k if r else b.dim(ROUTED, -1)
    if top_k > num_experts or num_experts >= 1 << 15:
        raise b.error(f"cannot pack top_k={top_k} of {num_experts} experts into {ROUTED!r}")
    b.set_dim(ROUTED, -1, top_k)
    g = b.rng(ROUTED)
    hot = permutation(num_experts, g)[: min(num_experts, max(top_k + HOT_EXPERTS[b.size], 2 * top_k))]
    order = permutation(hot.numel(), g, rows=rows)[:, :top_k]
    ids = hot[order]  # distinct experts per token, from a shared hot set
    if top_k == 1 or _declares_llama4(b.definition):  # sigmoid scores: a single weight is not always 1
        weights = torch.sigmoid(normal((rows, top_k), g) + 1.0).to(torch.bfloat16)
    else:
        weights = torch.softmax(normal((rows, top_k), g), dim=-1).to(torch.bfloat16)
    bits = weights.view(torch.int16).to(torch.int32) & 0xFFFF
    return ((ids.to(torch.int32) << 16) | bits).to(b.device)


def _declares_llama4(definition) -> bool:
    return declared_routing(definition) == "llama4"


def _output_scale(b: Builder, name: str, fp8: list[str]) -> torch.Tensor:
    """Per-expert scale of a GEMM's output: 1 / (sqrt(K) * rms of the operands' codes), +-0.75 binades.
    Each fp8 operand contributes its code rms (activations after GEMM1 are O(1): only the weight's)."""
    weight = OUTPUT_SCALES[name]
    if weight not in b.definition.inputs:
        raise b.error(f"{name!r} scales {weight!r}'s GEMM, which the definition does not have")
    k = b.dim(weight, -1)
    operands = [weight] + ([HIDDEN] if weight == "gemm1_weights" and HIDDEN in b.definition.inputs else [])
    rms = math.prod(FP8_CODE_RMS if n in fp8 else 1.0 for n in operands)
    centre = -math.log2(rms) - 0.5 * math.log2(max(k, 1))
    t = log_uniform(b.shape(name), b.rng(name), centre - SCALE_SPREAD, centre + SCALE_SPREAD, device=b.device)
    return t.to(b.torch_dtype(name))


def _num_local_experts(b: Builder, weights: list[str]) -> int:
    if "num_local_experts" in b.axes:
        return b.axes["num_local_experts"]
    for name in weights:
        shape = b.spec(name).shape
        if shape and len(shape) == 3:  # [experts, N, K]
            return b.dim(name, 0)
    raise b.error("cannot tell the number of local experts (no num_local_experts axis, no 3-d weight)")


def _routing_logits(b: Builder, rows: int, num_experts: int, offset: int, num_local: int) -> torch.Tensor:
    """Router logits: N(0, 1), then steered (see the module docstring).

    A steered token boosts 2..3 experts of a small hot set of local experts and suppresses the
    other local experts, so it sends (almost always exactly) that many choices to this rank. The hot set is
    shared by all tokens of the case: experts receive several tokens (the grouped GEMM's M > 1
    path), and the reference, which dequantises every local expert it meets, stays fast. Unsteered
    tokens route freely and may or may not land here.
    """
    g = b.rng(LOGITS)
    logits = normal((rows, num_experts), g)
    if b.case == "no_local_tokens":
        logits[:, offset:offset + num_local] = SUPPRESSED
        return logits
    steered = uniform((rows,), g) < LOCAL_TOKEN_FRACTION
    if not bool(steered.any()):
        steered[int(randint(0, rows, (1,), g))] = True
    n_hot = min(HOT_EXPERTS[b.size], num_local)
    hot = offset + permutation(num_local, g)[:n_hot]
    per_token = randint(min(MIN_LOCAL_CHOICES, n_hot), min(MAX_LOCAL_CHOICES, n_hot) + 1, (rows,), g)
    order = permutation(n_hot, g, rows=rows)  # a shuffle of the hot set, per token
    for t in torch.arange(rows)[steered].tolist():
        chosen = hot[order[t, : int(per_token[t])]]
        boosted = logits[t, chosen] + BOOST
        logits[t, offset:offset + num_local] = SUPPRESSED
        logits[t, chosen] = boosted
    return logits


def _check_routing(b: Builder, offset: int, num_local: int) -> None:
    """Fail loudly if the routing does not do what the case promises (see the module docstring)."""
    r = routing_params(b.definition)
    if r is None:
        return
    bias = b.values.get(BIAS)  # both small: checked on the CPU, so the verdict is the same on every device
    chosen = route(b.values[LOGITS].cpu(), bias.cpu() if isinstance(bias, torch.Tensor) else None, r)
    local = int(((chosen >= offset) & (chosen < offset + num_local)).sum())
    if b.case == "no_local_tokens" and local:
        raise b.error(f"no_local_tokens: {local} routing choice(s) still reach the local experts")
    if b.case != "no_local_tokens" and not local:
        raise b.error("no token is routed to a local expert: the case would test nothing")
