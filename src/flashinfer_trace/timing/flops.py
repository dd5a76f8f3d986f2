"""FLOPs of one call of a definition, per op_type (multiply and add count as two), from the definition and the
generated inputs (shapes, and the index tensors' values); roofline.work adds the bytes.

* gemm: 2 * M * N * K (C[M, N] = A[M, K] @ B[N, K]^T);
* gqa_paged, gqa_ragged: sum over requests of 2 * heads * pairs * (head_dim_qk + head_dim_vo),
  which is 4 * heads * head_dim * pairs for the shipped definitions; pairs = the (query, key) pairs
  the mask lets through: all qo_len * kv_len of them for decode and non-causal prefill, and for
  causal prefill (a definition of stage prefill with "causal" in its name) the bottom-right
  aligned triangle: query i of q (at position kv_len - q + i) sees keys 0..kv_len - q + i, so
  pairs = q * (kv_len - q) + q * (q + 1) / 2 when q <= kv_len;
* trtllm_paged: the same sum per request, pairs from cum_seq_lens_q and seq_lens (causal bottom-right; ragged:
  a square of each request's tokens; decode: seq_lens), the caches' bytes those of the seq_lens tokens;
* xqa: 4 * heads * head_dim * pairs, pairs = each request's seq_lens (capped by a window of window_left + 1),
  the caches counted by the keys read;
* single_decode, single_prefill: the same sum for their one request (q [heads, dim] is one query; k
  and v [kv_len, kv_heads, dim]);
* mla_paged: 2 * heads * pairs * (ckv_dim + kpe_dim) for the scores plus 2 * heads * pairs * ckv_dim
  for the values (the absorbed form: keys [ckv | kpe], values ckv);
* moe: for each routed (token, local expert) pair, 2 * H * G1 + 2 * I * H with G1 = gemm1's output
  width (2 * I: [up; gate]); the activation, routing and weighted sum are left out (O(T * H));
* rmsnorm: 4 per element of hidden_states (square, sum, scale by 1/rms, multiply by the weight),
  5 for a fused add + norm (the add); a Gemma norm adds hidden_size (its scale 1 + w, formed once per
  channel); memory bound either way;
* rope: 3 per rotated element (x * cos, y * sin, their sum) over query and key, rotary_dim / head_dim
  of each head being rotated;
* activation (silu_and_mul): 5 per output element (exp counted as 1: -x, exp, 1 + e, x / (..) and
  the multiply by the up half);
* mamba_ssu: 7 per element of the state rows live requests update (dt * A, its exp, the decay of the
  old state, dt x times B, the add, times C and the sum over dstate); only those rows of the state
  cache are counted as read, and written back (the update is in place);
* gdn (gated delta rule): 7 * V * K per token and value head (decay, S k, the rank-1 update u k^T,
  S q); bytes as above, so an MTP call counts its whole state pool (read, and the unchanged pool
  written) and the intermediate-state buffer when the definition has one;
* sampling: a rough 1 + 2 * filters per probability (one pass to draw, a compare and an
  accumulate per top-k / top-p / min-p filter), and 2 more for a sampler of logits (the softmax's exp and
  sum); sorting and rejection rounds are not modelled. Chain speculative sampling: 2 per draft token (the
  test's multiply and compare) and 6 per element of the one target row (and draft row) at the stop, in the
  kernel's two passes over it (subtract, relu, accumulate: the residual's sum, then the draw); bytes: that row of
  each per request (its draft / target tensors counted 1 / n and 1 / (n + 1)), the token ids and the outputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..definition import Definition, TensorSpec
    from ..inputs import Inputs

CHAIN_INPUTS = frozenset({"draft_probs", "draft_token_ids", "target_probs"})  # chain speculative sampling
PAGED_CACHES = ("k_cache", "v_cache", "ckv_cache", "kpe_cache")


def _numel(spec: TensorSpec, axes: Mapping[str, int]) -> int:
    return math.prod(int(axes[a]) for a in spec.shape) if spec.shape else 1


def _ints(value: Any) -> list[int]:
    """A 1-d index tensor (any device) or sequence as Python ints."""
    if hasattr(value, "tolist"):
        out = value.tolist()
        return [int(v) for v in (out if isinstance(out, list) else [out])]
    return [int(v) for v in value]


def _diffs(indptr: list[int]) -> list[int]:
    return [b - a for a, b in zip(indptr[:-1], indptr[1:], strict=True)]


# -- attention structure -----------------------------------------------------------------------------
def visible_pairs(qo_len: int, kv_len: int, causal: bool) -> int:
    """(query, key) pairs one request computes. Causal masks are bottom-right aligned: query i of
    qo_len sits at kv position kv_len - qo_len + i and sees keys 0..that position."""
    if qo_len <= 0 or kv_len <= 0:
        return 0
    if not causal:
        return qo_len * kv_len
    if qo_len <= kv_len:
        return qo_len * (kv_len - qo_len) + qo_len * (qo_len + 1) // 2
    return kv_len * (kv_len + 1) // 2  # the first qo_len - kv_len queries see nothing


def _page_size(definition: Definition) -> int:
    return int(definition.const_axes.get("page_size", 1))


def _paged_lengths(values: Mapping[str, Any], page: int, suffix: str = "") -> list[int]:
    """Per segment of a paged table, its tokens: full pages but the last, which holds kv_last_page_len (full
    where the definition has no such input)."""
    pages = _diffs(_ints(values["kv_indptr" + suffix]))
    name = "kv_last_page_len" + suffix
    last = _ints(values[name]) if name in values else [page] * len(pages)
    return [(n - 1) * page + last[b] if n > 0 else 0 for b, n in enumerate(pages)]


def _kv_lengths(definition: Definition, values: Mapping[str, Any]) -> list[int]:
    """Per request, the kv tokens it attends to: page counts from kv_indptr turned into tokens for
    paged caches (full pages unless a kv_last_page_len input says how full the last one is),
    token counts from kv_indptr for ragged kv."""
    counts = _diffs(_ints(values["kv_indptr"]))
    if not any(n in definition.inputs for n in PAGED_CACHES):
        return counts
    return _paged_lengths(values, _page_size(definition))


def _qo_lengths(values: Mapping[str, Any], batch: int) -> list[int]:
    if "qo_indptr" in values:
        return _diffs(_ints(values["qo_indptr"]))
    return [1] * batch  # decode: one query token per request


def _is_causal(definition: Definition) -> bool:
    from .. import semantics as sem

    return sem.is_causal(definition)


# -- moe routing -------------------------------------------------------------------------------------
def _moe_active_experts(definition: Definition, values: Mapping[str, Any], num_local: int
                        ) -> tuple[int, int, str]:
    """(local experts with >= 1 token, routed (token, local expert) pairs, how it was decided)."""
    from .. import semantics as sem
    from ..groundtruth.base import GroundTruthUnavailable
    from ..groundtruth.torch_ref import route

    try:
        r = sem.moe_routing(definition)
        ids, _ = route(definition, dict(values))
    except (GroundTruthUnavailable, KeyError) as e:
        return num_local, 0, f"routing unknown ({e}): every local expert counted, no routed pairs"
    offset = int(values.get("local_expert_offset", 0))
    flat = [e - offset for e in _ints(ids.flatten()) if offset <= e < offset + num_local]
    how = f"{r.kind} routing top_k={r.top_k}" + (f" n_group={r.n_group} topk_group={r.topk_group}"
                                                 if r.kind == "deepseek" else "")
    return len(set(flat)), len(flat), f"{how}, local experts [{offset}, {offset + num_local})"


# -- bytes --------------------------------------------------------------------------------------------
def _shape(definition: Definition, inputs: Inputs, name: str) -> list[int]:
    return [int(inputs.axes[a]) for a in definition.inputs[name].shape]


def _mamba_rows(values: Mapping[str, Any], rows: int) -> tuple[int, int]:
    """(live requests, cache rows) of a mamba_ssu call: PAD_SLOT_ID (-1) requests touch no row."""
    idx = values.get("state_batch_indices")
    if idx is None:
        return rows, rows
    return int((idx >= 0).sum()), rows


def _flops_mamba(d: Definition, inputs: Inputs, detail: dict) -> int:
    x = _shape(d, inputs, "x")
    dstate = int(inputs.values["state"].shape[-1])
    live, _ = _mamba_rows(inputs.values, x[0])
    n = live * math.prod(x[1:]) * dstate
    detail["flops_formula"] = (f"7 * live state elements = 7 * {n} (dt * A, exp, decay * S, dt x * B, +, * C, sum; "
                               f"{live} live requests)")
    return 7 * n


def _flops_gemm(d: Definition, inputs: Inputs, detail: dict) -> int:
    ax = inputs.axes
    if all(k in ax for k in ("M", "N", "K")):
        m, n, k = int(ax["M"]), int(ax["N"]), int(ax["K"])
    else:  # A [M, K], B [N, K]
        (m, k), n = _shape(d, inputs, "A")[-2:], _shape(d, inputs, "B")[-2]
    detail["flops_formula"] = f"2 * M * N * K = 2 * {m} * {n} * {k}"
    return 2 * m * n * k


def _flops_bmm(d: Definition, inputs: Inputs, detail: dict) -> int:
    """A [batch, M, K] @ B [batch, K, N]: a multiply-add per (batch, m, n, k); the per-tensor scales are one
    multiply per output, left out."""
    batch, m, k = _shape(d, inputs, "A")
    n = _shape(d, inputs, "B")[-1]
    detail["flops_formula"] = f"2 * batch * M * N * K = 2 * {batch} * {m} * {n} * {k}"
    return 2 * batch * m * n * k


def _flops_segment_gemm(d: Definition, inputs: Inputs, detail: dict) -> int:
    """Each row of x times its segment's K x N weight: a multiply-add per (row, k, n); empty segments cost none."""
    rows, k = _shape(d, inputs, "x")
    n = int(inputs.axes["N"]) if "N" in inputs.axes else _shape(d, inputs, "output")[-1]
    detail["flops_formula"] = f"2 * total_rows * K * N = 2 * {rows} * {k} * {n}"
    return 2 * rows * k * n


