"""Rotary position embedding from a cos/sin cache, Neox or GPT-J (interleaved) style:
`rope_with_cos_sin_cache_{neox|gptj}_style_h{H}_kv{KV}_d{D}_rd{RD}`
(flashinfer.rope.apply_rope_with_cos_sin_cache, is_neox True / False)."""

from __future__ import annotations

from typing import Any

from ._common import STATUS, const_axis, definition, plural, positive_int, tensor, var_axis

NEOX_REFERENCE = """import torch


@torch.no_grad()
def run(positions, query, key, cos_sin_cache):
    rotary_dim = cos_sin_cache.shape[1]
    half = rotary_dim // 2
    # One cache row per token: [cos(pos * f_0..f_{half-1}) | sin(pos * f_0..f_{half-1})]
    cos_sin = cos_sin_cache[positions.long()].to(torch.float32)  # [num_tokens, rotary_dim]
    cos = cos_sin[:, None, :half]  # broadcast over heads
    sin = cos_sin[:, None, half:]

    def rotate(x):
        x = x.to(torch.float32)
        # Neox style: dimension i pairs with i + half (not with its neighbour i + 1)
        x1 = x[..., :half]
        x2 = x[..., half:rotary_dim]
        out1 = x1 * cos - x2 * sin
        out2 = x2 * cos + x1 * sin
        rest = x[..., rotary_dim:]  # dimensions past rotary_dim pass through unchanged
        return torch.cat([out1, out2, rest], dim=-1)

    return rotate(query).to(query.dtype), rotate(key).to(key.dtype)
"""

GPTJ_REFERENCE = """import torch


@torch.no_grad()
def run(positions, query, key, cos_sin_cache):
    rotary_dim = cos_sin_cache.shape[1]
    half = rotary_dim // 2
    # One cache row per token: [cos(pos * f_0..f_{half-1}) | sin(pos * f_0..f_{half-1})]
    cos_sin = cos_sin_cache[positions.long()].to(torch.float32)  # [num_tokens, rotary_dim]
    cos = cos_sin[:, None, :half]  # broadcast over heads
    sin = cos_sin[:, None, half:]

    def rotate(x):
        x = x.to(torch.float32)
        # GPT-J (interleaved) style: dimension 2i pairs with its neighbour 2i + 1, rotated by frequency f_i
        x1 = x[..., 0:rotary_dim:2]  # even dimensions 0, 2, ..., rotary_dim - 2
        x2 = x[..., 1:rotary_dim:2]  # odd dimensions 1, 3, ..., rotary_dim - 1
        out1 = x1 * cos - x2 * sin
        out2 = x2 * cos + x1 * sin
        rotated = torch.stack([out1, out2], dim=-1).flatten(-2)  # interleave back: out1_0, out2_0, out1_1, ...
        rest = x[..., rotary_dim:]  # dimensions past rotary_dim pass through unchanged
        return torch.cat([rotated, rest], dim=-1)

    return rotate(query).to(query.dtype), rotate(key).to(key.dtype)
"""


def rope(num_qo_heads: int, num_kv_heads: int, head_dim: int, rotary_dim: int, neox: bool) -> dict[str, Any]:
    h = positive_int("num_qo_heads", num_qo_heads)
    kv = positive_int("num_kv_heads", num_kv_heads)
    d = positive_int("head_dim", head_dim)
    rd = positive_int("rotary_dim", rotary_dim)
    if not isinstance(neox, bool):
        raise ValueError(f"neox must be a bool, got {neox!r}")
    if rd % 2:
        raise ValueError(f"rotary_dim {rd} must be even (the cache holds rotary_dim / 2 cos and sin values)")
    if rd > d:
        raise ValueError(f"rotary_dim {rd} must not exceed head_dim {d}")
    style = "neox" if neox else "gptj"
    if neox:
        pairing = (
            "Neox (GPT-NeoX / non-interleaved) style. With x1 = x[..., :rd/2] and x2 = x[..., rd/2:rd], the result "
            "is [x1*cos - x2*sin, x2*cos + x1*sin], i.e. dimension i is rotated together with dimension i + rd/2 "
            "(the interleaved GPT-J style would pair 2i with 2i+1)"
        )
    else:
        pairing = (
            "GPT-J (interleaved) style. Dimension 2i is rotated together with its neighbour 2i+1 by cos/sin entry i: "
            "out[2i] = x[2i]*cos_i - x[2i+1]*sin_i, out[2i+1] = x[2i+1]*cos_i + x[2i]*sin_i for i < rd/2 (the Neox "
            "style would pair i with i + rd/2)"
        )
    rest = ("none here: rotary_dim == head_dim" if rd == d
            else f"dimensions {rd}..{d - 1} of each head are copied unchanged")
    return definition(
        name=f"rope_with_cos_sin_cache_{style}_style_h{h}_kv{kv}_d{d}_rd{rd}",
        op_type="rope",
        description=(
            f"Rotary position embedding applied to the query ({plural(h, 'head')}) and key ({plural(kv, 'head')}) "
            "of attention, "
            f"head_dim {d}, from a precomputed cos/sin cache, {pairing}. For token t at position p = positions[t], "
            "row p of cos_sin_cache holds [cos | sin] (rotary_dim / 2 values each; any frequency scaling such as "
            "Llama-3.1's rope_scaling or YaRN is already baked into the cache). Dimensions past rotary_dim pass "
            f"through ({rest}). The same rotation applies to every head. Computed in float32, rounded to bfloat16. "
            f"The FlashInfer kernel (is_neox={neox}) rotates query and key in place and takes them flattened to "
            "[num_tokens, heads * head_dim]; the adapter reshapes."
        ),
        tags=[STATUS, "fi_api:flashinfer.rope.apply_rope_with_cos_sin_cache"],
        axes={
            "num_tokens": var_axis("Number of tokens (rows of query and key)."),
            "max_position": var_axis("Number of rows of the cos/sin cache (max position + 1)."),
            "num_qo_heads": const_axis(h, "Query heads."),
            "num_kv_heads": const_axis(kv, "Key/value heads."),
            "head_dim": const_axis(d, "Head dimension."),
            "rotary_dim": const_axis(rd, "Number of leading dimensions of each head that are rotated."),
        },
        constraints=["positions.min().item() >= 0 and positions.max().item() < max_position"],
        inputs={
            "positions": tensor(["num_tokens"], "int64",
                                "Position of each token in its sequence (a row of cos_sin_cache)."),
            "query": tensor(["num_tokens", "num_qo_heads", "head_dim"], "bfloat16", "Query heads before rotation."),
            "key": tensor(["num_tokens", "num_kv_heads", "head_dim"], "bfloat16", "Key heads before rotation."),
            "cos_sin_cache": tensor(["max_position", "rotary_dim"], "float32",
                                    "Row p = [cos(p * inv_freq), sin(p * inv_freq)], rotary_dim / 2 values each."),
        },
        outputs={
            "query_out": tensor(["num_tokens", "num_qo_heads", "head_dim"], "bfloat16", "Rotated query."),
            "key_out": tensor(["num_tokens", "num_kv_heads", "head_dim"], "bfloat16", "Rotated key."),
        },
        reference=NEOX_REFERENCE if neox else GPTJ_REFERENCE,
    )
