"""Planted bugs of the `mhc_post` family, one or more per boundary class of docs/boundary/mhc_post.md and a few
plain ones: each boundary mutant is right on the model's typical tokens (O(1) streams, post_layer_mix in (0, 2), a
doubly stochastic comb_res_mix) and is caught by the case its comment names; the plain ones are caught everywhere."""

from __future__ import annotations

from .mutants_model import Mutant, _m, _writes

DEF = "mhc_post_hc4_h4096"  # DeepSeek-V4-Flash: the cheapest model-tagged definition
ODD = "mhc_post_hc4_h127"  # the odd hidden size: no 8-element vector divides its rows
_POST = "    out = xf[:, None, :] * post_layer_mix[:, :, None]\n"
_MIX = '    out = out + torch.einsum("toh,ton->tnh", rf, comb_res_mix)\n'
_RET = "    return out.to(residual.dtype)"

MUTANTS: tuple[Mutant, ...] = (
    # large_values: the streams at 2^112..2^122 overflow float16 (65504) to inf; tiny_values: at 2^-104..2^-96 they
    # underflow it to 0 (a float16 accumulator is right to ~2^-11 of the terms on O(1) tokens)
    _m(DEF, "half-accumulator", "the five-term sum accumulated in float16",
       (_MIX, '    out = (out.half() + torch.einsum("toh,ton->tnh", rf, comb_res_mix).half()).float()\n'),
       cls="boundary-magnitude"),
    # tiny_values: the output rounded through float16 flushes 2^-100 to 0; large_values: overflows to inf
    _m(DEF, "half-output", "each output rounded through float16 on its way to bfloat16",
       (_RET, "    return out.to(torch.float16).to(residual.dtype)"), cls="boundary-magnitude"),
    # zero_post: a stream whose x weight is exactly 0 skipped and written as zeros, dropping its residual mix too (a
    # gating shortcut); the model's post_layer_mix = 2 sigmoid(.) is never 0
    _m(DEF, "skip-zero-post", "a stream whose post_layer_mix is 0 skipped (written as zeros), its residual mix lost",
       (_RET, "    out = torch.where(post_layer_mix[:, :, None] == 0, 0.0, out)\n" + _RET),
       cls="boundary-structure"),
    # signed_mix: the model's Sinkhorn matrix assumed (each new stream's weights over the old ones summing to 1):
    # renormalising a doubly stochastic matrix changes nothing, any other float32 matrix the API takes it changes
    _m(DEF, "stochastic-mix-assumed", "comb_res_mix renormalised so each new stream's weights sum to 1 (the "
       "model's doubly stochastic matrix assumed, not the API's any float32 matrix)",
       (_MIX, '    out = out + torch.einsum("toh,ton->tnh", rf, comb_res_mix / comb_res_mix.sum(dim=1, '
              'keepdim=True))\n'), cls="boundary-structure"),
    # signed_mix too: the weights clamped to [0, inf) (non-negative mixing assumed)
    _m(DEF, "non-negative-mix-assumed", "negative post_layer_mix and comb_res_mix weights clamped to 0",
       (_POST, "    out = xf[:, None, :] * post_layer_mix.clamp_min(0)[:, :, None]\n"),
       (_MIX, '    out = out + torch.einsum("toh,ton->tnh", rf, comb_res_mix.clamp_min(0))\n'),
       cls="boundary-structure"),
    _m(DEF, "transposed-mix", "comb_res_mix read [new, old], not [old, new]",
       (_MIX, '    out = out + torch.einsum("toh,tno->tnh", rf, comb_res_mix)\n')),
    _m(DEF, "post-ignored", "x added to every stream with weight 1, post_layer_mix ignored",
       (_POST, "    out = xf[:, None, :].expand(-1, post_layer_mix.shape[1], -1)\n")),
    _m(DEF, "no-layer-output", "the layer output x never added (the residual mix alone)",
       (_POST, "    out = torch.zeros_like(rf)\n")),
    _m(DEF, "residual-kept", "the old stream n added unmixed beside the mix (an identity path kept)",
       (_MIX, '    out = out + rf + torch.einsum("toh,ton->tnh", rf, comb_res_mix)\n')),
    _m(DEF, "first-token-mixes", "every token mixed with the first token's comb_res_mix (coefficients loaded once "
       "per block)", (_MIX, '    out = out + torch.einsum("toh,ton->tnh", rf, comb_res_mix[:1].expand_as('
                             'comb_res_mix))\n')),
    # the odd hidden size only: the last H % 8 columns (the kernel's scalar remainder) take x's share alone
    _m(ODD, "remainder-unmixed", "the last H % 8 columns of each stream miss the residual mix",
       (_MIX, '    mix = torch.einsum("toh,ton->tnh", rf, comb_res_mix)\n'
              "    mix[..., x.shape[-1] - x.shape[-1] % 8:] = 0\n"
              "    out = out + mix\n")),
    _writes(DEF, "writes-residual", "right output, but the residual streams are zeroed in place afterwards (the "
            "caller's tensor: a ground truth reusing it would compute on the changed residual)", _RET,
            "residual.zero_()", result="result"),
)