def _flops_gemm_fp8(d: Definition, inputs: Inputs, detail: dict) -> int:
    """input [M, K] @ weight [N, K]^T: a multiply-add per (m, n, k); the block scales (two multiplies and an add per
    output per 128-wide K block) are left out."""
    m, k = _shape(d, inputs, "input")
    n = _shape(d, inputs, "weight")[0]
    detail["flops_formula"] = f"2 * M * N * K = 2 * {m} * {n} * {k}"
    return 2 * m * n * k


def _attention_pairs(d: Definition, inputs: Inputs, detail: dict) -> int:
    values = inputs.values
    kv = _kv_lengths(d, values)
    qo = _qo_lengths(values, len(kv))
    causal = _is_causal(d)
    pairs = sum(visible_pairs(q, k, causal) for q, k in zip(qo, kv, strict=True))
    detail.update(requests=len(kv), causal=causal, visible_pairs=pairs, qo_lens=qo, kv_lens=kv)
    return pairs


def _flops_gqa(d: Definition, inputs: Inputs, detail: dict) -> int:
    pairs = _attention_pairs(d, inputs, detail)
    heads, dqk = _shape(d, inputs, "q")[-2:]
    vname = "v_cache" if "v_cache" in d.inputs else "v"
    dvo = _shape(d, inputs, vname)[-1] if vname in d.inputs else dqk
    mask = "bottom-right causal" if detail["causal"] else "all keys"
    detail["flops_formula"] = (f"sum over requests of 2 * heads * pairs * (head_dim_qk + head_dim_vo) = "
                               f"2 * {heads} * {pairs} * ({dqk} + {dvo}) (pairs: {mask})")
    return 2 * heads * pairs * (dqk + dvo)


