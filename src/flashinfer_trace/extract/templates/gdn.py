"""Gated Delta Net linear attention (Qwen3-Next's linear-attention layers), k-last state layout:
`gdn_{decode,mtp,prefill}_qk{H}_v{HV}_d{D}_k_last`, the public dataset's names and axes.

Per value head, with the state S stored [V, K] ("k-last": the key dimension last):
g = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b), S <- g S, u = beta (v - S k),
S <- S + u k^T, o = scale * S q. Query/key head h serves the HV / H consecutive value heads
h * HV / H ... (GVA). q and k arrive L2-normalised (the model normalises them before the kernel).

* decode: one token per row, the state [B, HV, V, K] updated and returned as `new_state`;
* mtp: seq_len > 1 draft tokens per row, each row's state read from a pool through
  `initial_state_indices`; a verification pass: the pool comes back unchanged as `final_state`
  (state updates disabled), and `intermediate_states_buffer` [B, T, HV, V, K] receives the state after
  each token of each row (for rollback), written in place: it is an input and an output of the same
  name. Indexed by the row, not by its pool slot: FlashInfer's `gated_delta_rule_mtp` documents its
  buffer as `[B, T, HV, V, K]` "indexed per-batch, not per-pool-slot" (the public file's reference
  writes at the pool slot into a pool-sized buffer, which that kernel never does);
* prefill: varlen sequences (`cu_seqlens`), one initial state per sequence, the final states returned;
  a sequence of length 0 (cu_seqlens repeats a value) is allowed and returns its initial state, the
  state after no token (FlashInfer's kernels store the initial state for it since PR #3536 / #4133;
  the public file's reference returns zeros there, which is no state the recurrence reaches).
"""

from __future__ import annotations

from typing import Any

from ._common import STATUS, choice, const_axis, definition, positive_int, tensor, var_axis

STAGES = ("decode", "mtp", "prefill")
FI_API = {
    "decode": "fi_api:flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose",
    "mtp": "fi_api:flashinfer.gdn_decode.gated_delta_rule_mtp",
    "prefill": "fi_api:flashinfer.gdn_prefill.chunk_gated_delta_rule",
}

_GATES = '''
def gates(A_log, a, dt_bias, b):
    """Per token and value head: the decay g in (0, 1] and the update strength beta in (0, 1)."""
    decay = torch.exp(A_log.to(torch.float32)) * F.softplus(a.to(torch.float32) + dt_bias.to(torch.float32))
    return torch.exp(-decay), torch.sigmoid(b.to(torch.float32))


def step(S, q, k, v, g, beta, scale):
    """One token for every value head: S [HV, V, K], q and k [HV, K], v [HV, V], g and beta [HV]."""
    S = g[:, None, None] * S
    predicted = torch.einsum("hvk,hk->hv", S, k)
    u = beta[:, None] * (v - predicted)
    S = S + u[:, :, None] * k[:, None, :]
    return S, scale * torch.einsum("hvk,hk->hv", S, q)
'''

_HEADER = '''import math
import torch
import torch.nn.functional as F

'''

DECODE = _HEADER + _GATES + '''

@torch.no_grad()
def run(q, k, v, state, A_log, a, dt_bias, b, scale):
    batch, _, num_q_heads, head_size = q.shape
    num_v_heads = v.shape[2]
    group = num_v_heads // num_q_heads
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(head_size)
    g, beta = gates(A_log, a, dt_bias, b)  # [B, 1, HV]
    qv = q[:, 0].to(torch.float32).repeat_interleave(group, dim=1)  # [B, HV, K]
    kv = k[:, 0].to(torch.float32).repeat_interleave(group, dim=1)
    if state is None:
        state = torch.zeros(batch, num_v_heads, head_size, head_size, dtype=torch.float32, device=q.device)
    new_state = torch.empty(state.shape, dtype=torch.float32, device=q.device)
    output = torch.empty(batch, 1, num_v_heads, head_size, dtype=torch.float32, device=q.device)
    for i in range(batch):
        S, o = step(state[i].to(torch.float32), qv[i], kv[i], v[i, 0].to(torch.float32), g[i, 0], beta[i, 0], scale)
        new_state[i] = S
        output[i, 0] = o
    return output.to(torch.bfloat16), new_state
'''

