"""FlashInfer ground truth for `mhc_post`: `flashinfer.mhc.mhc_post(x, residual, post_layer_mix, comb_res_mix)
-> Tensor`, mHC's post mapping for hc = 4.

Read from flashinfer/mhc.py, flashinfer/jit/mhc.py, csrc/mhc/mhc_post.cu and tests/mhc/test_mhc_post.py
(github:flashinfer-ai/flashinfer, and the 0.7.2.post1 wheel): x [..., H] and residual [..., 4, H] bfloat16,
post_layer_mix [..., 4] or [..., 4, 1] and comb_res_mix [..., 4, 4] float32; the Python wrapper checks the shapes
(`_check_mhc_post_inputs`: hc must be 4), flattens the outer dimensions and makes every operand contiguous
(`.reshape(...).contiguous()`), and the binding refuses any other dtype (`CHECK_INPUT_AND_TYPE(x, dl_bfloat16)`,
`(post_layer_mix, dl_float32)`). The kernels (a token-vector, a split-vector, a persistent split-vector and, for a
hidden size that is no multiple of 8, a scalar kernel) compute `x * post[n]` then four `fmaf(residual[o],
comb[o][n], acc)` in float32 and round each element to bfloat16 once: what the definitions state. The output is a
new tensor; there is no `out=`, no in-place form and no `enable_pdl` in any release, so the calls are:

* plain: `mhc_post(x, residual, post_layer_mix, comb_res_mix)`, positionally;
* `post-3d`: post_layer_mix passed as [T, 4, 1], the other shape the wrapper accepts;
* `outer-dims`: every operand with a leading outer dimension of 1 ([1, T, H], [1, T, 4, H], ...), the output
  [1, T, 4, H] read back flat (the wrapper takes any outer shape);
* `strided`: x and residual as non-contiguous views of buffers twice as wide (the rows of a fused projection's
  output), which the wrapper must copy before the kernel reads them with 16-byte vector loads;
* `graph` (modes.py): the launch captured in a CUDA graph and replayed on other data, then on the case's.

Releases: the API came in with PR #3285 (commit 2bcb37a, "Add mHC post mapping and pre big-fuse kernels", May 29
2026); v0.6.12 lacks it and v0.6.13 (rc1 on) is the first tag that has it: `versions` is >= 0.6.13, an older
release `api-missing`. Arch: the JIT module is built with gen_jit_spec's defaults for the device (no
supported_major_versions, no `__CUDA_ARCH__` guard in mhc_post.cu) and FlashInfer's test skips only below SM80
("mHC BF16 tests require an SM80+ GPU"): `min_cc` sm80, so sm90 (Hopper) runs it.
"""

from __future__ import annotations

import torch
from packaging.specifiers import SpecifierSet

from .base import Adapter, Call
from .flashinfer import PACKAGE

VERSIONS = SpecifierSet(">=0.6.13")
DTYPES = frozenset({"bfloat16", "float32"})
MODES = ("post-3d", "outer-dims", "strided", "graph")
_WANT = {"x": ("bfloat16", 2), "residual": ("bfloat16", 3), "post_layer_mix": ("float32", 2),
         "comb_res_mix": ("float32", 3)}


def applies(d) -> str | None:
    """The API's contract: bfloat16 x and residual, float32 mixes, hc 4."""
    for name, (dtype, rank) in _WANT.items():
        spec = d.inputs.get(name)
        if spec is None:
            return "needs x, residual, post_layer_mix and comb_res_mix"
        if len(spec.shape or ()) != rank:
            return f"{name} must be {rank}-D (the flattened [T, ...] form)"
        if spec.dtype is None or spec.dtype.value != dtype:
            return f"{name} in {dtype} only, not {spec.dtype.value if spec.dtype else 'unknown'}"
    if d.const_axes.get(d.inputs["residual"].shape[1]) not in (None, 4):
        return "hc must be 4 (the kernel is hard-wired to 4 streams)"
    return None


def _strided(t: torch.Tensor) -> torch.Tensor:
    """t's values in a non-contiguous view: the first half of a buffer twice as wide in the last dimension."""
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype, device=t.device)
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


def plan(call: Call):
    v = call.inputs.values
    fn = call.module.mhc.mhc_post
    x, r, post, comb = v["x"], v["residual"], v["post_layer_mix"], v["comb_res_mix"]
    shape = r.shape
    if call.mode == "post-3d":
        post = post.unsqueeze(-1)
    elif call.mode == "outer-dims":
        x, r, post, comb = x.unsqueeze(0), r.unsqueeze(0), post.unsqueeze(0), comb.unsqueeze(0)
    elif call.mode == "strided":
        x, r = _strided(x), _strided(r)

    def launch():
        return fn(x, r, post, comb).reshape(shape)
    return launch


def run(call: Call) -> tuple:
    return (plan(call)(),)


ADAPTERS = [
    Adapter("flashinfer", "mhc_post", "flashinfer.mhc.mhc_post", run, package=PACKAGE, versions=VERSIONS,
            requires=("mhc.mhc_post",), applies=applies, dtypes=DTYPES, needs_cuda=True, min_cc=(8, 0),
            modes=MODES, plan=plan, finish=lambda call, raw: tuple(raw)),
]
