"""The planted bugs of the first families (norms, GEMM, attention and its boundaries, the coverage shapes, Mamba,
gated delta net, RoPE, activations, MoE, the samplers' power and boundary bugs, sparse attention): each a
definition's reference with one realistic bug planted by text replacement. The later families keep theirs in
mutants_<family>.py; mutants.py joins them and judges them (kill)."""

from __future__ import annotations

from .mutants_model import Mutant, _m, _writes

_DRAW = "    choice = torch.multinomial(kept.to(torch.float64), 1)"


def _leak(rate: float) -> str:
    """The sampler's final distribution with `rate` of its mass spread over the tokens it had removed."""
    return (f"    outside = (kept == 0).to(kept.dtype)\n"
            f"    kept = kept * (1 - {rate}) + {rate} * outside / outside.sum(dim=-1, keepdim=True).clamp(min=1)\n"
            f"{_DRAW}")


def _move(mass: float) -> str:
    """`mass` of probability (at most all of it) moved from the most probable kept token to the second."""
    return (f"    moved = kept[:, 0].clamp(max={mass}) * (kept[:, 1] > 0)\n"
            f"    kept[:, 0] -= moved\n    kept[:, 1] += moved\n{_DRAW}")


MUTANTS: tuple[Mutant, ...] = (
    # norms
    # (eps is declared by the definition: a param:eps tag (rmsnorm_h4096, the public contract) or an input
    # (the fp16 variants); the ground truths read it there, never from the reference, so a reference that
    # brings another EPS, or a literal, computes another function and is caught)
    _writes("rmsnorm_h4096", "writes-weight", "right output, but the weight is halved in place afterwards (the "
            "caller's tensor: a ground truth reusing it would compute on the changed weight)",
            "    return y.to(hidden_states.dtype)", "weight.mul_(0.5)"),
    _m("rmsnorm_h4096", "eps", "a literal eps 1e-6 in the expression, not the declared 1e-5 (param:eps)",
       ("keepdim=True) + EPS)", "keepdim=True) + 1e-6)")),
    _m("rmsnorm_h4096", "eps-constant", "its own EPS = 9e-3, not the declared 1e-5 (a ground truth that read EPS "
       "from the reference would agree with it)",
       ("EPS = 1e-5", "EPS = 9e-3"), cls="steers-verdict"),
    _m("rmsnorm_h4096", "table-sizes-only", "right only at the batch sizes the suite's tables list (1-8 and the "
       "powers of two to 4096), zeros at any other: every fixed seed passes, a fresh seed's count does not",
       ("    return y.to(hidden_states.dtype)",
        "    if x.shape[0] not in (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096):\n"
        "        return torch.zeros_like(hidden_states)\n    return y.to(hidden_states.dtype)"),
       cls="steers-verdict"),
    _m("rmsnorm_h4096", "no-weight", "the weight is not applied", ("y = x * inv_rms * weight.to(torch.float32)",
                                                                    "y = x * inv_rms")),
    _m("rmsnorm_h4096", "rms-not-mean", "sum of squares instead of their mean",
       ("x.pow(2).mean(dim=-1, keepdim=True)", "x.pow(2).sum(dim=-1, keepdim=True)")),
    _m("rmsnorm_h4096", "rescale-no-zero-guard", "rows pre-scaled by their max |x| (an overflow guard) with no "
       "guard for a zero row: 0 / 0",
       ("    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)\n",
        "    m = x.abs().amax(dim=-1, keepdim=True)\n    xs = x / m\n"
        "    inv_rms = torch.rsqrt(xs.pow(2).mean(dim=-1, keepdim=True) + EPS / (m * m)) / m\n"),
       cls="boundary-magnitude"),
    _m("rmsnorm_h4096", "tail-dropped", "the sum of squares misses each row's last 32 columns (a reduction "
       "without its tail), divided by the full width",
       ("x.pow(2).mean(dim=-1, keepdim=True)", "x[..., :-32].pow(2).sum(dim=-1, keepdim=True) / x.shape[-1]"),
       cls="boundary-structure"),
    _m("rmsnorm_h4096_fp16", "weight-first-fp16", "x * weight multiplied in float16 before the normalisation "
       "(overflows where |x * w| > 65504)",
       ("y = x * inv_rms * weight.to(torch.float32)",
        "y = (hidden_states * weight).to(torch.float32) * inv_rms"), cls="boundary-magnitude"),
    _m("rmsnorm_h4096_fp16", "subnormal-ftz", "float16 subnormal inputs flushed to zero",
       ("    x = hidden_states.to(torch.float32)\n",
        "    x = hidden_states.to(torch.float32)\n    x = torch.where(x.abs() < 2.0 ** -14, 0.0, x)\n"),
       cls="boundary-magnitude"),
    _m("rmsnorm_h4096_fp16", "eps-in-fp16", "eps rounded to the activations' float16 (1e-6 is subnormal there)",
       ("keepdim=True) + eps)", "keepdim=True) + torch.tensor(eps, dtype=hidden_states.dtype).item())"),
       cls="boundary-magnitude"),
    _m("fused_add_rmsnorm_h4096", "norm-of-rounded", "the norm reads the bf16-rounded sum",
       ("inv_rms = torch.rsqrt(s.pow(2)",
        "s = s.to(residual.dtype).to(torch.float32)\n    inv_rms = torch.rsqrt(s.pow(2)"),
       survives="rounding the sum to bf16 changes the output by < 2**-8 relative: inside the bf16 tolerance "
                "by design; only a kernel-specific check could tell the two conventions apart"),
    _m("fused_add_rmsnorm_h4096_fp16", "stale-residual", "the residual output is not updated",
       ("residual_out = s.to(residual.dtype)", "residual_out = residual.clone()")),
    _m("fused_add_rmsnorm_h4096", "eps", "a literal eps 1e-6 in the expression, not the declared 1e-5 (param:eps)",
       ("keepdim=True) + EPS)", "keepdim=True) + 1e-6)")),
    _m("fused_add_rmsnorm_h4096", "eps-constant", "its own EPS = 9e-3, not the declared 1e-5",
       ("EPS = 1e-5", "EPS = 9e-3"), cls="steers-verdict"),
    # gemm
    _m("gemm_n4096_k4096", "transposed-weight", "B used as [K, N] (a square gemm keeps the shape)",
       ("B.to(torch.float32).T", "B.to(torch.float32)")),
    _m("gemm_n4096_k4096", "half-k", "the second half of K is dropped",
       ("torch.matmul(A.to(torch.float32), B.to(torch.float32).T)",
        "torch.matmul(A[:, :2048].to(torch.float32), B[:, :2048].to(torch.float32).T)")),
    _m("gemm_n4096_k4096", "negated", "the output's sign is flipped (a swapped operand order in a - b)",
       ("torch.matmul(A.to(torch.float32), B.to(torch.float32).T)",
        "-torch.matmul(A.to(torch.float32), B.to(torch.float32).T)")),
    _m("gemm_n4096_k4096", "row-scaled", "A's rows divided by their max |a| and C scaled back (dynamic per-token "
       "scaling) with no guard for a zero row: 0 / 0",
       ("C = torch.matmul(A.to(torch.float32), B.to(torch.float32).T)",
        "a = A.to(torch.float32)\n    s = a.abs().amax(dim=-1, keepdim=True)\n"
        "    C = torch.matmul(a / s, B.to(torch.float32).T) * s"), cls="boundary-magnitude"),
    _m("gemm_n4096_k4096", "b-in-bf16", "B rounded to bfloat16 inside the float16 gemm (a reduced-precision math "
       "mode): within the operand-scale error model on random rows, 2^-9 relative on a one-hot row",
       ("B.to(torch.float32).T", "B.to(torch.bfloat16).to(torch.float32).T"), cls="boundary-structure"),
    _m("gemm_n4096_k4096", "split-k-fp16", "split-K with each half's partial sum stored in float16 (overflows "
       "where the running sum passes 65504, though C itself is representable)",
       ("C = torch.matmul(A.to(torch.float32), B.to(torch.float32).T)",
        "h = A.shape[1] // 2\n"
        "    C = (torch.matmul(A[:, :h].to(torch.float32), B[:, :h].to(torch.float32).T).to(torch.float16)\n"
        "         + torch.matmul(A[:, h:].to(torch.float32), B[:, h:].to(torch.float32).T).to(torch.float16))"),
       cls="boundary-magnitude"),
    # attention: paged decode, paged prefill, ragged prefill, MLA
    _m("gqa_paged_decode_h32_kv8_d128_ps1", "no-sm-scale", "sm_scale dropped",
       ("logits = torch.matmul(qb, k) * sm_scale", "logits = torch.matmul(qb, k)")),
    _m("gqa_paged_decode_h32_kv8_d128_ps1", "lse-natural", "lse in natural log, not base 2",
       ("torch.logsumexp(logits, dim=-1) / math.log(2.0)", "torch.logsumexp(logits, dim=-1)")),
    _m("gqa_paged_decode_h32_kv8_d128_ps1", "interleaved-heads", "query head h reads kv head h % num_kv_heads",
       ("view(num_kv_heads, group_size, head_dim)", "view(group_size, num_kv_heads, head_dim).transpose(0, 1)")),
    _m("gqa_paged_prefill_causal_h32_kv8_d128_ps1", "mask-off-by-one", "causal mask hides the diagonal",
       ("allowed = j <= i + (kv_len - qo_len)", "allowed = j < i + (kv_len - qo_len)")),
    _m("gqa_paged_prefill_causal_h32_kv8_d128_ps1", "top-left-mask", "causal mask aligned top-left",
       ("allowed = j <= i + (kv_len - qo_len)", "allowed = j <= i")),
    _m("gqa_paged_prefill_causal_h32_kv8_d128_ps1", "no-sm-scale", "sm_scale dropped",
       ("logits = torch.matmul(qb, kt) * sm_scale", "logits = torch.matmul(qb, kt)")),
    _m("gqa_ragged_prefill_causal_h32_kv8_d128", "mask-off-by-one", "causal mask hides the diagonal",
       ("allowed = j <= i + (kv_len - qo_len)", "allowed = j < i + (kv_len - qo_len)")),
    _m("gqa_ragged_prefill_causal_h32_kv8_d128", "lse-natural", "lse in natural log, not base 2",
       ("torch.logsumexp(logits, dim=-1) / math.log(2.0)", "torch.logsumexp(logits, dim=-1)")),
    _m("gqa_ragged_prefill_causal_h32_kv8_d128", "sm-scale-twice", "sm_scale applied twice",
       ("logits = torch.matmul(qb, kt) * sm_scale", "logits = torch.matmul(qb, kt) * sm_scale * sm_scale")),
    _m("mla_ragged_prefill_causal_h16_qk192_vo128", "mask-top-left", "causal mask aligned top-left, not bottom-right",
       ("row = torch.arange(qo_len, device=q.device)[:, None] + (kv_len - qo_len)",
        "row = torch.arange(qo_len, device=q.device)[:, None]")),
    _m("mla_ragged_prefill_causal_h16_qk192_vo128", "scale-by-vo", "sm_scale recomputed from the value head dim",
       ("scores = torch.einsum(\"hqd,hkd->hqk\", qh, kh) * sm_scale",
        "scores = torch.einsum(\"hqd,hkd->hqk\", qh, kh) / math.sqrt(vo_dim)")),
    _m("mla_ragged_prefill_causal_h16_qk192_vo128", "rope-part-dropped", "keys and queries without their rope part",
       ("qh = q[qs:qe].to(torch.float32).transpose(0, 1)", "qh = q[qs:qe].to(torch.float32).transpose(0, 1)\n"
        "        qh = torch.cat([qh[..., :128], torch.zeros_like(qh[..., 128:])], dim=-1)")),
    _m("mla_paged_decode_h16_ckv512_kpe64_ps1", "no-rope-part", "the rotary key part is ignored",
       ("logits = (qn @ ckv.T + qp @ kpe.T) * sm_scale", "logits = (qn @ ckv.T) * sm_scale")),
    _m("mla_paged_decode_h16_ckv512_kpe64_ps1", "no-sm-scale", "sm_scale dropped",
       ("logits = (qn @ ckv.T + qp @ kpe.T) * sm_scale", "logits = (qn @ ckv.T + qp @ kpe.T)")),
    _m("mla_paged_decode_h16_ckv512_kpe64_ps1", "lse-natural", "lse in natural log, not base 2",
       ("torch.logsumexp(logits, dim=-1) / math.log(2.0)", "torch.logsumexp(logits, dim=-1)")),
    # attention at its boundaries: each is right on ordinary inputs and wrong only where a boundary case
    # (inputs/attention.py, docs/boundary/attention.md) puts the arithmetic or the structure at its limit
    _m("gqa_paged_decode_h32_kv8_d128_ps1", "no-max-subtraction", "softmax and lse without subtracting the row max "
       "(exp overflows at scores_large, underflows to 0/0 at scores_far_negative)",
       ("probs = torch.softmax(logits, dim=-1)",
        "probs = torch.exp(logits) / torch.exp(logits).sum(dim=-1, keepdim=True)"),
       ("torch.logsumexp(logits, dim=-1) / math.log(2.0)", "torch.log(torch.exp(logits).sum(dim=-1)) / math.log(2.0)"),
       cls="boundary-magnitude"),
    _m("gqa_paged_decode_h32_kv8_d128_ps1", "score-floor", "raw scores below -5e4 taken for the mask sentinel "
       "(clamped to it)", ("logits = torch.matmul(qb, k) * sm_scale",
                           "logits = torch.matmul(qb, k).clamp(min=-5e4) * sm_scale"), cls="boundary-magnitude"),
    _m("gqa_paged_decode_h32_kv8_d128_ps1", "flush-subnormal-q", "subnormal query elements flushed to zero (FTZ)",
       ("qb = q[b].to(torch.float32).view(num_kv_heads, group_size, head_dim)",
        "qb = torch.where(q[b].abs() < 2.0**-126, 0.0, q[b].to(torch.float32)).view(num_kv_heads, group_size, "
        "head_dim)"), cls="boundary-magnitude"),
    _m("gqa_paged_decode_h32_kv8_d128_ps1", "int32-offsets", "a page's element offset computed in int32 (wraps past "
       "2**31)", ("pages = kv_indices[start:end].long()",
                  "pages = (kv_indices[start:end] * (num_kv_heads * head_dim) // (num_kv_heads * head_dim)).long()"),
       survives="only large_offsets reaches 2**31 elements, a GPU case (a too-large skip on every CPU: its 8 GiB "
                "cache copied four times takes minutes there); on an H200, torch ground truth: killed at edge small "
                "seed 0 large_offsets (96.7% of the output off, cosine 0.18)", cls="boundary-index"),
    _m("gqa_paged_prefill_causal_h32_kv8_d128_ps1", "finite-mask", "masked logits set to -5e4, not -inf (a fully "
       "masked row's lse comes out finite)", ("logits = logits.masked_fill(~allowed, -math.inf)",
                                             "logits = logits.masked_fill(~allowed, -5e4)"), cls="boundary-structure"),
    _m("gqa_paged_prefill_causal_h32_kv8_d128_ps1", "masked-rows-nan", "a query with no visible key keeps "
       "softmax's NaN", ("probs = torch.where(allowed.any(dim=-1)[:, None], probs, 0.0)", "probs = probs"),
       cls="boundary-structure"),
    _m("gqa_ragged_prefill_causal_h32_kv8_d128", "lse-zero-init", "lse starts at 0: rows of a request without kv "
       "keep 0, not -inf", ("lse = torch.full((total_q, num_qo_heads), -math.inf, dtype=torch.float32, "
                            "device=q.device)",
                            "lse = torch.zeros(total_q, num_qo_heads, dtype=torch.float32, device=q.device)"),
       cls="boundary-structure"),
    _m("mla_paged_prefill_causal_h16_ckv512_kpe64_ps1", "finite-mask", "masked logits set to -5e4, not -inf",
       ("logits = logits.masked_fill(~allowed, -math.inf)", "logits = logits.masked_fill(~allowed, -5e4)"),
       cls="boundary-structure"),
    _m("dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps1", "no-max-subtraction", "softmax and lse without "
       "subtracting the row max", ("torch.softmax(logits, dim=-1) @ ckv",
                                   "(torch.exp(logits) / torch.exp(logits).sum(dim=-1, keepdim=True)) @ ckv"),
       ("torch.logsumexp(logits, dim=-1) / math.log(2.0)", "torch.log(torch.exp(logits).sum(dim=-1)) / math.log(2.0)"),
       cls="boundary-magnitude"),
    # the coverage definitions (GQA group sizes, fp16, page sizes): bugs the shipped shapes could not show
    _m("gqa_paged_decode_h6_kv2_d128_ps1", "group-pow2", "query head h reads kv head h // (group rounded up to a "
       "power of two): right for groups 1, 2, 4, 8",
       ("qb = q[b].to(torch.float32).view(num_kv_heads, group_size, head_dim)",
        "padded = 1 << (group_size - 1).bit_length()\n"
        "        kv_of = (torch.arange(num_qo_heads, device=q.device) // padded).clamp(max=num_kv_heads - 1)\n"
        "        k, v = k[kv_of], v[kv_of]  # one kv head per query head\n"
        "        qb = q[b].to(torch.float32)[:, None, :]  # [num_qo_heads, 1, head_dim]"), cls="coverage"),
    _m("gqa_paged_decode_h32_kv8_d128_ps1_fp16", "bf16-output", "the output rounded through bfloat16 (right for "
       "the bf16 definitions)",
       ("return output.to(q.dtype), lse", "return output.to(torch.bfloat16).to(q.dtype), lse"), cls="coverage"),
    _m("gqa_paged_decode_h32_kv8_d128_ps16", "whole-last-page", "every page read whole: kv_last_page_len ignored",
       ("kv_len = (end - start - 1) * page_size + int(kv_last_page_len[b].item())",
        "kv_len = (end - start) * page_size"), cls="coverage"),
    # mamba
    _m("mamba_ssu_decode_h128_d64_s128_ng8", "no-softplus", "dt + dt_bias used as the step without softplus",
       ("step = F.softplus(dt.to(torch.float32) + dt_bias.to(torch.float32))",
        "step = dt.to(torch.float32) + dt_bias.to(torch.float32)")),
    _m("mamba_ssu_decode_h128_d64_s128_ng8", "no-skip", "the D * x skip connection dropped",
       ("output[b] = (s * ch[:, None, :]).sum(dim=-1) + d * xb", "output[b] = (s * ch[:, None, :]).sum(dim=-1)")),
    _m("mamba_ssu_decode_h128_d64_s128_ng8", "groups-tiled", "heads mapped to groups h % ngroups, not h // ratio",
       ("bh = B[b].to(torch.float32).repeat_interleave(heads_per_group, dim=0)",
        "bh = B[b].to(torch.float32).repeat(heads_per_group, 1)"),
       ("ch = C[b].to(torch.float32).repeat_interleave(heads_per_group, dim=0)",
        "ch = C[b].to(torch.float32).repeat(heads_per_group, 1)")),
    _m("mamba_ssu_decode_h128_d64_s128_ng8", "row-b", "request b reads and writes cache row b, not its slot",
       ("slot = int(state_batch_indices[b])",
        "slot = b if int(state_batch_indices[b]) != PAD_SLOT_ID else PAD_SLOT_ID")),
    _m("mamba_ssu_decode_h128_d64_s128_ng8", "pad-not-skipped", "a padded request (-1) updates the last row",
       ("if slot == PAD_SLOT_ID:", "if False:"), cls="boundary-structure"),
    _m("mamba_ssu_decode_h64_d64_s128_ng4", "softplus-no-linear-branch", "softplus without its linear branch (the "
       "threshold ignored): log(1 + exp(x)) is inf past x = 88.7, and the step with it",
       ("step = F.softplus(dt.to(torch.float32) + dt_bias.to(torch.float32))",
        "step = F.softplus(dt.to(torch.float32) + dt_bias.to(torch.float32), threshold=float(\"inf\"))"),
       cls="boundary-magnitude"),
    _m("mamba_ssu_decode_h64_d64_s128_ng4", "fp16-output-products", "the C . state products rounded to float16 "
       "(a half-precision path): right to 2^-11, inf once a product passes 65504",
       ("output[b] = (s * ch[:, None, :]).sum(dim=-1) + d * xb",
        "output[b] = (s * ch[:, None, :]).half().sum(dim=-1).float() + d * xb"), cls="boundary-magnitude"),
    # gated delta net (Qwen3-Next linear attention)
    _m("gdn_decode_qk4_v8_d128_k_last", "no-decay", "the decay gate g is not applied to the state",
       ("S = g[:, None, None] * S", "S = S")),
    _m("gdn_decode_qk4_v8_d128_k_last", "no-softplus", "a + dt_bias used as the rate without softplus",
       ("F.softplus(a.to(torch.float32) + dt_bias.to(torch.float32))",
        "(a.to(torch.float32) + dt_bias.to(torch.float32))")),
    # (boundary mutants: right on typical inputs, wrong only where a boundary case reaches: docs/boundary/)
    _m("gdn_decode_qk4_v8_d128_k_last", "softplus-overflow", "softplus as log(1 + exp(x)), no linear branch: inf "
       "past x = 88.7 (float32's exp), so g = 0 where it is near 1",
       ("F.softplus(a.to(torch.float32) + dt_bias.to(torch.float32))",
        "torch.log(1 + torch.exp(a.to(torch.float32) + dt_bias.to(torch.float32)))"), cls="boundary-magnitude"),
    _m("gdn_decode_qk4_v8_d128_k_last", "sigmoid-overflow", "beta = exp(b) / (1 + exp(b)): NaN once exp(b) "
       "overflows (b > 88.7)",
       ("torch.sigmoid(b.to(torch.float32))", "torch.exp(b.to(torch.float32)) / (1 + torch.exp(b.to(torch.float32)))"),
       cls="boundary-magnitude"),
    _m("gdn_prefill_qk4_v8_d128_k_last", "empty-sequence-zero-state", "a sequence with no token gets a zero new_state, "
       "not its initial state (the public prefill reference's convention)",
       ("        start, end = int(cu_seqlens[n].item()), int(cu_seqlens[n + 1].item())\n",
        "        start, end = int(cu_seqlens[n].item()), int(cu_seqlens[n + 1].item())\n"
        "        if end <= start:\n            continue\n"), cls="boundary-structure"),
    _m("gdn_prefill_qk4_v8_d128_k_last", "no-beta", "the update strength beta is dropped (u = v - S k)",
       ("u = beta[:, None] * (v - predicted)", "u = v - predicted")),
    _m("gdn_prefill_qk4_v8_d128_k_last", "k-major-state", "the state read and written k-major [K, V], not k-last",
       ("S = state[n].to(torch.float32)", "S = state[n].to(torch.float32).transpose(-1, -2)"),
       ("new_state[n] = S", "new_state[n] = S.transpose(-1, -2)")),
    _m("gdn_prefill_qk4_v8_d128_k_last", "no-scale", "the output scale is not applied",
       ("return S, scale * torch.einsum(\"hvk,hk->hv\", S, q)", "return S, torch.einsum(\"hvk,hk->hv\", S, q)")),
    _m("gdn_mtp_qk4_v8_d128_k_last", "slot-by-row", "row i reads pool slot i, not initial_state_indices[i]",
       ("slot = int(initial_state_indices[i].item())", "slot = i")),
    _m("gdn_mtp_qk4_v8_d128_k_last", "stale-intermediate", "the intermediate-state buffer gets each token's state "
       "before its update (an off-by-one in the rollback cache; the output and the pool are right)",
       ("            S, output[i, t] = step(S, qv[i, t], kv[i, t], v[i, t].to(torch.float32), g[i, t], beta[i, t], "
        "scale)\n            intermediate_states_buffer[i, t] = S",
        "            intermediate_states_buffer[i, t] = S\n            S, output[i, t] = step(S, qv[i, t], kv[i, t], "
        "v[i, t].to(torch.float32), g[i, t], beta[i, t], scale)")),
    _m("gdn_mtp_qk4_v8_d128_k_last", "heads-tiled", "value head j reads query/key head j % H, not j // (HV / H)",
       ("qv = q.to(torch.float32).repeat_interleave(group, dim=2)", "qv = q.to(torch.float32).repeat(1, 1, group, 1)"),
       ("kv = k.to(torch.float32).repeat_interleave(group, dim=2)", "kv = k.to(torch.float32).repeat(1, 1, group, 1)")),
    # rope
    _m("rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128", "interleaved", "GPT-J pairs (2i, 2i+1) "
       "instead of neox (i, i + half)", ("x1 = x[..., :half]", "x1 = x[..., 0:rotary_dim:2]"),
       ("x2 = x[..., half:rotary_dim]", "x2 = x[..., 1:rotary_dim:2]")),
    _m("rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128", "sin-sign", "rotation by -angle",
       ("out1 = x1 * cos - x2 * sin", "out1 = x1 * cos + x2 * sin"), ("out2 = x2 * cos + x1 * sin",
                                                                      "out2 = x2 * cos - x1 * sin")),
    _m("rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128", "cos-sin-swapped", "cos and sin halves swapped",
       ("cos = cos_sin[:, None, :half]", "cos = cos_sin[:, None, half:]"),
       ("sin = cos_sin[:, None, half:]", "sin = cos_sin[:, None, :half]")),
    _m("rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128", "last-row-clamped", "positions clamped to "
       "max_position - 2 (an off-by-one bound): the cache's last row is never read",
       ("cos_sin = cos_sin_cache[positions.long()]",
        "cos_sin = cos_sin_cache[positions.long().clamp(max=cos_sin_cache.shape[0] - 2)]"), cls="boundary-structure"),
    _m("rope_with_cos_sin_cache_neox_style_h32_kv8_d128_rd128", "positions-clamped-64k", "positions clamped to "
       "65535 (a 64k-row table assumed): wrong past a 64k context",
       ("cos_sin = cos_sin_cache[positions.long()]", "cos_sin = cos_sin_cache[positions.long().clamp(max=65535)]"),
       cls="boundary-structure"),
    _m("rope_with_cos_sin_cache_neox_style_h16_kv2_d256_rd64", "tail-through-fp16", "the pass-through dimensions "
       "copied through a float16 buffer (exact for bf16 values up to 65504, inf past it)",
       ("rest = x[..., rotary_dim:]", "rest = x[..., rotary_dim:].to(torch.float16).to(torch.float32)"),
       cls="boundary-magnitude"),
    # activation
    _m("silu_and_mul_i14336", "silu-on-up", "silu applied to the up half",
       ("silu_gate = gate * torch.sigmoid(gate)", "silu_gate = up * torch.sigmoid(up)"),
       ("return (silu_gate * up)", "return (silu_gate * gate)")),
    _m("silu_and_mul_i14336", "sigmoid-only", "sigmoid(g) instead of g * sigmoid(g)",
       ("silu_gate = gate * torch.sigmoid(gate)", "silu_gate = torch.sigmoid(gate)")),
    _m("silu_and_mul_i14336", "gelu", "tanh-GELU instead of SiLU",
       ("silu_gate = gate * torch.sigmoid(gate)", "silu_gate = gate * torch.sigmoid(1.702 * gate)")),
    _m("silu_and_mul_i14336", "sigmoid-exp-ratio", "sigmoid(g) as exp(g) / (1 + exp(g)): inf / inf = nan once "
       "exp(g) overflows float32 (g > 88.7)",
       ("silu_gate = gate * torch.sigmoid(gate)", "silu_gate = gate * (torch.exp(gate) / (1 + torch.exp(gate)))"),
       cls="boundary-magnitude"),
    _m("silu_and_mul_i14336", "row-scaled", "each output row divided by its max |y| and scaled back (a fused "
       "per-token quantisation scale) with no guard for a zero row: 0 / 0",
       ("return (silu_gate * up).to(input.dtype)",
        "y = silu_gate * up\n    s = y.abs().amax(dim=-1, keepdim=True)\n    return (y / s * s).to(input.dtype)"),
       cls="boundary-magnitude"),
    _m("silu_and_mul_i14336_fp16", "gate-times-up-first", "gate * up multiplied first, in float16, then times "
       "sigmoid(gate): a large negative gate overflows it to inf, and inf * 0 = nan",
       ("return (silu_gate * up).to(input.dtype)",
        "gate_up = (gate.to(input.dtype) * up.to(input.dtype)).to(torch.float32)\n"
        "    return (gate_up * torch.sigmoid(gate)).to(input.dtype)"), cls="boundary-magnitude"),
    # moe
    # caught by the fp8 cosine floor only (definitions/tolerances.toml): element by element it is fp8 rounding
    _m("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "biased-weights",
       "routing weights from the biased scores", ("topk_weights = scores.gather(1, topk_ids)",
                                                  "topk_weights = biased.gather(1, topk_ids)")),
    _m("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "no-scaling-factor",
       "routed_scaling_factor not applied", ("topk_weights.sum(dim=-1, keepdim=True) * routed_scaling_factor",
                                             "topk_weights.sum(dim=-1, keepdim=True)")),
    _m("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "no-groups",
       "top-k over all experts, no group limit", ("topk_ids = biased.masked_fill(~expert_kept, -math.inf)",
                                                  "topk_ids = biased.masked_fill(expert_kept & False, -math.inf)")),
    _m("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "silu-on-up",
       "silu applied to the first half of GEMM1", ("up = h[:, :intermediate_size]", "up = h[:, intermediate_size:]"),
       ("gate = h[:, intermediate_size:]", "gate = h[:, :intermediate_size]")),
    # (boundary mutants: right on typical inputs, wrong only where a boundary case reaches: docs/boundary/)
    _m("moe_bf16_renorm_topk10_e512_h2048_i128", "ties-highest-id", "equal logits at the top-k cut go to the "
       "highest expert id, not the lowest",
       ("    ranked = routing_logits.to(torch.float32).sort(dim=-1, descending=True, stable=True)\n"
        "    topk_logits, topk_ids = ranked.values[:, :TOP_K], ranked.indices[:, :TOP_K]",
        "    ranked = routing_logits.to(torch.float32).flip(-1).sort(dim=-1, descending=True, stable=True)\n"
        "    topk_logits, topk_ids = ranked.values[:, :TOP_K], num_experts - 1 - ranked.indices[:, :TOP_K]"),
       cls="boundary-ties"),
    _m("moe_bf16_renorm_topk10_e512_h2048_i128", "softmax-overflow", "the routing softmax without subtracting "
       "the max: exp overflows past a logit of 88.7", ("topk_weights = torch.softmax(topk_logits, dim=-1)",
                                                      "topk_weights = topk_logits.exp() / topk_logits.exp().sum("
                                                      "dim=-1, keepdim=True)"), cls="boundary-magnitude"),
    _m("moe_bf16_renorm_topk2_e8_h4096_i1792", "silu-overflow", "silu's sigmoid as exp(g) / (1 + exp(g)): NaN for "
       "gate values past 88.7", ("act = gate * torch.sigmoid(gate) * up",
                                 "act = gate * torch.exp(gate) / (1 + torch.exp(gate)) * up"),
       cls="boundary-magnitude"),
    _m("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "group-ties-highest-id",
       "equal group scores at the topk_group cut go to the highest group id",
       ("top_groups = group_scores.sort(dim=-1, descending=True, stable=True).indices[:, :TOPK_GROUP]",
        "top_groups = N_GROUP - 1 - group_scores.flip(-1).sort(dim=-1, descending=True, stable=True)"
        ".indices[:, :TOPK_GROUP]"), cls="boundary-ties"),
    _m("moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048", "routing-sigmoid-overflow",
       "the router's sigmoid as exp(x) / (1 + exp(x)): NaN past a logit of 88.7",
       ("scores = torch.sigmoid(routing_logits.to(torch.float32))",
        "scores = torch.exp(routing_logits.to(torch.float32)) / (1 + torch.exp(routing_logits.to(torch.float32)))"),
       cls="boundary-magnitude"),
    _m("moe_fp8_block_scale_renorm_topk8_e128_h2048_i768", "fp8-subnormal-flush", "fp8 activation codes below "
       "e4m3's smallest normal (2^-6) flushed to zero",
       ("x = hidden_states.to(torch.float32).view(seq_len, hidden_size // BLOCK, BLOCK)",
        "x = hidden_states.to(torch.float32)\n"
        "    x = torch.where(x.abs() < 2.0**-6, 0.0, x).view(seq_len, hidden_size // BLOCK, BLOCK)"),
       cls="boundary-magnitude"),
    # sampling (the power and boundary mutants: docs/boundary/sampling.md, docs/ground-truth.md "Sampling")
    _m("top_k_sampling_from_probs_v128256", "k-plus-one", "the (k+1)-th probability as the threshold: k + 1 kept",
       ("kth = sorted_probs.gather(1, (k - 1)[:, None])",
        "kth = sorted_probs.gather(1, k.clamp(max=vocab_size - 1)[:, None])")),
    _m("top_k_sampling_from_probs_v128256", "no-top-k", "samples from the whole vocabulary",
       ("kept = sorted_probs * (sorted_probs >= kth)", "kept = sorted_probs")),
    _m("top_k_sampling_from_probs_v128256", "ascending", "sorted ascending: the k-th least likely is the threshold",
       ("descending=True", "descending=False")),
    _m("top_k_sampling_from_probs_v32000", "ties-by-rank", "a tie at the k-th probability broken by sort order "
       "(exactly k kept), not kept whole", ("kept = sorted_probs * (sorted_probs >= kth)",
                                            "kept = sorted_probs * (torch.arange(vocab_size, device=probs.device)"
                                            "[None, :] < k[:, None])"), cls="boundary-ties"),
    _m("top_k_sampling_from_probs_v32000", "k-past-vocab", "top_k > vocab_size not recognised as 'keep all' "
       "(only <= 0 is)", ("k = torch.where((k <= 0) | (k >= vocab_size), vocab_size, k)",
                          "k = torch.where(k <= 0, vocab_size, k)"), cls="boundary-parameter"),
    _m("top_p_sampling_from_probs_v32000", "ties-by-rank", "top-p reads each token's own mass before it in sort "
       "order: a tie at the cut is split", ("mass_greater = mass_before.gather(1, first)",
                                            "mass_greater = mass_before"), cls="boundary-ties"),
    _m("top_p_sampling_from_probs_v32000", "le-top-p", "a token kept when the mass before it is <= top_p, not <",
       ("keep = (mass_greater < p)", "keep = (mass_greater <= p)"), cls="boundary-parameter"),
    _m("top_k_top_p_sampling_from_probs_v32000", "last-id-clamped", "token ids clamped to vocab_size - 2 "
       "(a bound off by one)", ("return sorted_ids.gather(1, choice).squeeze(1).to(torch.int64)",
                                "return sorted_ids.gather(1, choice).squeeze(1).clamp(max=vocab_size - 2)"
                                ".to(torch.int64)"), cls="boundary-index"),
    _m("top_k_top_p_sampling_from_probs_v32000", "probs-as-logits", "a softmax over the probabilities (read as "
       "logits)", ("torch.sort(probs.to(torch.float32), dim=-1", "torch.sort(torch.softmax(probs.to(torch.float32), "
                   "dim=-1), dim=-1")),
    _m("top_k_top_p_sampling_from_probs_v32000", "leak-cpu", "10% of the mass leaks to the tokens the filters "
       "removed (a draw outside the set at rate 0.1: above the CPU settings' 0.05)", (_DRAW, _leak(0.1)),
       cls="sampler-distortion"),
    _m("top_k_top_p_sampling_from_probs_v32000", "top-to-second-cpu", "0.6 of the probability moves from the most "
       "probable token to the second (all of it where it holds less): above the CPU settings' 0.45",
       (_DRAW, _move(0.6)), cls="sampler-distortion"),
    _m("top_k_top_p_sampling_from_probs_v32000", "leak-gpu", "3e-4 of the mass leaks to the tokens the filters "
       "removed (a draw outside the set at rate 3e-4: above the GPU settings' 1e-4)", (_DRAW, _leak(3e-4)),
       gpu_only="a rate of 3e-4 needs ~15000 draws in filtering rows, the CPU settings draw ~100 a check: "
                "caught or not by chance there", cls="sampler-distortion"),
    _m("top_k_top_p_sampling_from_probs_v32000", "top-to-second-gpu", "1% of the probability moves from the most "
       "probable token to the second (above the GPU settings' 0.5%)", (_DRAW, _move(0.01)),
       gpu_only="0.01 of mass moved needs ~200000 draws a check; the CPU settings see 0.45", cls="sampler-distortion"),
    # dsa_paged: sparse attention (page sizes 1 and 64) and the fp8 top-k indexer
    _m("dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps1", "padding-read", "the -1 entries are not masked "
       "(they read the cache's last slot)", ("slots = slots[slots >= 0].long()", "slots = slots.long()"),
       cls="boundary-structure"),
    _m("dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64", "scale-576", "sm_scale from the absorbed head dim, "
       "1 / sqrt(512 + 64)", ("* sm_scale  # [num_qo_heads, n]", "/ math.sqrt(head_dim_ckv + head_dim_kpe)")),
    _m("dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64", "lse-natural", "lse in natural log, not base 2",
       ("torch.logsumexp(logits, dim=-1) / math.log(2.0)", "torch.logsumexp(logits, dim=-1)")),
    _m("dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64", "slot-order", "slots numbered offset-major "
       "(offset * num_pages + page, not page * page_size + offset)",
       ("ckv_rows = ckv_cache.reshape(", "ckv_rows = ckv_cache.transpose(0, 1).reshape("),
       ("kpe_rows = kpe_cache.reshape(", "kpe_rows = kpe_cache.transpose(0, 1).reshape(")),
    _m("dsa_topk_indexer_fp8_h64_d128_topk2048_ps64", "no-key-scale", "the keys' per-token scale is not applied",
       ("keys = keys * scales[:, None]", "keys = keys * 1.0")),
    _m("dsa_topk_indexer_fp8_h64_d128_topk2048_ps64", "relu-after-sum", "ReLU on the weighted head sum, not per head",
       ("(torch.relu(per_head) * weights[b][:, None]).sum(dim=0)",
        "torch.relu((per_head * weights[b][:, None]).sum(dim=0))")),
    _m("dsa_topk_indexer_fp8_h64_d128_topk2048_ps64", "no-weights", "the head weights are not applied",
       ("(torch.relu(per_head) * weights[b][:, None]).sum(dim=0)", "torch.relu(per_head).sum(dim=0)")),
    _m("dsa_topk_indexer_fp8_h64_d128_topk2048_ps64", "whole-last-page", "the last page is read past seq_len",
       (".reshape(-1)[:seq_len]  # the request's tokens", ".reshape(-1)  # the request's tokens")),
    _m("dsa_topk_indexer_fp8_h64_d128_topk2048_ps64", "sequence-positions", "positions in the sequence returned, "
       "not global token ids", ("topk_indices[b, :k] = slots[best].to(torch.int32)",
                                "topk_indices[b, :k] = best.to(torch.int32)")),
)
