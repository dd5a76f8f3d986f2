"""A planted bug's description (Mutant) and the shorthand the mutant tables build it with, in a module of
their own so that the per-family tables (mutants_<family>.py) and mutants.py can both import them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    definition: str
    id: str
    bug: str
    edits: tuple[tuple[str, str], ...]  # (text in the reference, its replacement); each must occur
    survives: str | None = None  # why the checks cannot see this bug yet (kept, so the gap stays visible)
    cls: str = "wrong-math"  # the class of bug, for the kill rate per class (rates_by_class)
    gpu_only: str | None = None  # why only a GPU's settings can judge it (a bug planted at their thresholds)

    @property
    def name(self) -> str:
        return f"{self.definition}:{self.id}"


def _m(definition: str, id: str, bug: str, *edits: tuple[str, str], survives: str | None = None,
       cls: str = "wrong-math", gpu_only: str | None = None) -> Mutant:
    return Mutant(definition, id, bug, tuple(edits), survives, cls, gpu_only)


def _writes(definition: str, id: str, bug: str, ret: str, statement: str, *, result: str | None = "out") -> Mutant:
    """A `mutates-inputs` bug: the right output, then `statement` writes into an input (the caller's tensor: a ground
    truth reusing it would compute on the changed value). `ret` is the reference's return line ("    return EXPR");
    EXPR is kept in `result` before the write, or, with result=None (EXPR no longer reads that input), the write goes
    just before the return."""
    if result is None:
        written = f"    {statement}\n{ret}"
    else:
        written = f"    {result} = {ret.removeprefix('    return ')}\n    {statement}\n    return {result}"
    return _m(definition, id, bug, (ret, written), cls="mutates-inputs")


# the bf16 / fp8 GEMM references (gemm_bf16's mm_bf16, bmm_fp8, bmm_bf16) accumulate A @ B in float32 in this line
# and return it rounded to bfloat16 in that one; the edits of them their families share:
GEMM_ACC = "    acc = torch.matmul(A.to(torch.float32), B.to(torch.float32))\n"
GEMM_OUT = "    return acc.to(torch.bfloat16)"
FP16_EPILOGUE = (GEMM_OUT, "    return acc.to(torch.float16).to(torch.bfloat16)")  # inf past 65504


def flushed_a(exponent: int) -> tuple[str, str]:
    """A's subnormals (|a| < 2^exponent) flushed to zero before the product (FTZ on the inputs)."""
    return (GEMM_ACC, f"    a = A.to(torch.float32)\n    a = torch.where(a.abs() < 2 ** {exponent}, 0.0, a)\n"
                      "    acc = torch.matmul(a, B.to(torch.float32))\n")


def squeezed_a(axis: int) -> tuple[str, str]:
    """A's token axis `axis` squeezed away when it is 1 (a decode path that drops M = 1)."""
    return (GEMM_ACC, f"    acc = torch.matmul(A.to(torch.float32).squeeze({axis}), B.to(torch.float32))\n")