def _flops_single(d: Definition, inputs: Inputs, detail: dict) -> int:
    """single_decode / single_prefill: one request, q [heads, dim] (one query) or [qo_len, heads, dim], k/v
    [kv_len, kv_heads, dim]: the gqa sum for that request."""
    q, k, v = (inputs.values[n] for n in ("q", "k", "v"))
    qo, kv = (int(q.shape[0]) if q.dim() == 3 else 1), int(k.shape[0])
    causal = _is_causal(d)
    pairs = visible_pairs(qo, kv, causal)
    heads, dqk = int(q.shape[-2]), int(q.shape[-1])
    dvo = int(v.shape[-1])
    detail.update(requests=1, causal=causal, visible_pairs=pairs, qo_lens=[qo], kv_lens=[kv])
    mask = "bottom-right causal" if causal else "all keys"
    detail["flops_formula"] = (f"2 * heads * pairs * (head_dim_qk + head_dim_vo) = 2 * {heads} * {pairs} * "
                               f"({dqk} + {dvo}) (one request; pairs: {mask})")
    return 2 * heads * pairs * (dqk + dvo)


def _flops_mla(d: Definition, inputs: Inputs, detail: dict) -> int:
    pairs = _attention_pairs(d, inputs, detail)
    heads, ckv = _shape(d, inputs, "q_nope")[-2:]
    kpe = _shape(d, inputs, "q_pe")[-1]
    detail["flops_formula"] = (f"2 * heads * pairs * (ckv + kpe) + 2 * heads * pairs * ckv = "
                               f"2 * {heads} * {pairs} * ({ckv} + {kpe}) + 2 * {heads} * {pairs} * {ckv}")
    return 2 * heads * pairs * (ckv + kpe) + 2 * heads * pairs * ckv