MTP = _HEADER + _GATES + '''

@torch.no_grad()
def run(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b, scale, intermediate_states_buffer):
    batch, seq_len, num_q_heads, head_size = q.shape
    num_v_heads = v.shape[2]
    group = num_v_heads // num_q_heads
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(head_size)
    g, beta = gates(A_log, a, dt_bias, b)  # [B, T, HV]
    qv = q.to(torch.float32).repeat_interleave(group, dim=2)  # [B, T, HV, K]
    kv = k.to(torch.float32).repeat_interleave(group, dim=2)
    output = torch.empty(batch, seq_len, num_v_heads, head_size, dtype=torch.float32, device=q.device)
    for i in range(batch):
        slot = int(initial_state_indices[i].item())
        S = initial_state[slot].to(torch.float32)
        for t in range(seq_len):
            S, output[i, t] = step(S, qv[i, t], kv[i, t], v[i, t].to(torch.float32), g[i, t], beta[i, t], scale)
            intermediate_states_buffer[i, t] = S  # in place, at the row (not its pool slot)
    # verification: state updates are disabled, the pool is returned as it came; the buffer, written in
    # place, is the third output
    return output.to(torch.bfloat16), initial_state.clone()
'''

PREFILL = _HEADER + _GATES + '''

@torch.no_grad()
def run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    total, num_q_heads, head_size = q.shape
    num_v_heads = v.shape[1]
    group = num_v_heads // num_q_heads
    num_seqs = cu_seqlens.shape[0] - 1
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(head_size)
    g, beta = gates(A_log, a, dt_bias, b)  # [total, HV]
    qv = q.to(torch.float32).repeat_interleave(group, dim=1)  # [total, HV, K]
    kv = k.to(torch.float32).repeat_interleave(group, dim=1)
    output = torch.zeros(total, num_v_heads, head_size, dtype=torch.float32, device=q.device)
    new_state = torch.zeros(num_seqs, num_v_heads, head_size, head_size, dtype=torch.float32, device=q.device)
    for n in range(num_seqs):
        start, end = int(cu_seqlens[n].item()), int(cu_seqlens[n + 1].item())
        if state is None:
            S = torch.zeros(num_v_heads, head_size, head_size, dtype=torch.float32, device=q.device)
        else:
            S = state[n].to(torch.float32)
        for t in range(start, end):
            S, output[t] = step(S, qv[t], kv[t], v[t].to(torch.float32), g[t], beta[t], scale)
        new_state[n] = S
    return output.to(torch.bfloat16), new_state
'''

REFERENCES = {"decode": DECODE, "mtp": MTP, "prefill": PREFILL}


