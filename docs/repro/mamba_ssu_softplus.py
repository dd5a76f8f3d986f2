"""FlashInfer's mamba.selective_state_update: softplus(dt + dt_bias) is 0 below about -16.6, where it is exp(x).

Standalone (torch, and flashinfer-python where a GPU is there): one decode request, every head alike, with
dt + dt_bias = -20.625 and A = -7023318.5 (an extreme but representable decay rate: A = -exp(A_log), A_log 15.8).
The true step is softplus(-20.625) = 1.10e-9, so exp(step * A) = 0.99228 and the state -50432 decays to -50042.7
(bfloat16 -49920). A kernel that computes softplus as log(1 + exp(x)) in float32 finds 1 + 1.1e-9 == 1, a step of
0, and leaves the state at -50432: two bfloat16 ulps away.

    python docs/repro/mamba_ssu_softplus.py          # the float32 arithmetic on the CPU; the kernel too on a GPU

The matrix found it as `mamba_ssu_decode_*` `extreme_magnitudes` (docs/upstream-wrong-results.md, section 6).
"""

from __future__ import annotations

import math

import torch

HEADS, DIM, DSTATE, GROUPS = 8, 64, 128, 1
STATE, A, DT, DT_BIAS, X, B, C = -50432.0, -7023318.5, -23.0, 2.375, -0.6171875, 0.5, 1.0


def truth() -> float:
    """One state element in float64: softplus, the decay, the input term."""
    x = DT + DT_BIAS
    step = math.log1p(math.exp(x))
    return STATE * math.exp(step * A) + step * X * B


def float32(softplus: str) -> float:
    """The same in float32, with softplus as log(1 + exp(x)) or log1p(exp(x))."""
    x = torch.tensor(DT, dtype=torch.bfloat16).float() + torch.tensor(DT_BIAS, dtype=torch.bfloat16).float()
    step = torch.log(1 + torch.exp(x)) if softplus == "log(1+exp)" else torch.log1p(torch.exp(x))
    new = torch.tensor(STATE) * torch.exp(step * torch.tensor(A)) + step * X * B
    return float(new.to(torch.bfloat16))


def kernel() -> float | None:
    """FlashInfer's kernel on the same inputs (None without a GPU or FlashInfer)."""
    if not torch.cuda.is_available():
        return None
    try:
        import flashinfer.mamba as mamba
    except ImportError:
        return None
    dev, bf16 = "cuda", torch.bfloat16
    state = torch.full((1, HEADS, DIM, DSTATE), STATE, dtype=bf16, device=dev)
    x = torch.full((1, HEADS, DIM), X, dtype=bf16, device=dev)
    # per-head values tied across head_dim, as stride-0 views (the layout the kernel takes)
    dt = torch.full((1, HEADS, 1), DT, dtype=bf16, device=dev).expand(1, HEADS, DIM)
    a = torch.full((HEADS, 1, 1), A, dtype=torch.float32, device=dev).expand(HEADS, DIM, DSTATE)
    d = torch.zeros(HEADS, 1, dtype=bf16, device=dev).expand(HEADS, DIM)
    dt_bias = torch.full((HEADS, 1), DT_BIAS, dtype=bf16, device=dev).expand(HEADS, DIM)
    b = torch.full((1, GROUPS, DSTATE), B, dtype=bf16, device=dev)
    c = torch.full((1, GROUPS, DSTATE), C, dtype=bf16, device=dev)
    mamba.selective_state_update(state, x, dt, a, b, c, d, dt_bias=dt_bias, dt_softplus=True)
    torch.cuda.synchronize()
    values = state.float().unique().tolist()
    return values[0] if len(values) == 1 else values


def main() -> None:
    t = truth()
    print(f"dt + dt_bias = {DT + DT_BIAS}, A = {A}, state {STATE}")
    print(f"float64:                       new state {t:.4f} (bfloat16 {float(torch.tensor(t).to(torch.bfloat16))})")
    for how in ("log(1+exp)", "log1p"):
        print(f"float32, softplus {how:10s}:  new state {float32(how)}")
    k = kernel()
    if k is None:
        print("flashinfer.mamba.selective_state_update: not run (needs a CUDA GPU and flashinfer-python >= 0.6)")
    else:
        import flashinfer

        print(f"flashinfer {flashinfer.__version__} selective_state_update: new state {k}")


if __name__ == "__main__":
    main()