def _flops_moe(d: Definition, inputs: Inputs, detail: dict) -> int:
    _, g1, hidden = _shape(d, inputs, "gemm1_weights")
    inter = _shape(d, inputs, "gemm2_weights")[-1]
    if "moe_routed_pairs" not in detail:
        num_local = _shape(d, inputs, "gemm1_weights")[0]
        active, pairs, how = _moe_active_experts(d, inputs.values, num_local)
        detail.update(moe_active_local_experts=active, moe_routed_pairs=pairs, moe_routing=how)
    pairs = detail["moe_routed_pairs"]
    detail["flops_formula"] = (f"routed (token, local expert) pairs * (2 * H * G1 + 2 * I * H) = "
                               f"{pairs} * (2 * {hidden} * {g1} + 2 * {inter} * {hidden})")
    return pairs * (2 * hidden * g1 + 2 * inter * hidden)


def _flops_rmsnorm(d: Definition, inputs: Inputs, detail: dict) -> int:
    from .. import semantics as sem

    shape = _shape(d, inputs, "hidden_states")
    n = math.prod(shape)
    per = 5 if "residual" in d.inputs else 4
    detail["flops_formula"] = f"{per} * elements = {per} * {n}" + (" (4 for the norm + 1 for the add)"
                                                                    if per == 5 else "")
    if sem.gemma_norm(d) is None:
        return per * n
    detail["flops_formula"] += f" + hidden_size = {shape[-1]} (Gemma's scale 1 + w, once per channel)"
    return per * n + shape[-1]


def _flops_layernorm(d: Definition, inputs: Inputs, detail: dict) -> int:
    """Per element: its share of the mean (an add), its deviation (a subtract), the squared deviation summed (a
    multiply-add), the normalisation (a multiply by the row's rsqrt) and the affine (a multiply-add): 7. The
    row's divisions and rsqrt are per row, left out."""
    name = next(n for n in ("hidden_states", "input") if n in d.inputs)
    n = math.prod(_shape(d, inputs, name))
    detail["flops_formula"] = f"7 * elements = 7 * {n} (mean, centre, variance, normalise, scale and shift)"
    return 7 * n


