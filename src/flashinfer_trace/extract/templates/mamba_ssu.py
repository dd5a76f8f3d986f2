"""Mamba2 selective state update, one decode step: `mamba_ssu_decode_h{nheads}_d{head_dim}_s{dstate}_ng{ngroups}`,
op_type mamba_ssu (flashinfer.mamba.selective_state_update with dt_softplus=True, no z: the gate is
applied by the gated RMSNorm after the scan, as in Nemotron-H)."""

from __future__ import annotations

from typing import Any

from ._common import STATUS, const_axis, definition, positive_int, tensor, var_axis

REFERENCE = """import torch
import torch.nn.functional as F

PAD_SLOT_ID = -1


@torch.no_grad()
def run(state, x, dt, A, B, C, D, dt_bias, state_batch_indices):
    batch, nheads, head_dim = x.shape
    ngroups = B.shape[1]
    heads_per_group = nheads // ngroups  # group g serves heads g * heads_per_group .. (g + 1) * heads_per_group - 1
    new_state = state.clone()
    output = torch.zeros(batch, nheads, head_dim, dtype=torch.float32, device=x.device)
    step = F.softplus(dt.to(torch.float32) + dt_bias.to(torch.float32))  # [batch, nheads, head_dim]
    a = A.to(torch.float32)  # [nheads, head_dim, dstate], negative
    d = D.to(torch.float32)
    for b in range(batch):
        slot = int(state_batch_indices[b])
        if slot == PAD_SLOT_ID:  # a padded request: its state is not touched, its output stays 0
            continue
        bh = B[b].to(torch.float32).repeat_interleave(heads_per_group, dim=0)  # [nheads, dstate]
        ch = C[b].to(torch.float32).repeat_interleave(heads_per_group, dim=0)
        xb = x[b].to(torch.float32)  # [nheads, head_dim]
        decay = torch.exp(step[b, :, :, None] * a)  # zero-order hold: exp(dt * A)
        s = state[slot].to(torch.float32) * decay + (step[b] * xb)[:, :, None] * bh[:, None, :]
        new_state[slot] = s.to(state.dtype)
        output[b] = (s * ch[:, None, :]).sum(dim=-1) + d * xb  # y = C . s + D x, from the float32 state
    return output.to(x.dtype), new_state
"""


def mamba_ssu(nheads: int, head_dim: int, dstate: int, ngroups: int) -> dict[str, Any]:
    h = positive_int("nheads", nheads)
    p = positive_int("head_dim", head_dim)
    n = positive_int("dstate", dstate)
    g = positive_int("ngroups", ngroups)
    if h % g:
        raise ValueError(f"nheads {h} must be a multiple of ngroups {g}")
    r = h // g
    return definition(
        name=f"mamba_ssu_decode_h{h}_d{p}_s{n}_ng{g}",
        op_type="mamba_ssu",
        description=(
            f"Mamba2 selective state update (one decode token per request) with {h} SSM heads of head_dim {p}, "
            f"state size {n} and {g} B/C groups (head h uses group h // {r}). Request b reads and updates row "
            "state_batch_indices[b] of the state cache (PAD_SLOT_ID -1: skipped, state untouched, output 0): "
            "step = softplus(dt + dt_bias), state' = exp(step * A) * state + (step * x) outer B, "
            "output = sum over dstate of state' * C + D * x (no z gate). All math in float32 from the stored "
            "dtypes; the new state is rounded to the cache dtype, the output is computed from the unrounded "
            "state and rounded to bfloat16 once. A, D, dt and dt_bias hold one value per head (tied across "
            "head_dim, Mamba2's TIE_HDIM layout); the reference reads them element-wise."
        ),
        tags=[STATUS, "stage:decode", "fi_api:flashinfer.mamba.selective_state_update", "param:dt_softplus=true"],
        axes={
            "batch_size": var_axis("Number of requests decoded together (one token each)."),
            "state_cache_size": var_axis("Rows of the SSM state cache; at least batch_size."),
            "nheads": const_axis(h, "SSM heads (per tensor-parallel rank)."),
            "head_dim": const_axis(p, "Channels per SSM head."),
            "dstate": const_axis(n, "SSM state size per channel."),
            "ngroups": const_axis(g, "B/C groups (per tensor-parallel rank); nheads / ngroups heads share one."),
        },
        constraints=["nheads % ngroups == 0", "state_cache_size >= batch_size"],
        inputs={
            "state": tensor(["state_cache_size", "nheads", "head_dim", "dstate"], "bfloat16",
                            "SSM state cache, one row per sequence slot (updated in place by serving kernels)."),
            "x": tensor(["batch_size", "nheads", "head_dim"], "bfloat16", "The token's SSM input per head."),
            "dt": tensor(["batch_size", "nheads", "head_dim"], "bfloat16",
                         "Raw time step (before dt_bias and softplus), one value per head."),
            "A": tensor(["nheads", "head_dim", "dstate"], "float32",
                        "State decay rate, negative (A = -exp(A_log)), one value per head."),
            "B": tensor(["batch_size", "ngroups", "dstate"], "bfloat16", "Input projection onto the state, per group."),
            "C": tensor(["batch_size", "ngroups", "dstate"], "bfloat16", "Output projection of the state, per group."),
            "D": tensor(["nheads", "head_dim"], "bfloat16", "Skip connection weight, one value per head."),
            "dt_bias": tensor(["nheads", "head_dim"], "bfloat16", "Time-step bias added before softplus, per head."),
            "state_batch_indices": tensor(["batch_size"], "int32",
                                          "State cache row of each request; -1 (PAD_SLOT_ID) marks a padded one."),
        },
        outputs={
            "output": tensor(["batch_size", "nheads", "head_dim"], "bfloat16", "SSM output y (0 for padded requests)."),
            "new_state": tensor(["state_cache_size", "nheads", "head_dim", "dstate"], "bfloat16",
                                "The state cache after the step: the named rows updated, every other row as it was."),
        },
        reference=REFERENCE,
    )
