"""Independent float64 ground truth for `dequantize_fp4` (paged NVFP4 KV-cache dequantization), written from the
definitions' descriptions and the formats' own definitions, not from their references.

The reference looks up a 16-entry list and repeats each block scale 16 times, request by request. Here both codes
are decoded from their bit fields (e2m1: sign, 2 exponent bits of bias 1, 1 mantissa bit; e4m3fn: sign, 4 exponent
bits of bias 7, 3 mantissa bits, exponent 0 subnormal, S.1111.111 NaN) into float64 tables of all 16 and all 256
codes; the whole cache is decoded at once with the rows viewed as [blocks, 16] times a [blocks, 1] scale column
(HND permuted to NHD first), and the tokens are gathered as one table of flat slot ids (page * page_size + slot)
and written with one `index_copy` into the flattened [batch * max_seq_len] output rows, whose other rows keep the
caller's values. The products e2m1 x e4m3 x global are exact in float64; a value past the output dtype's overflow
threshold (its largest finite plus half an ulp: round to nearest even) is +-inf, what the rounded output holds;
every other value stays exact, within half an ulp of the right output. Inputs outside the contract (a NaN scale
code, a length past max_seq_len, a page id out of range on a read token) are errors, not something to compute.
"""

from __future__ import annotations

import math

import torch

from .base import Adapter, Call

F64 = torch.float64
INPUTS = ("paged_k_cache", "paged_v_cache", "k_scales", "v_scales", "block_tables", "seq_lens", "k_scale", "v_scale",
          "output_k", "output_v")
BLOCK = 16


def e2m1_table() -> torch.Tensor:
    """float64 values of the 16 e2m1 codes, from the bit fields."""
    out = []
    for code in range(16):
        exp, man = (code >> 1) & 0b11, code & 0b1
        mag = man * 0.5 if exp == 0 else (1.0 + man / 2.0) * 2.0 ** (exp - 1)
        out.append(-mag if code & 0b1000 else mag)
    return torch.tensor(out, dtype=F64)


def e4m3_table() -> torch.Tensor:
    """float64 values of the 256 float8_e4m3fn codes, from the bit fields (NaN at 0x7F and 0xFF; no infinity)."""
    out = []
    for code in range(256):
        exp, man = (code >> 3) & 0b1111, code & 0b111
        if exp == 0b1111 and man == 0b111:
            mag = math.nan
        elif exp == 0:
            mag = man / 8.0 * 2.0 ** -6
        else:
            mag = (1.0 + man / 8.0) * 2.0 ** (exp - 7)
        out.append(-mag if code & 0x80 else mag)
    return torch.tensor(out, dtype=F64)


def overflow_threshold(dtype: torch.dtype) -> float:
    """The smallest magnitude that rounds to infinity in `dtype` (round to nearest even): max + ulp(max) / 2."""
    fi = torch.finfo(dtype)
    return fi.max + 2.0 ** math.floor(math.log2(fi.max)) * fi.eps / 2  # eps: the ulp of 1


def decode_cache(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """[..., d/2] uint8 and [..., d/16] e4m3 codes -> [..., d] float64 (low nibble first)."""
    raw = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales
    if bool(((raw & 0x7F) == 0x7F).any()):
        raise ValueError("a block scale is an e4m3 NaN code (0x7F / 0xFF): outside the contract")
    e2m1, e4m3 = e2m1_table().to(packed.device), e4m3_table().to(packed.device)
    pairs = packed.to(torch.int64)
    codes = torch.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=torch.int64, device=packed.device)
    codes[..., 0::2] = pairs % 16
    codes[..., 1::2] = pairs // 16
    values = e2m1[codes]
    d = values.shape[-1]
    blocks = values.reshape(*values.shape[:-1], d // BLOCK, BLOCK) * e4m3[raw.to(torch.int64)].unsqueeze(-1)
    return blocks.reshape(values.shape) * float(global_scale.to(F64))


def token_slots(block_tables: torch.Tensor, seq_lens: torch.Tensor, page_size: int, num_pages: int,
                max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat output rows b * max_seq_len + t, flat cache slots page * page_size + t % page_size) of every token."""
    lens = seq_lens.to(torch.int64).tolist()
    rows, slots = [], []
    for b, n in enumerate(lens):
        if not 0 <= n <= max_seq_len:
            raise ValueError(f"request {b}: length {n} outside [0, {max_seq_len}]")
        need = -(-n // page_size)
        if need > block_tables.shape[1]:
            raise ValueError(f"request {b}: {need} pages, block_tables has {block_tables.shape[1]} columns")
        pages = block_tables[b, :need].to(torch.int64)
        if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= num_pages):
            raise ValueError(f"request {b}: a page id outside [0, {num_pages})")
        full = (pages[:, None] * page_size + torch.arange(page_size, device=pages.device)).reshape(-1)[:n]
        slots.append(full)
        rows.append(torch.arange(n, device=pages.device) + b * max_seq_len)
    empty = torch.zeros(0, dtype=torch.int64, device=block_tables.device)
    return (torch.cat(rows) if rows else empty), (torch.cat(slots) if slots else empty)


def hnd(definition) -> bool:
    return definition.inputs["paged_k_cache"].shape[2] == "page_size"


def applies(definition) -> str | None:
    missing = [n for n in INPUTS if n not in definition.inputs]
    if missing:
        return f"needs {', '.join(missing)}"
    shape = definition.inputs["paged_k_cache"].shape or []
    if len(shape) != 4 or "page_size" not in shape[1:3]:
        return "the caches are [num_pages, page_size, heads, d/2] (NHD) or [num_pages, heads, page_size, d/2] (HND)"
    return None


def dequantize(call: Call) -> tuple:
    """output_k, output_v after the call, float64."""
    x = call.inputs.values
    layout_hnd = hnd(call.definition)
    out = []
    for cache, sf, gs, buf in (("paged_k_cache", "k_scales", "k_scale", "output_k"),
                               ("paged_v_cache", "v_scales", "v_scale", "output_v")):
        packed, scales = x[cache], x[sf]
        if layout_hnd:  # [page, head, slot, .] -> [page, slot, head, .]
            packed, scales = packed.permute(0, 2, 1, 3), scales.permute(0, 2, 1, 3)
        num_pages, page_size = packed.shape[:2]
        decoded = decode_cache(packed, scales, x[gs])
        limit = overflow_threshold(x[buf].dtype)
        decoded = torch.where(decoded.abs() >= limit, decoded.sign() * math.inf, decoded)
        batch, max_seq_len = x[buf].shape[:2]
        rows, slots = token_slots(x["block_tables"], x["seq_lens"], page_size, num_pages, max_seq_len)
        result = x[buf].to(F64).reshape(batch * max_seq_len, *x[buf].shape[2:])
        source = decoded.reshape(num_pages * page_size, *decoded.shape[2:])
        result.index_copy_(0, rows, source.index_select(0, slots))
        out.append(result.reshape(x[buf].shape))
    return tuple(out)


ADAPTERS = [
    Adapter("torch", "dequantize_fp4", "e2m1/e4m3 bit-field tables + slot table + index_copy (float64)", dequantize,
            applies=applies),
]