def _flops_topk(d: Definition, inputs: Inputs, detail: dict) -> int:
    """One compare per ranked entry (a radix select reads each entry a bounded number of times; count one): the
    whole row in the dense form, each row's first min(seq_len, width) columns in the varlen form."""
    if "input" in d.inputs:
        n = math.prod(_shape(d, inputs, "input"))
    else:
        width = int(inputs.axes["max_seq_len"])
        n = sum(min(max(int(v), 0), width) for v in inputs.values["seq_lens"].tolist())
    detail["flops_formula"] = f"1 * ranked entries = {n} (a compare each)"
    return n


def _flops_mhc_post(d: Definition, inputs: Inputs, detail: dict) -> int:
    """Per output element (token, new stream, hidden): x times its post weight (a multiply) and the four old streams
    times their comb weights, summed (four multiply-adds): 9."""
    n = math.prod(_shape(d, inputs, "residual"))
    detail["flops_formula"] = f"9 * tokens * hc * hidden = 9 * {n} (one multiply, four multiply-adds)"
    return 9 * n


def _flops_rope(d: Definition, inputs: Inputs, detail: dict) -> int:
    ax = inputs.axes
    frac = (int(ax["rotary_dim"]) / int(ax["head_dim"])) if "rotary_dim" in ax and "head_dim" in ax else 1.0
    rotated = [n for n in d.inputs if n not in ("positions", "cos_sin_cache") and d.inputs[n].shape]
    n = sum(math.prod(_shape(d, inputs, name)) for name in rotated)
    detail["flops_formula"] = f"3 * rotated elements = 3 * {n} * {frac:g} (rotary_dim / head_dim)"
    return round(3 * n * frac)


def _flops_activation(d: Definition, inputs: Inputs, detail: dict) -> int:
    n = sum(_tensor_numel(d, inputs, s) for s in d.outputs.values())
    detail["flops_formula"] = f"5 * output elements = 5 * {n} (silu: -x, exp, +1, divide; times the up half)"
    return 5 * n


def _flops_chain(d: Definition, inputs: Inputs, detail: dict) -> int:
    batch, n, vocab = _shape(d, inputs, "draft_probs")
    detail["flops_formula"] = (f"batch * (2 * n + 6 * vocab) = {batch} * (2 * {n} + 6 * {vocab}) (the n tests; "
                               "two passes of subtract, relu, accumulate over the stop's row)")
    return batch * (2 * n + 6 * vocab)


def _flops_sampling(d: Definition, inputs: Inputs, detail: dict) -> int:
    if CHAIN_INPUTS <= set(d.inputs):
        return _flops_chain(d, inputs, detail)
    name = next((n for n in ("probs", "logits") if n in d.inputs), None)
    n = math.prod(_shape(d, inputs, name)) if name else 0
    filters = sum(1 for f in ("top_k", "top_p", "min_p") if f in d.inputs)
    softmax = 2 if name == "logits" and d.is_sampler else 0  # a sampler of logits: exp and sum first
    per = 1 + 2 * filters + softmax
    detail["flops_formula"] = (f"(1 + 2 * filters{' + 2' if softmax else ''}) * probabilities = {per} * {n} "
                               f"(rough: one draw pass, a compare + accumulate per filter"
                               f"{', exp + sum of the softmax' if softmax else ''})")
    return per * n


def _flops_gdn(d: Definition, inputs: Inputs, detail: dict) -> int:
    """Per token and value head, on the V x K state: decay (1), prediction S k (2), the delta and its
    outer product u k^T added (2 + 2V), output S q (2): 7 * V * K, plus the gates (a few per head, left
    out). MTP and decode rows process batch * seq_len tokens, prefill total_seq_len."""
    v_shape = _shape(d, inputs, "v")
    tokens = math.prod(v_shape[:-2])
    heads, dv = v_shape[-2:]
    dk = _shape(d, inputs, "q")[-1]
    detail["flops_formula"] = (f"7 * tokens * value heads * V * K = 7 * {tokens} * {heads} * {dv} * {dk} "
                               f"(decay, S k, u k^T, S q per token)")
    return 7 * tokens * heads * dv * dk


