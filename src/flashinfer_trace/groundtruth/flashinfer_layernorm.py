"""FlashInfer ground truth for `layernorm`: `flashinfer.norm.layernorm(input, gemma, beta, eps=1e-6) -> Tensor`.

Read from flashinfer/norm.py (flashinfer/norm/__init__.py from 0.6.7), csrc/norm.cu and include/flashinfer/
norm.cuh (github:flashinfer-ai/flashinfer): input [batch_size, hidden_size] bfloat16, gemma and beta
[hidden_size] float32 ("Need to be float32"); the CUDA binding refuses any other dtype ("input must be
bfloat16", "gamma must be float32") and any input that is not 2-D; the output is a new tensor of the input's
dtype. The kernel (norm.cuh `generalLayerNorm`, two passes in float32: the row's mean, then the mean square of
its deviations; an odd hidden size takes its scalar path) and, from 0.6.7, the CuTe-DSL kernel that replaces it
when nvidia-cutlass-dsl imports (the same two passes) compute what the definitions state. There is no `out=`
and no `enable_pdl` in any release, so the calls are:

* plain: `layernorm(input, gemma, beta, eps)`, positionally (the parameter names are FlashInfer's
  `gemma` / `beta`, not the trace template's weight / bias);
* `graph` (modes.py): the launch captured in a CUDA graph and replayed on other data, then on the case's (the
  output buffer the captured call allocated is the graph's, and must follow the new input).

Releases: the API came in with PR #1926 (commit 9f25eee, Oct 2025), first in v0.5.0 (v0.4.1 lacks it; the
0.5.0 release candidates have it); `versions` says >= 0.5, an older release is `api-missing`.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet

from .. import semantics as sem
from ..inputs.layernorm import names
from .base import Adapter, Call
from .flashinfer import PACKAGE

VERSIONS = SpecifierSet(">=0.5")
DTYPES = frozenset({"bfloat16", "float32"})


def applies(d) -> str | None:
    """The API's contract: 2-D bfloat16 input, float32 gemma and beta."""
    try:
        act, weight, bias, _ = names(d)
    except KeyError:
        return "needs hidden_states (or input), weight (or gemma) and bias (or beta)"
    spec = d.inputs[act]
    if len(spec.shape or ()) != 2:
        return f"{act} must be [batch_size, hidden_size] (the kernel takes 2-D input only)"
    if spec.dtype is None or spec.dtype.value != "bfloat16":
        return f"input in bfloat16 only, not {spec.dtype.value if spec.dtype else 'unknown'}"
    for n in (weight, bias):
        s = d.inputs[n]
        if s.dtype is None or s.dtype.value != "float32":
            return f"gemma and beta in float32 only, not {n} {s.dtype.value if s.dtype else 'unknown'}"
    return None


def plan(call: Call):
    act, weight, bias, _ = names(call.definition)
    x = call.inputs.values
    fn, eps = call.module.norm.layernorm, sem.eps(call.definition, x)
    h, w, b = x[act], x[weight], x[bias]
    return lambda: fn(h, w, b, eps)


def run(call: Call) -> tuple:
    return (plan(call)(),)


ADAPTERS = [
    Adapter("flashinfer", "layernorm", "flashinfer.norm.layernorm", run, package=PACKAGE, versions=VERSIONS,
            requires=("norm.layernorm",), applies=applies, params=(sem.eps,), dtypes=DTYPES, needs_cuda=True,
            modes=("graph",), plan=plan, finish=lambda call, raw: tuple(raw)),
]
