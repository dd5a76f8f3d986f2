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

Boundary cases (docs/boundary/moe-gdn-mamba.md says why each exists), two per definition: each case is
one full expert computation on the CPU, so each carries several boundaries. The routing is built from the
routing's own rules; ties are exact copies of one (logit, bias) pair, equal in float32 and float64 alike;
each case checks after generation that it does what it says:

* `routing_ties`: ties where the tie-break decides. Renormalize / Llama-4: k - 1 clear winners, then three
  local experts with one equal logit for the last slot; the last token has every logit equal (a complete
  tie: experts 0 .. k - 1). Grouped routing (the local block in the middle of the groups): tokens cycle
  through a group tie for the last kept group against a group below the local one, one against a group
  above it, and a top-k tie inside the local group; the last token has all-equal logits (routed by the
  bias alone). The lowest id must win; the highest-id convention routes other local experts;
* `extreme_magnitudes`: every logit +-100 (softmax must subtract the max; sigmoid saturates to 1 and to a
  float32 subnormal) with every token choosing the same experts (one-hot for renormalize; on an
  expert-parallel rank exactly one local expert, which receives every token); hidden states 256x larger
  (gate values of several hundred, past float32's exp overflow in silu's sigmoid); and with fp8 block
  scales, each 128-block of codes from one of three regimes: the usual 0.125..1.875, the top of e4m3
  (128..448) or its subnormals (m * 2^-9), its scale compensating (scales ~1e-5 .. 1e2, values O(1)).