def _flops_cascade(d: Definition, inputs: Inputs, detail: dict) -> int:
    """Per state and (token, head): its weight exp2(s - max) (a subtraction, an exp2, a sum: 3) and its share of
    the output (a multiply-add per element: 2 * head_dim); the lse's log2 and the division are per row, left out."""
    v = _shape(d, inputs, "v_a" if "v_a" in d.inputs else "v")
    states = 2 if ("v_a" in d.inputs or "v_other" in d.inputs) else v[1]
    rows = math.prod(v[:-1]) // (1 if states == 2 else states)  # (token, head) pairs
    detail["flops_formula"] = (f"states * rows * (2 * head_dim + 3) = {states} * {rows} * (2 * {v[-1]} + 3)")
    return states * rows * (2 * v[-1] + 3)


def _flops_block_sparse(d: Definition, inputs: Inputs, detail: dict) -> int:
    """The gqa sum over the (query, key) pairs the BSR layout lists: block row i's rows (R, the last one short) times
    C keys for each column block it lists."""
    values = inputs.values
    qo, heads, dqk = (int(n) for n in values["q"].shape)
    dvo = int(values["v"].shape[-1])
    r, c = inputs.axes["block_rows"], inputs.axes["block_cols"]
    counts = _diffs(_ints(values["indptr"]))
    pairs = sum(min(r, qo - i * r) * n * c for i, n in enumerate(counts))
    detail.update(visible_pairs=pairs, listed_blocks=sum(counts))
    detail["flops_formula"] = (f"2 * heads * listed pairs * (head_dim_qk + head_dim_vo) = 2 * {heads} * {pairs} * "
                               f"({dqk} + {dvo}) (block rows of {r} queries, column blocks of {c} keys)")
    return 2 * heads * pairs * (dqk + dvo)




def _flops_cascade_attention(d: Definition, inputs: Inputs, detail: dict) -> int:
    """The gqa sum over each level's (query, key) pairs: a level's segments are query ranges over its pages; the
    causal mask, where the definition has one, on the last level only (the wrapper's plan)."""
    values, page = inputs.values, _page_size(d)
    heads, dim = _shape(d, inputs, "q")[-2:]
    levels = sorted(int(n.rsplit("_", 1)[1]) for n in d.inputs if n.startswith("qo_indptr_"))
    causal, pairs = _is_causal(d), 0
    for lvl in levels:
        qo = _diffs(_ints(values[f"qo_indptr_{lvl}"]))
        kv = _paged_lengths(values, page, f"_{lvl}")
        pairs += sum(visible_pairs(q, k, causal and lvl == levels[-1]) for q, k in zip(qo, kv, strict=True))
    detail.update(levels=len(levels), causal=causal, visible_pairs=pairs)
    detail["flops_formula"] = (f"2 * heads * pairs over every level * (head_dim_qk + head_dim_vo) = 2 * {heads} * "
                               f"{pairs} * ({dim} + {dim})")
    return 2 * heads * pairs * 2 * dim


def _flops_pod(d: Definition, inputs: Inputs, detail: dict) -> int:
    """The causal single-request prefill's pairs and one query per decode request over its pages."""
    values = inputs.values
    qo, heads, dim = _shape(d, inputs, "q_p")
    kv = _shape(d, inputs, "k_p")[0]
    prefill = visible_pairs(qo, kv, True)
    decode = sum(_paged_lengths(values, _page_size(d)))
    detail.update(visible_pairs=prefill + decode, prefill_pairs=prefill, decode_pairs=decode)
    detail["flops_formula"] = (f"2 * heads * (prefill pairs + decode pairs) * 2 * head_dim = 2 * {heads} * "
                               f"({prefill} + {decode}) * 2 * {dim}")
    return 2 * heads * (prefill + decode) * 2 * dim