def gdn(stage: str, num_q_heads: int, num_v_heads: int, head_size: int) -> dict[str, Any]:
    st = choice("stage", stage, STAGES)
    h = positive_int("num_q_heads", num_q_heads)
    hv = positive_int("num_v_heads", num_v_heads)
    d = positive_int("head_size", head_size)
    if hv % h:
        raise ValueError(f"num_v_heads {hv} must be a multiple of num_q_heads {h}")
    heads = {
        "num_q_heads": const_axis(h, "Query heads (as many as key heads)."),
        "num_k_heads": const_axis(h, "Key heads."),
        "num_v_heads": const_axis(hv, f"Value heads: each query/key head serves {hv // h} consecutive ones (GVA)."),
        "head_size": const_axis(d, "Head dimension of q, k and v (the state is head_size x head_size)."),
    }
    head_constraints = ["num_v_heads >= num_q_heads", "num_v_heads % num_q_heads == 0",
                        "num_k_heads == num_q_heads"]
    gate_inputs = {
        "A_log": tensor(["num_v_heads"], "float32", "Log decay rate per value head: g = exp(-exp(A_log) * "
                                                    "softplus(a + dt_bias))."),
        "a": None,
        "dt_bias": tensor(["num_v_heads"], "float32", "Decay bias per value head, added to a before the softplus."),
        "b": None,
    }
    state_desc = "Recurrent state per {}, k-last [{}, num_v_heads, V, K] float32."
    scale = tensor(None, "float32", "Output scale; 0 means 1 / sqrt(head_size).")
    model_note = ("q and k are L2-normalised per head before the kernel (the model's qk l2norm); g = "
                  "exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b); per value head S <- g S, "
                  "u = beta (v - S k), S <- S + u k^T, o = scale * S q, computed in float32, o rounded to bfloat16. ")
    if st == "prefill":
        tok = ["total_seq_len"]
        axes = {"total_seq_len": var_axis("Tokens of all sequences, cu_seqlens[-1]."),
                "num_seqs": var_axis("Sequences in the batch."), **heads,
                "len_cu_seqlens": var_axis("Length of cu_seqlens: num_seqs + 1.")}
        constraints = ["len_cu_seqlens == num_seqs + 1", "total_seq_len == cu_seqlens[-1].item()",
                       "cu_seqlens[0].item() == 0", "(cu_seqlens[1:] - cu_seqlens[:-1]).min().item() >= 0",
                       *head_constraints]
        lead = "Gated Delta Net prefill over variable-length sequences (sequence n owns tokens " \
               "cu_seqlens[n]:cu_seqlens[n+1]), k-last state layout; a sequence with no token passes its " \
               "initial state through as its new_state (zeros without a state input). "
        state = {"state": {**tensor(["num_seqs", "num_v_heads", "head_size", "head_size"], "float32",
                                    state_desc.format("sequence", "num_seqs")), "optional": True}}
        extra = {"cu_seqlens": tensor(["len_cu_seqlens"], "int64", "Cumulative sequence lengths, starting at 0.")}
        out_state = {"new_state": tensor(["num_seqs", "num_v_heads", "head_size", "head_size"], "float32",
                                         "Each sequence's state after its last token, k-last.")}
    else:
        tok = ["batch_size", "seq_len"]
        axes = {"batch_size": var_axis("Rows (requests) in the batch."),
                "seq_len": (const_axis(1, "One token per row.") if st == "decode"
                            else var_axis("Draft tokens per row, verified in sequence (more than one).")),
                **heads}
        constraints = list(head_constraints)
        if st == "decode":
            lead = "Gated Delta Net decode: one token per row, each row with its own state, k-last layout. "
            state = {"state": {**tensor(["batch_size", "num_v_heads", "head_size", "head_size"], "float32",
                                        state_desc.format("row", "batch_size")), "optional": True}}
            extra = {}
            out_state = {"new_state": tensor(["batch_size", "num_v_heads", "head_size", "head_size"], "float32",
                                             "Each row's state after its token, k-last.")}
        else:
            axes["pool_size"] = var_axis("Slots in the state pool.")
            constraints = ["seq_len > 1", "initial_state_indices.min().item() >= 0",
                           "initial_state_indices.max().item() < pool_size", *head_constraints]
            lead = ("Gated Delta Net multi-token verification (speculative decoding, MTP): seq_len tokens per "
                    "row in sequence, row i starting from pool slot initial_state_indices[i]; state updates are "
                    "disabled, so final_state is the pool unchanged; the state after token t of row i is written "
                    "in place into intermediate_states_buffer[i, t] (by row, not pool slot, as FlashInfer's "
                    "kernel indexes it), an input and an output of the same name. ")
            state = {"initial_state": tensor(["pool_size", "num_v_heads", "head_size", "head_size"], "float32",
                                             "State pool, k-last [pool_size, num_v_heads, V, K]."),
                     "initial_state_indices": tensor(["batch_size"], "int32", "Pool slot of each row (distinct).")}
            buffer = ["batch_size", "seq_len", "num_v_heads", "head_size", "head_size"]
            extra = {"intermediate_states_buffer": tensor(
                buffer, "float32", "Written in place: [i, t] receives row i's state after its token t, k-last "
                                   "(indexed by row, not pool slot), for rollback.")}
            out_state = {"final_state": tensor(["pool_size", "num_v_heads", "head_size", "head_size"], "float32",
                                               "The state pool, unchanged (updates disabled)."),
                         "intermediate_states_buffer": tensor(
                             buffer, "float32", "The input buffer after the call: [i, t] is row i's state after "
                                                "its token t (an in-place output).")}
    per_tok = [*tok]
    gate_inputs["a"] = tensor([*per_tok, "num_v_heads"], "bfloat16", "Decay input per token and value head.")
    gate_inputs["b"] = tensor([*per_tok, "num_v_heads"], "bfloat16", "Update-gate input: beta = sigmoid(b).")
    inputs = {
        "q": tensor([*tok, "num_q_heads", "head_size"], "bfloat16", "Queries, L2-normalised per head."),
        "k": tensor([*tok, "num_k_heads", "head_size"], "bfloat16", "Keys, L2-normalised per head."),
        "v": tensor([*tok, "num_v_heads", "head_size"], "bfloat16", "Values."),
        **{n: s for n, s in state.items() if n == "state" or n == "initial_state"},
        **({"initial_state_indices": state["initial_state_indices"]} if st == "mtp" else {}),
        "A_log": gate_inputs["A_log"], "a": gate_inputs["a"], "dt_bias": gate_inputs["dt_bias"],
        "b": gate_inputs["b"],
    }
    if st == "prefill":
        inputs.update(extra)
        inputs["scale"] = scale
    else:
        inputs["scale"] = scale
        inputs.update(extra)
    outputs = {"output": tensor([*tok, "num_v_heads", "head_size"], "bfloat16", "Attention output per value head."),
               **out_state}
    return definition(
        name=f"gdn_{st}_qk{h}_v{hv}_d{d}_k_last",
        op_type="gdn",
        description=lead + model_note,
        tags=[f"stage:{st}", STATUS, "layout:k-last", FI_API[st]],
        axes=axes,
        constraints=constraints,
        inputs=inputs,
        outputs=outputs,
        reference=REFERENCES[st],
    )