Only the experts some token reaches (under either tie-break) get weights; the others are zero (`_live_experts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..semantics import Routing, declared_routing, moe_quant, moe_routing, routing_params
from ..status import GroundTruthUnavailable
from .common import (
    FP8_CODE_RMS,
    Builder,
    log_uniform,
    normal,
    permutation,
    randint,
    random_tensor,
    random_words,
    uniform,
)

OP_TYPES = ("moe",)
ROWS = {"small": 2, "medium": 8, "large": 64}
CASES = ("single_token", "no_local_tokens")
TIES, EXTREMES = "routing_ties", "extreme_magnitudes"
TIE_ROWS = 4  # routing_ties has at least this many tokens: each tie type and the all-equal token
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
BLOCK_SIZE = 128  # fp8 block scales: 1 x 128 for the activations, 128 x 128 for the weights

# boundary cases (see the module docstring)
WINNER, TIE, LOW = 4.0, 1.0, -6.0  # plain top-k: winners ~ WINNER + 0.25 N, the tie pool exactly TIE, the rest LOW + N
DS_WINNER, DS_LOW = 6.0, -8.0  # grouped: sigmoid 0.998+ and < 0.02
# the grouped tie: logit 6 with bias -0.5 (both exact) scores 0.4975, between the winners (>= 0.59) and the rest
# (<= 0.32), while its unbiased weight is a winner's: the tied expert's share of the output is not small
DS_TIE, DS_TIE_BIAS = 6.0, -0.5
DS_BIAS_CLAMP = 0.3  # routing cases: |bias| <= this, so winner > tie > the rest, whatever the draw
TIE_POOL = 3  # experts sharing the score at the last slot
SPREAD = 100.0  # extreme_magnitudes: logits +-this; exp(100) overflows float32
LARGE_ACTIVATIONS = 256.0
FP8_TOP_RMS, FP8_SUBNORMAL_RMS = 293.503, 0.0081705  # rms of the e4m3 codes 128..448 and m * 2^-9, m = 0..7
# regime -> (and mask, or mask) on a random byte: 0 the usual exponent field 4..7, 1 field 14..15, 2 field 0
FP8_REGIMES = ((0x9F, 0x20, FP8_CODE_RMS), (0x8F, 0x70, FP8_TOP_RMS), (0x87, 0x00, FP8_SUBNORMAL_RMS))

LOGITS, BIAS, HIDDEN, ROUTED = "routing_logits", "routing_bias", "hidden_states", "topk_ids"
# per-expert output scales of a per-tensor fp8 MoE -> the weight whose GEMM output each scales
OUTPUT_SCALES = {"output1_scales_scalar": "gemm1_weights", "output1_scales_gate_scalar": "gemm1_weights",
                 "output2_scales_scalar": "gemm2_weights"}
OFFSET, SCALING = "local_expert_offset", "routed_scaling_factor"

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def edge_cases(definition) -> list[str]:
    """no_local_tokens needs experts on other ranks: without expert parallelism every token is local.
    routing_ties needs router logits and a routing these generators can steer (a grouped layout they fit:
    `_layout`); extreme_magnitudes hidden states (its routing part: router logits)."""
    ax = definition.const_axes
    cases = list(CASES)
    if OFFSET not in definition.inputs or ROUTED in definition.inputs or (
            "num_local_experts" in ax and "num_experts" in ax and ax["num_local_experts"] >= ax["num_experts"]):
        cases.remove("no_local_tokens")
    kind = _routing_kind(definition)
    lay = _layout(definition) if kind == "deepseek" else None
    if kind == "plain" or (lay is not None and _feasible(lay, TIES)):
        cases.append(TIES)
    if HIDDEN in definition.inputs and (kind != "deepseek" or (lay is not None and _feasible(lay, EXTREMES))):
        cases.append(EXTREMES)
    return cases


def route(logits: torch.Tensor, bias: torch.Tensor | None, r: Routing, *, highest: bool = False) -> torch.Tensor:
    """Selected expert ids [T, top_k]: DeepSeek-V3 grouped routing when bias and groups are
    known (sigmoid + bias, groups ranked by their best two, top-k inside the best groups),
    else plain top-k of the logits. Equal scores go to the lowest id (the definitions' convention, a
    stable sort); `highest`: to the highest (the other convention: what the tie cases must tell apart)."""
    if highest:  # reversed expert order: the stable sort then prefers the highest id, groups included
        e = logits.shape[-1]
        return e - 1 - route(logits.flip(-1), None if bias is None else bias.flip(0), r)
    if bias is None or r.n_group is None or r.topk_group is None:
        return _ranked(logits.float(), r.top_k)
    t, e = logits.shape
    biased = torch.sigmoid(logits.float()) + bias.float()
    per_group = e // r.n_group
    group_score = biased.view(t, r.n_group, per_group).topk(min(2, per_group), dim=-1).values.sum(-1)
    groups = _ranked(group_score, r.topk_group)
    keep = torch.zeros(t, r.n_group, dtype=torch.bool).scatter_(1, groups, True)
    masked = biased.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
    return _ranked(masked, r.top_k)


def _ranked(scores: torch.Tensor, k: int) -> torch.Tensor:
    return scores.sort(dim=-1, descending=True, stable=True).indices[:, :k]


def _routing_kind(definition) -> str | None:
    """"deepseek" (sigmoid + bias, grouped), "plain" (top-k by logit: renormalize, Llama-4) or None (pre-routed,
    or a routing semantics.moe_routing does not know)."""
    if LOGITS not in definition.inputs:
        return None
    try:
        kind = moe_routing(definition).kind
    except GroundTruthUnavailable:
        return None
    return "deepseek" if kind == "deepseek" else "plain" if kind in ("renormalize", "llama4") else None


def _has_block_scales(definition) -> bool:
    return "gemm1_weights" in definition.inputs and moe_quant(definition) == "fp8-block"


@dataclass(frozen=True)
class Layout:
    """A grouped routing's shape, from the definition's const axes: what the DeepSeek boundary cases steer."""
    experts: int
    groups: int
    size: int  # experts per group
    kept: int  # topk_group
    top_k: int
    local: int  # local experts

    def local_groups(self, offset: int) -> list[int]:
        return sorted({e // self.size for e in range(offset, offset + self.local)})

    def middle_offset(self) -> int:
        """The local block nearest the middle: groups exist on both sides of it (routing_ties)."""
        return self.local * ((self.experts // self.local) // 2)


def _layout(definition) -> Layout | None:
    r = routing_params(definition)
    ax = definition.const_axes
    logits_axis = (definition.inputs[LOGITS].shape or [None, None])[-1]
    experts = ax.get(logits_axis)
    local = ax.get("num_local_experts", experts if OFFSET not in definition.inputs else None)
    if r is None or r.n_group is None or r.topk_group is None or experts is None or local is None:
        return None
    size = experts // r.n_group
    if experts % r.n_group or size < 2 or experts % local or not (local % size == 0 or size % local == 0):
        return None
    return Layout(experts, r.n_group, size, r.topk_group, r.top_k, local)


def _winner_groups(lay: Layout, count: int, exclude: list[int], groups: int | None = None) -> list[int] | None:
    """`count` expert ids in groups outside `exclude`, at least two per group (a group with one high expert
    is not sure to be kept), `groups` of them or as few as fit; None where they do not fit."""
    free = [g for g in range(lay.groups) if g not in exclude]
    n = groups if groups is not None else max(1, -(-count // lay.size))
    if count == 0:
        return []
    if n < 1 or n > min(len(free), lay.kept - 1) or count < 2 * n or count > n * lay.size:
        return None
    per = [count // n + (i < count % n) for i in range(n)]
    return [free[i] * lay.size + j for i in range(n) for j in range(per[i])]


def _feasible(lay: Layout, case: str) -> bool:
    """Whether the grouped layout leaves room for the case's construction (`_deepseek_logits`): local groups
    with groups below and above them (the middle block), three local experts in one group, k - 1 winners in
    exactly topk_group - 1 other groups (two at least in each)."""
    offset = lay.middle_offset()
    local_groups = lay.local_groups(offset)
    pool = min(lay.local, lay.size)
    if case == TIES:
        below = [g for g in range(local_groups[0]) if g not in local_groups]
        above = [g for g in range(local_groups[-1] + 1, lay.groups)]
        if not below or not above or pool < TIE_POOL:
            return False
        return _winner_groups(lay, lay.top_k - 1, [*local_groups, below[-1], above[0]], lay.kept - 1) is not None
    return pool >= 2 and _winner_groups(lay, lay.top_k - 1, local_groups) is not None


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
        raise b.mismatch(f"the moe generator does not know input(s) {', '.join(extra)}")
    routing = LOGITS if LOGITS in d.inputs else ROUTED if ROUTED in d.inputs else None
    if routing is None:
        raise b.error(f"a moe definition needs a {LOGITS!r} input (or pre-routed {ROUTED!r})")

    rows = 1 if b.case == "single_token" else max(TIE_ROWS, ROWS[b.size]) if b.case == TIES else b.count(ROWS[b.size])
    b.set_dim(routing, 0, rows)
    if HIDDEN in d.inputs:
        b.set_dim(HIDDEN, 0, rows)
    num_local = _num_local_experts(b, weights)
    num_experts = b.dim(LOGITS, -1) if routing == LOGITS else num_local
    if num_local < 1 or num_local > num_experts:
        raise b.error(f"{num_local} local experts of {num_experts}: cannot place them")
    if OFFSET in d.inputs:
        offset = num_local * int(randint(0, num_experts // num_local, (1,), b.rng(OFFSET)))
        if b.case in (TIES, EXTREMES) and _routing_kind(d) == "deepseek" and (lay := _layout(d)) is not None:
            offset = lay.middle_offset()  # groups on both sides of the local ones
        elif b.case == TIES:  # the all-equal token picks experts 0 .. k - 1: make them local
            offset = 0
        b.put_scalar(OFFSET, offset)
    elif num_local == num_experts:  # no offset input: every expert is local (the public Qwen-style files)
        offset = 0
    else:
        raise b.error(f"no {OFFSET!r} input, yet {num_local} local experts of {num_experts}: which are local?")
    if SCALING in d.inputs:
        b.put_scalar(SCALING, ROUTED_SCALING_FACTOR)

    bias = None
    if BIAS in d.inputs:  # drawn first: the grouped boundary cases set some of it
        bias = b.put_random(BIAS, scale=ROUTING_BIAS_STD)
    if routing == LOGITS:
        if b.case in (TIES, EXTREMES) and _routing_kind(d) is not None:
            logits, bias = _boundary_logits(b, rows, num_experts, offset, num_local, bias)
            if bias is not None:
                b.put(BIAS, bias.to(b.torch_dtype(BIAS)))
        else:
            logits = _steered_logits(b, rows, num_experts, offset, num_local, bias)
        b.put(LOGITS, logits.to(b.torch_dtype(LOGITS)))
    else:
        b.put(ROUTED, _packed_topk(b, rows, num_experts))

    live = _live_experts(b, offset, num_local)  # boundary cases: only the experts some token reaches
    regimes: dict[str, torch.Tensor] = {}  # extreme_magnitudes: each block scale's code regime
    for name in names:
        if name in scales:
            base = name[: -len("_scale")]
            centre = -math.log2(FP8_CODE_RMS)
            if base in weights:
                centre -= 0.5 * math.log2(max(b.dim(base, -1), 1))
            elif b.case == EXTREMES:
                centre += math.log2(LARGE_ACTIVATIONS)
            t = log_uniform(b.shape(name), b.rng(name), centre - SCALE_SPREAD, centre + SCALE_SPREAD,
                            device=b.device)
            if b.case == EXTREMES:
                regimes[base] = randint(0, len(FP8_REGIMES), b.shape(name), b.rng(f"{name}/regime"),
                                        dtype=torch.uint8, device=b.device)
                rms = torch.tensor([r[2] for r in FP8_REGIMES], dtype=torch.float32, device=b.device)
                t = t * (FP8_CODE_RMS / rms)[regimes[base].long()]  # the regime's codes, O(1) again
            b.put(name, t.to(b.torch_dtype(name)))
        elif name in output_scales:
            b.put(name, _output_scale(b, name, fp8))
    for name in names:
        expert_major = name in weights and len(b.spec(name).shape or ()) == 3
        if name in regimes:
            b.put(name, _fp8_regime_codes(b, name, regimes[name], live if expert_major else None))
        elif name in fp8 or name in weights or name == HIDDEN:
            # fp8 codes ignore the scale (their block scales carry it); bf16 weights are N(0, 1/K)
            k = b.dim(name, -1)
            scale = 1.0 / math.sqrt(max(k, 1)) if name in weights else 1.0
            if name == HIDDEN and b.case == EXTREMES:
                scale = LARGE_ACTIVATIONS
            if expert_major and live is not None:
                b.put(name, _live_weights(b, name, live, scale))
            else:
                b.put_random(name, scale=scale)

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


# draws of the routing logits before a case gives up on reaching a local expert (each draw misses with
# probability about 3/8 on a 2-token DeepSeek case whose local experts are one group of eight)
ROUTING_DRAWS = 16


def _steered_logits(b: Builder, rows: int, num_experts: int, offset: int, num_local: int,
                    bias: torch.Tensor | None) -> torch.Tensor:
    """_routing_logits, drawn again from a stream of its own (`routing_logits/1`, ...) while no token reaches a
    local expert: grouped routing picks groups by their best experts' scores plus bias, so a steered token's
    boost can still lose its group to the others (seeds 5 and 7 of a DeepSeek e32 case did). The first draw is
    the one every other seed keeps; `_check_routing` still fails loudly if none of the draws reaches."""
    r = routing_params(b.definition)
    for attempt in range(ROUTING_DRAWS):
        logits = _routing_logits(b, rows, num_experts, offset, num_local, attempt)
        if r is None or b.case == "no_local_tokens":
            return logits
        used = None if _routing_kind(b.definition) == "plain" or bias is None else bias.cpu()
        chosen = route(logits.to(b.torch_dtype(LOGITS)).cpu(), used, r)  # as _check_routing will see them
        if bool(((chosen >= offset) & (chosen < offset + num_local)).any()):
            return logits
    return logits


def _routing_logits(b: Builder, rows: int, num_experts: int, offset: int, num_local: int,
                    attempt: int = 0) -> torch.Tensor:
    """Router logits: N(0, 1), then steered (see the module docstring).

    A steered token boosts 2..3 experts of a small hot set of local experts and suppresses the
    other local experts, so it sends (almost always exactly) that many choices to this rank. The hot set is
    shared by all tokens of the case: experts receive several tokens (the grouped GEMM's M > 1
    path), and the reference, which dequantises every local expert it meets, stays fast. Unsteered
    tokens route freely and may or may not land here.
    """
    g = b.rng(LOGITS if attempt == 0 else f"{LOGITS}/{attempt}")
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
    logits, bias = b.values[LOGITS].cpu(), bias.cpu() if isinstance(bias, torch.Tensor) else None
    if _routing_kind(b.definition) == "plain":
        bias = None  # Llama-4's routing_bias input is ignored
    chosen = route(logits, bias, r)
    is_local = (chosen >= offset) & (chosen < offset + num_local)
    local = int(is_local.sum())
    if b.case == "no_local_tokens" and local:
        raise b.error(f"no_local_tokens: {local} routing choice(s) still reach the local experts")
    if b.case != "no_local_tokens" and not local:
        raise b.error("no token is routed to a local expert: the case would test nothing")
    if b.case == TIES:  # the tie must decide something here: the other convention routes otherwise
        other = route(logits, bias, r, highest=True)
        other_local = (other >= offset) & (other < offset + num_local)
        mine = [set(row[m].tolist()) for row, m in zip(chosen, is_local, strict=True)]
        theirs = [set(row[m].tolist()) for row, m in zip(other, other_local, strict=True)]
        if mine == theirs:
            raise b.error(f"{b.case}: the lowest- and the highest-id tie-breaks route the same local experts")
    if b.case == EXTREMES and any(set(row.tolist()) != set(chosen[0].tolist()) for row in chosen):
        raise b.error(f"{EXTREMES}: the tokens do not all choose the same experts")


# -- the boundary routing cases ---------------------------------------------------------------------
def _boundary_logits(b: Builder, rows: int, num_experts: int, offset: int, num_local: int,
                     bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits, bias) of a routing case, bias None where the definition has none (module docstring)."""
    if _routing_kind(b.definition) == "deepseek":
        lay = _layout(b.definition)
        if lay is None or not _feasible(lay, b.case):
            raise b.error(f"{b.case}: the grouped routing's layout leaves no room for the case")
        return _deepseek_logits(b, lay, rows, offset, bias)
    r = routing_params(b.definition)
    return _plain_logits(b, r.top_k, rows, num_experts, offset, num_local), bias


def _local_pick(b: Builder, offset: int, num_local: int, n: int, tag: str) -> list[int]:
    """n distinct local experts, in a random order of the seed's."""
    return (offset + permutation(num_local, b.rng(tag))[:n]).tolist()


def _plain_logits(b: Builder, k: int, rows: int, num_experts: int, offset: int, num_local: int) -> torch.Tensor:
    """Top-k by logit (renormalize, Llama-4)."""
    g = b.rng(LOGITS)
    local = _local_pick(b, offset, num_local, num_local, "hot")
    if b.case == EXTREMES:  # one-hot: the same local winner at +100 for every token, every other logit -100
        logits = torch.full((rows, num_experts), -SPREAD)
        logits[:, local[0]] = SPREAD
        return logits
    # routing_ties: k - 1 winners, then TIE_POOL local experts with exactly TIE for the last slot; the last
    # token has every logit equal
    logits = normal((rows, num_experts), g) + LOW
    pool, rest = local[:TIE_POOL], local[TIE_POOL:]
    if len(pool) < 2:
        raise b.error(f"{TIES} needs two local experts at least")
    remote = [e for e in range(num_experts) if not offset <= e < offset + num_local]
    winners = (rest if len(rest) >= k - 1 else remote)[: k - 1]
    if len(winners) < k - 1:
        raise b.error(f"{TIES}: no room for {k - 1} winners")
    logits[:, winners] = WINNER + 0.25 * normal((rows, len(winners)), g)
    logits[:, pool] = TIE
    logits[-1] = 0.0
    return logits


def _deepseek_logits(b: Builder, lay: Layout, rows: int, offset: int,
                     bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped routing (sigmoid + bias, the best groups by their top two, top-k inside): winners in groups
    other than the local ones (two at least per group), the local block (in the middle) steered per case."""
    g = b.rng(LOGITS)
    k = lay.top_k
    bias = bias.float().clamp(-DS_BIAS_CLAMP, DS_BIAS_CLAMP).cpu()
    local_groups = lay.local_groups(offset)
    in_group = [e for e in range(offset, offset + lay.local) if e // lay.size == local_groups[0]]
    local = [in_group[i] for i in permutation(len(in_group), b.rng("hot")).tolist()]
    if b.case == EXTREMES:  # the same k winners at +100 for every token, one of them local; the rest -100
        one, anchor = local[0], local[1]
        winners = _winner_groups(lay, k - 1, local_groups)
        logits = torch.full((rows, lay.experts), -SPREAD)
        logits[:, [one, anchor, *winners]] = SPREAD
        bias[anchor] = DS_TIE_BIAS  # keeps the local group, below every winner: never chosen
        return logits, bias
    # routing_ties: tokens cycle through (0) a group tie against the group below the local ones, (1) against
    # the group above, (2) a top-k tie among three local experts; the last token's logits are all equal.
    # k - 1 winners hold topk_group - 1 groups; the tie experts (logit 6, bias -0.5) score 0.4975, below them
    below = [x for x in range(local_groups[0]) if x not in local_groups][-1]
    above = local_groups[-1] + 1
    winners = _winner_groups(lay, k - 1, [*local_groups, below, above], lay.kept - 1)
    logits = normal((rows, lay.experts), g) + DS_LOW
    logits[:, winners] = DS_WINNER + 0.25 * normal((rows, k - 1), g)
    pool = local[:TIE_POOL]
    logits[:, pool], bias[pool] = DS_TIE, DS_TIE_BIAS
    twins = {x: [x * lay.size, x * lay.size + 1] for x in (below, above)}
    for x in twins.values():
        bias[x] = DS_TIE_BIAS
    for t in range(rows - 1):
        if t % 3 < 2:  # the other group's two experts tie the local group's two best
            logits[t, twins[below if t % 3 == 0 else above]] = DS_TIE
    logits[-1] = 0.0
    return logits, bias


def _live_experts(b: Builder, offset: int, num_local: int) -> list[int] | None:
    """The boundary cases' local experts (0-based) that some token reaches, under either tie-break for the
    tie cases; None for the others (every expert's weights drawn). A boundary case reaches a few experts, and
    drawing all of them (400M bf16 normals for 512 experts) would cost more than everything else: the rest
    get zero weights, which no correct kernel reads into a token's output."""
    if b.case not in (TIES, EXTREMES):
        return None
    if LOGITS in b.values:
        r = routing_params(b.definition)
        if r is None:
            return None
        bias = b.values.get(BIAS) if _routing_kind(b.definition) == "deepseek" else None
        logits, bias = b.values[LOGITS].cpu(), None if bias is None else bias.cpu()
        ids = route(logits, bias, r)
        if b.case == TIES:
            ids = torch.cat([ids, route(logits, bias, r, highest=True)], dim=1)
    else:
        ids = torch.div(b.values[ROUTED].cpu().to(torch.int64), 1 << 16, rounding_mode="floor")
    return sorted({e - offset for e in ids.flatten().tolist() if offset <= e < offset + num_local})


def _live_weights(b: Builder, name: str, live: list[int], scale: float) -> torch.Tensor:
    """An [experts, N, K] weight with the live experts drawn (one stream each) and the rest zero."""
    shape = b.shape(name)
    dtype = b.torch_dtype(name)
    out = torch.zeros(shape, dtype=torch.uint8 if dtype in _FP8 else dtype, device=b.device)
    out = out.view(dtype) if dtype in _FP8 else out
    for e in live:
        out[e] = random_tensor(shape[1:], b.spec(name).dtype, b.rng(f"{name}/{e}"), scale=scale, device=b.device)
    return out


def _fp8_regime_codes(b: Builder, name: str, regime: torch.Tensor, live: list[int] | None) -> torch.Tensor:
    """extreme_magnitudes: fp8 codes straight from random bytes, each 128-block masked into its regime's exponent
    range (FP8_REGIMES); e4m3's NaN code (0x7F) becomes 448. `regime` has the block scale's shape:
    [hidden blocks, tokens] for the activations (stored transposed), [experts, row blocks, column blocks]
    for the weights. Made one leading slice at a time: a weight is a gigabyte of codes."""
    shape = b.shape(name)
    masks = torch.tensor([[r[0], r[1]] for r in FP8_REGIMES], dtype=torch.uint8, device=b.device)
    g = b.rng(name)
    if name == HIDDEN:
        regime = regime.T  # [tokens, hidden blocks]
    lead = shape[0] if len(shape) == 3 else 1
    out = torch.empty(shape, dtype=torch.uint8, device=b.device).view(lead, *shape[-2:])
    rows, cols = shape[-2:]
    blocks = regime.reshape(lead, regime.shape[-2], regime.shape[-1]).long()
    for i in range(lead):
        if live is not None and i not in live:  # an expert no token reaches: zero codes (see _live_experts)
            out[i] = 0
            continue
        n = rows * cols
        words = random_words(-(-n // 8), b.rng(f"{name}/{i}") if live is not None else g, device=b.device)
        codes = words.view(torch.uint8)[:n].reshape(rows, cols).clone()
        per_block = masks[blocks[i]]  # [row blocks, col blocks, 2]
        row_block = 1 if name == HIDDEN else BLOCK_SIZE
        expand = per_block.repeat_interleave(row_block, 0).repeat_interleave(BLOCK_SIZE, 1)[:rows, :cols]
        codes.bitwise_and_(expand[..., 0]).bitwise_or_(expand[..., 1])
        codes -= ((codes & 0x7F) + 1) >> 7  # 0x7F / 0xFF (NaN) -> 0x7E / 0xFE (+-448)
        out[i] = codes
    return out.view(shape).view(b.torch_dtype(name))