def _flops_trtllm_paged(d: Definition, inputs: Inputs, detail: dict) -> int:
    """The gqa sum over each request's pairs: causal bottom-right prefill (qo_len of its cum_seq_lens_q over its
    seq_lens keys; ragged: a square of its tokens) or one query per decode request over its seq_lens keys."""
    values = inputs.values
    _, heads, dim = _shape(d, inputs, "query")
    if "cum_seq_lens" in values:  # ragged: fresh prompts
        pairs = sum(visible_pairs(n, n, True) for n in _diffs(_ints(values["cum_seq_lens"])))
    elif "cum_seq_lens_q" in values:
        qo = _diffs(_ints(values["cum_seq_lens_q"]))
        pairs = sum(visible_pairs(q, k, True) for q, k in zip(qo, _ints(values["seq_lens"]), strict=True))
    else:
        pairs = sum(_ints(values["seq_lens"]))
    detail.update(visible_pairs=pairs)
    detail["flops_formula"] = f"2 * heads * pairs * 2 * head_dim = 2 * {heads} * {pairs} * 2 * {dim}"
    return 2 * heads * pairs * 2 * dim


def _xqa_keys(d: Definition, values: Mapping[str, Any]) -> list[int]:
    """Per request, the keys its query sees: seq_lens, capped by a window of window_left + 1."""
    lens = _ints(values["seq_lens"])
    window = values.get("window_left")
    return [min(n, int(window) + 1) for n in lens] if window is not None and int(window) >= 0 else lens


def _flops_xqa(d: Definition, inputs: Inputs, detail: dict) -> int:
    """One query per request over the keys it sees: 2 * heads * pairs * 2 * head_dim (scores and values)."""
    batch, heads, dim = _shape(d, inputs, "query")
    pairs = sum(_xqa_keys(d, inputs.values))
    detail["visible_pairs"] = pairs
    detail["flops_formula"] = f"2 * heads * pairs * 2 * head_dim = 2 * {heads} * {pairs} * 2 * {dim}"
    return 2 * heads * pairs * 2 * dim


def _flops_moe_routing(d: Definition, inputs: Inputs, detail: dict) -> int:
    """Per token: a sigmoid and the bias added for every expert (about 5), each group's top-2 sum (2 a group), and
    the chosen experts' weights normalised and scaled (3 each); the selections' comparisons not counted."""
    tokens, experts = _shape(d, inputs, "scores")
    groups = int(dict(t.split("=", 1) for t in d.tag_values("param")).get("n_group", 1))
    out = d.outputs.get("topk_values") or next(iter(d.outputs.values()))
    topk = int(inputs.axes[out.shape[-1]]) if out.shape else 1
    detail["flops_formula"] = (f"tokens * (5 * experts + 2 * groups + 3 * topk) = {tokens} * (5 * {experts} + 2 * "
                               f"{groups} + 3 * {topk})")
    return tokens * (5 * experts + 2 * groups + 3 * topk)


def _flops_page_append(d: Definition, inputs: Inputs, detail: dict) -> int:
    """A copy: no arithmetic on the data. What it computes is each appended token's slot: its page from the
    request's page table (an addition and a division) and the offset in it (a modulo, a multiply-add): 4."""
    tokens = _shape(d, inputs, next(n for n in d.inputs if n.startswith("append")))[0]
    detail["flops_formula"] = f"4 * appended tokens = 4 * {tokens} (the slot's index arithmetic; the copy is bytes)"
    return 4 * tokens


def _flops_dequantize_fp4(d: Definition, inputs: Inputs, detail: dict) -> int:
    """Per element written: the e2m1 value times its block scale, times the global scale (2); the nibble and
    table lookups and the page arithmetic not counted."""
    tokens = int(inputs.values["seq_lens"].long().sum())
    heads = int(inputs.axes["num_kv_heads"])
    dims = int(inputs.axes["k_head_dim"]) + int(inputs.axes["v_head_dim"])
    detail["flops_formula"] = (f"2 * tokens * heads * (k_head_dim + v_head_dim) = 2 * {tokens} * {heads} * {dims}")
    return 2 * tokens * heads * dims


