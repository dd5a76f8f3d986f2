"""Dense GEMM C = A @ B^T: `gemm_n{n}_k{k}`, op_type gemm, float16 with float32 accumulation."""

from __future__ import annotations

from typing import Any

from ._common import STATUS, const_axis, definition, positive_int, tensor, var_axis

REFERENCE = """import torch


@torch.no_grad()
def run(A, B):
    # C = A @ B^T with float32 accumulation; B is stored [N, K] like a torch.nn.Linear weight.
    C = torch.matmul(A.to(torch.float32), B.to(torch.float32).T)
    return C.to(A.dtype)
"""


def gemm(n: int, k: int) -> dict[str, Any]:
    n = positive_int("n", n)
    k = positive_int("k", k)
    return definition(
        name=f"gemm_n{n}_k{k}",
        op_type="gemm",
        description=(
            "Dense matrix multiply C = A @ B^T in float16 with float32 accumulation, the shape of a linear layer "
            f"(projection) with K = {k} input features and N = {n} output features. B is stored [N, K] "
            "(row-major, one row per output feature, the torch.nn.Linear weight layout), so the product is NT. "
            "M (the number of tokens) varies; the result is rounded to float16 once at the end. No bias, no "
            "epilogue."
        ),
        tags=[STATUS],
        axes={
            "M": var_axis("Number of rows of A (tokens)."),
            "N": const_axis(n, "Output features (rows of B)."),
            "K": const_axis(k, "Reduction dimension (input features)."),
        },
        constraints=[],
        inputs={
            "A": tensor(["M", "K"], "float16", "Activations, row-major [M, K]."),
            "B": tensor(["N", "K"], "float16", "Weight, row-major [N, K] (used transposed)."),
        },
        outputs={"C": tensor(["M", "N"], "float16", "A @ B^T, accumulated in float32, rounded to float16.")},
        reference=REFERENCE,
    )
