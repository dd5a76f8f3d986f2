"""Planted bugs of `dequantize_fp4` (paged NVFP4 KV-cache dequantization): one or more per boundary class of
docs/boundary/dequantize_fp4.md, each a realistic slip of a dequantization kernel written as a text edit of a
definition's reference. mutants.py appends `MUTANTS` to its own; tests/unit/test_dequantize_fp4.py checks that each
is caught by its case."""

from __future__ import annotations

from .mutants_model import Mutant, _m

NHD = "nvfp4_kv_dequantize_paged_h8_dk128_dv128_ps16"
HND = "nvfp4_kv_dequantize_paged_hnd_h8_dk128_dv128_ps16"
FP16 = "nvfp4_kv_dequantize_paged_h4_dk128_dv128_ps1_fp16"

_CODES = "torch.stack([packed & 0xF, packed >> 4], dim=-1)"
_BLOCK = "block = scales.to(torch.float32).repeat_interleave(BLOCK, dim=-1)"
_GLOBAL = "    return table[codes] * block * global_scale.to(torch.float32)\n"
_LEN = "t = torch.arange(int(seq_lens[b]), device=block_tables.device)"
_PAGE = "page = block_tables[b, t // page_size].to(torch.int64)"
_NHD_VIEW = "    k_cache, v_cache, k_sf, v_sf = paged_k_cache, paged_v_cache, k_scales, v_scales\n"
_HND_VIEW = "(t.transpose(1, 2) for t in (paged_k_cache, paged_v_cache, k_scales, v_scales))"
_V = "decode(v_cache[page, slot], v_sf[page, slot], v_scale).to(out_v.dtype)"
_K = "decode(k_cache[page, slot], k_sf[page, slot], k_scale)"

MUTANTS: tuple[Mutant, ...] = (
    _m(NHD, "nibble-order", "the high nibble taken as the first element of each pair (element 2i from bits 7..4)",
       (_CODES, "torch.stack([packed >> 4, packed & 0xF], dim=-1)"), cls="boundary-structure"),
    _m(NHD, "scale-per-32", "the block scale indexed by the byte, not the element (scales[byte // 16]): each scale "
       "covers 32 elements", (_BLOCK, "block = scales.to(torch.float32).repeat_interleave(2 * BLOCK, dim=-1)"
                              "[..., :packed.shape[-1] * 2]"), cls="boundary-index"),
    _m(NHD, "scale-block-shifted", "the scale blocks misaligned by half a block (element j scaled by block "
       "(j + 8) // 16, the row's last 8 by its first)", (_BLOCK, _BLOCK + ".roll(-8, dims=-1)"),
       cls="boundary-index"),
    _m(NHD, "subnormal-scale-flushed", "e4m3 subnormal block scales (below 2^-6) flushed to zero",
       (_BLOCK, "block = scales.to(torch.float32).where(scales.to(torch.float32).abs() >= 2.0 ** -6, 0.0)"
                ".repeat_interleave(BLOCK, dim=-1)"), cls="boundary-magnitude"),
    _m(NHD, "global-scale-ignored", "the global scale not applied (value = e2m1 x block scale)",
       (_GLOBAL, "    return table[codes] * block\n"), cls="wrong-math"),
    _m(NHD, "zero-global-scale-as-one", "a global scale of 0 taken as 'unset' and replaced by 1",
       (_GLOBAL, "    return table[codes] * block * torch.where(global_scale == 0, 1.0, global_scale)"
                 ".to(torch.float32)\n"),
       cls="boundary-magnitude"),
    _m(NHD, "kv-global-swapped", "K dequantized with v_scale", (_K, "decode(k_cache[page, slot], k_sf[page, slot], "
                                                                     "v_scale)"), cls="wrong-math"),
    _m(NHD, "rows-past-length", "every row up to max_seq_len written (the lengths ignored: rows past a request's "
       "length decoded from whatever pages its table's padding names)",
       (_LEN, "t = torch.arange(out_k.shape[1], device=block_tables.device)"), cls="boundary-structure"),
    _m(NHD, "empty-request-one-row", "a request of length 0 given one row (a launch of at least one token per "
       "request)", (_LEN, "t = torch.arange(max(int(seq_lens[b]), 1), device=block_tables.device)"),
       cls="boundary-structure"),
    _m(NHD, "full-last-page-dropped", "the last page's tokens counted as seq_len % page_size: a full last page "
       "counts as empty", (_LEN, "t = torch.arange((int(seq_lens[b]) - 1) // page_size * page_size + "
                                 "int(seq_lens[b]) % page_size, device=block_tables.device)"),
       cls="boundary-structure"),
    _m(NHD, "pages-contiguous", "a request's pages taken as consecutive ids from its first",
       (_PAGE, "page = (block_tables[b, 0] + t // page_size).to(torch.int64)"), cls="boundary-index"),
    _m(NHD, "read-as-hnd", "the NHD cache read with HND strides (the layout flag inverted)",
       (_NHD_VIEW, "    k_cache, v_cache, k_sf, v_sf = (t.reshape(t.shape[0], t.shape[2], t.shape[1], t.shape[3])"
                   ".transpose(1, 2) for t in (paged_k_cache, paged_v_cache, k_scales, v_scales))\n"),
       cls="boundary-index"),
    _m(HND, "read-as-nhd", "the HND cache read with NHD strides (the layout flag ignored)",
       (_HND_VIEW, "(t.reshape(t.shape[0], t.shape[2], t.shape[1], t.shape[3]) for t in (paged_k_cache, "
                   "paged_v_cache, k_scales, v_scales))"), cls="boundary-index"),
    _m(FP16, "overflow-saturates", "values past float16's range saturated to +-65504 instead of rounding to +-inf "
       "(a satfinite conversion)", (_V, "decode(v_cache[page, slot], v_sf[page, slot], v_scale)"
                                        ".clamp(-65504.0, 65504.0).to(out_v.dtype)"), cls="boundary-magnitude"),
)