def _tensor_numel(d: Definition, inputs: Inputs, spec: TensorSpec) -> int:
    return _numel(spec, inputs.axes) if spec.shape is not None else 0


DSA_CACHES = ("ckv_cache", "kpe_cache", "k_index_cache_fp8")


def _dsa_slots_read(values: Mapping[str, Any]) -> int:
    """Cache slots a dsa_paged call reads: the distinct selected ones (sparse attention), or every
    token of every request (the indexer scores them all)."""
    if "sparse_indices" in values:
        idx = values["sparse_indices"]
        return int(idx[idx >= 0].unique().numel())
    return int(values["seq_lens"].long().sum())


def _flops_dsa(d: Definition, inputs: Inputs, detail: dict) -> int:
    values = inputs.values
    if "sparse_indices" in values:  # absorbed MLA over each row's selected slots
        pairs = int((values["sparse_indices"] >= 0).sum())
        heads, ckv = _shape(d, inputs, "q_nope")[-2:]
        kpe = _shape(d, inputs, "q_pe")[-1]
        detail.update(visible_pairs=pairs)
        detail["flops_formula"] = (f"2 * heads * selected pairs * (ckv + kpe) + 2 * heads * pairs * ckv = "
                                   f"2 * {heads} * {pairs} * ({ckv} + {kpe}) + 2 * {heads} * {pairs} * {ckv}")
        return 2 * heads * pairs * (ckv + kpe) + 2 * heads * pairs * ckv
    tokens = _dsa_slots_read(values)  # indexer: every token of every request, all heads
    heads, dim = _shape(d, inputs, "q_index_fp8")[-2:]
    detail["flops_formula"] = (f"scored tokens * heads * (2 * head_dim + 3) = {tokens} * {heads} * (2 * {dim} + 3) "
                               f"(dot product, scale, ReLU, weighted sum; the top-k selection not counted)")
    return tokens * heads * (2 * dim + 3)


_FLOPS = {
    "dsa_paged": _flops_dsa,
    "gemm": _flops_gemm,
    "gemm_bf16": _flops_gemm,  # every form has M, N, K axes; tinygemm's bias add (M * N) left out
    "gdn": _flops_gdn,
    "gqa_paged": _flops_gqa,
    "gqa_ragged": _flops_gqa,
    "mla_ragged": _flops_gqa,  # q.k over qk_dim, p.v over vo_dim: the same sum
    "mla_paged": _flops_mla,
    "single_decode": _flops_single,
    "single_prefill": _flops_single,
    "mamba_ssu": _flops_mamba,
    "moe": _flops_moe,
    "rmsnorm": _flops_rmsnorm,
    "layernorm": _flops_layernorm,
    "bmm_fp8": _flops_bmm,
    "gemm_fp8": _flops_gemm_fp8,
    "bmm_bf16": _flops_bmm,
    "segment_gemm": _flops_segment_gemm,
    "block_sparse": _flops_block_sparse,
    "moe_routing": _flops_moe_routing,
    "cascade_attention": _flops_cascade_attention,
    "pod": _flops_pod,
    "mhc_post": _flops_mhc_post,
    "rope": _flops_rope,
    "activation": _flops_activation,
    "sampling": _flops_sampling,
    "cascade_merge": _flops_cascade,
    "page_append": _flops_page_append,
    "dequantize_fp4": _flops_dequantize_fp4,
    "trtllm_paged": _flops_trtllm_paged,
    "xqa": _flops_xqa,
    "topk": _flops_topk,
}


def flops(definition: Definition, inputs: Inputs, detail: dict) -> int:
    """The FLOPs of one call (0, said in `detail`, for an op_type without a model); the formula goes to `detail`."""
    fn = _FLOPS.get(definition.op_type)
    if fn is None:
        detail["flops_formula"] = f"no FLOP model for op_type {definition.op_type!r}: 0"
        return 0
    return int(fn(definition, inputs, detail))
