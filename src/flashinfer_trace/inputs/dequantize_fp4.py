"""Paged NVFP4 KV-cache dequantization inputs (op_type `dequantize_fp4`), as
`flashinfer.quantization.nvfp4_kv_dequantize_paged` takes them:

    paged_k_cache, paged_v_cache [num_pages, page_size, heads, d/2] (NHD) or [num_pages, heads, page_size, d/2]
                                 (HND), uint8: two e2m1 codes a byte, the low nibble first
    k_scales, v_scales           the same with d/16: one float8_e4m3fn block scale per 16 elements (linear)
    block_tables [batch, stride] each request's pages in sequence order; seq_lens [batch]
    k_scale, v_scale             float32 global scales (0-d)
    output_k, output_v           [batch, max_seq_len, heads, d] caller-owned, filled with SENTINEL

The data are random bytes: every e2m1 code pair (+-0 and +-6 among them) and every finite e4m3 scale code
(subnormals, +-448 and +-0; never the NaN codes 0x7F / 0xFF, which the contract leaves out). Every request's
pages are distinct ids drawn from a cache with spare pages, in no order; block table entries past a request's
pages are random valid ids (never read), and max_seq_len exceeds every length, so every request has rows that
must keep the sentinel. The global scales are log-uniform over [2^-4, 2^4] (finite, normal results in float16).

Edge cases (docs/boundary/dequantize_fp4.md says why each exists):
  empty_request: the first and the last request have length 0 (no page: their rows all keep the sentinel);
  page_edges: lengths exactly one page, one past a page, two pages, one short of a page, 1 and three pages less
    one: last pages full and partly used;
  shared_pages: request 1 starts with request 0's first pages (a common prefix, read twice) and request 2 lists
    its pages in descending id order;
  scale_landmarks: the block scales cycle through +-0, the smallest and largest subnormal, the smallest normal and
    +-448, and the cache bytes through all 256 code pairs in order;
  near_overflow: +-448 scales beside +-6 codes in a quarter of the blocks; k_scale the largest power of two that
    keeps 6 x 448 x k_scale finite in the output dtype, v_scale twice it (its largest products round to +-inf);
  zero_global_scale: k_scale = 0 (every K value +-0), v_scale as usual.
"""

from __future__ import annotations

import torch

from .common import Builder, log_uniform, permutation, randint, unknown_inputs

OP_TYPES = ("dequantize_fp4",)
INPUTS = ("paged_k_cache", "paged_v_cache", "k_scales", "v_scales", "block_tables", "seq_lens", "k_scale", "v_scale",
          "output_k", "output_v")
CASES = ("empty_request", "page_edges", "shared_pages", "scale_landmarks", "near_overflow", "zero_global_scale")

# (requests, longest request in tokens): the outputs (batch x max_seq_len x heads x d, twice) are what a case
# costs on a CPU; medium keeps them near a million elements each
TIERS = {"small": (3, 40), "medium": (6, 160), "large": (32, 4000)}
SPARE = 3  # pages no request owns, beyond a third more than the requests use
SENTINEL = -768.0  # what output_k / output_v hold before the call: exact in bfloat16 and float16
NAN_CODES = (0x7F, 0xFF)  # e4m3fn's NaN: outside the contract
# +-0, +-the smallest subnormal (2^-9), the largest subnormal (7 x 2^-9), the smallest normal (2^-6), +-448
LANDMARKS = (0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x7E, 0xFE)
GLOBAL_LOG2 = (-4.0, 4.0)


def edge_cases(definition) -> list[str]:
    return list(CASES)


def layout(b: Builder) -> str:
    """"NHD" or "HND", from the cache's axes; a mismatch for anything else."""
    shape = b.spec("paged_k_cache").shape or []
    if len(shape) == 4 and shape[1] == "page_size":
        return "NHD"
    if len(shape) == 4 and shape[2] == "page_size":
        return "HND"
    raise b.mismatch(f"paged_k_cache {shape} is neither [num_pages, page_size, heads, d/2] nor "
                     "[num_pages, heads, page_size, d/2]")


def _lengths(b: Builder, page: int) -> list[int]:
    requests, longest = TIERS[b.size]
    requests = b.count(requests) if b.case is None else requests
    longest = max(longest, 3 * page)
    g = b.rng("lengths")
    lens = randint(1, longest + 1, (requests,), g).tolist()
    if b.case == "empty_request":
        lens = [0, *lens, 0]
    elif b.case == "page_edges":
        lens = [page, page + 1, 2 * page, page - 1, 1, 3 * page - 1, *lens]
    elif b.case == "shared_pages":
        lens = [max(n, 2 * page + 1) for n in lens[:3]] + lens[3:] + [2 * page + 1] * max(0, 3 - len(lens))
    return lens


def _pages(b: Builder, counts: list[int], num_pages: int) -> list[list[int]]:
    ids = permutation(num_pages, b.rng("pages"))[:sum(counts)].tolist()
    out, start = [], 0
    for c in counts:
        out.append(ids[start:start + c])
        start += c
    if b.case == "shared_pages":
        shared = min(len(out[0]), len(out[1])) // 2 + 1
        out[1][:shared] = out[0][:shared]  # a common prefix: the same pages, read by two requests
        out[2] = sorted(out[2], reverse=True)
    return out


def _scale_codes(b: Builder, name: str) -> torch.Tensor:
    """Uniform over the 254 finite e4m3 codes, as float8_e4m3fn."""
    r = randint(0, 254, b.shape(name), b.rng(f"{name}:codes"), dtype=torch.int32, device=b.device)
    codes = r + (r >= NAN_CODES[0]).to(torch.int32)  # 0..126, 128..254: 0x7F and 0xFF skipped
    if b.case == "scale_landmarks":
        flat = codes.reshape(-1)
        marks = torch.tensor(LANDMARKS, dtype=torch.int32, device=b.device)
        flat[:] = marks.repeat(-(-flat.numel() // len(LANDMARKS)))[:flat.numel()]
    elif b.case == "near_overflow":  # a quarter of the blocks at +-448
        pick = randint(0, 4, codes.shape, b.rng(f"{name}:max"), dtype=torch.int32, device=b.device)
        sign = randint(0, 2, codes.shape, b.rng(f"{name}:sign"), dtype=torch.int32, device=b.device)
        codes = torch.where(pick == 0, 0x7E + 0x80 * sign, codes)
    return codes.to(torch.uint8).view(torch.float8_e4m3fn)


def _cache_bytes(b: Builder, name: str, scales: torch.Tensor) -> torch.Tensor:
    shape = b.shape(name)
    data = randint(0, 256, shape, b.rng(f"{name}:bytes"), dtype=torch.uint8, device=b.device)
    if b.case == "scale_landmarks":
        n = data.numel()
        data = (torch.arange(n, device=b.device) % 256).to(torch.uint8).reshape(shape)
    elif b.case == "near_overflow":  # the +-448 blocks hold +-6 pairs (0x77: +6 +6, 0xFF: -6 -6, 0x7F, 0xF7)
        top = (scales.view(torch.uint8) & 0x7F) == 0x7E
        top = top.repeat_interleave(8, dim=-1)  # 16 elements a scale: 8 bytes
        six = torch.tensor([0x77, 0xFF, 0x7F, 0xF7], dtype=torch.uint8, device=b.device)
        which = randint(0, 4, shape, b.rng(f"{name}:six"), device=b.device)
        data = torch.where(top, six[which], data)
    return data.contiguous()


def global_scales(b: Builder) -> tuple[float, float]:
    """(k_scale, v_scale) of the case."""
    g = [float(log_uniform((1,), b.rng(f"{n}:global"), *GLOBAL_LOG2)[0]) for n in ("k_scale", "v_scale")]
    if b.case == "zero_global_scale":
        g[0] = 0.0
    elif b.case == "near_overflow":
        biggest = torch.finfo(b.torch_dtype("output_k")).max
        e = 0
        while 6 * 448 * 2.0 ** (e + 1) <= biggest:
            e += 1
        while 6 * 448 * 2.0 ** e > biggest:
            e -= 1
        g = [2.0 ** e, 2.0 ** (e + 1)]
    return g[0], g[1]


def generate(b: Builder) -> None:
    unknown_inputs(b, INPUTS, "dequantize_fp4")
    missing = [n for n in INPUTS if not b.has(n)]
    if missing:
        raise b.mismatch(f"a dequantize_fp4 definition needs input(s) {', '.join(missing)}")
    layout(b)  # NHD or HND, or a mismatch
    page = b.axis("page_size")
    lens = _lengths(b, page)
    counts = [-(-n // page) for n in lens]
    used = sum(counts)
    num_pages = used + used // 3 + SPARE
    pages = _pages(b, counts, num_pages)
    g = b.rng("slack")
    max_seq_len = max(lens) + int(randint(1, page + 2, (1,), g)[0])  # every request has rows past its length
    stride = -(-max_seq_len // page) + int(randint(0, 2, (1,), g)[0])
    table = randint(0, num_pages, (len(lens), stride), b.rng("padding"))  # entries past a request's pages
    for r, mine in enumerate(pages):
        if mine:
            table[r, :len(mine)] = torch.tensor(mine, dtype=torch.int64)
    b.put("block_tables", table.to(torch.int32))
    b.put("seq_lens", torch.tensor(lens, dtype=torch.int32))
    b.set_axis("num_pages", num_pages)
    b.set_axis("max_seq_len", max_seq_len)
    for cache, sf in (("paged_k_cache", "k_scales"), ("paged_v_cache", "v_scales")):
        scales = _scale_codes(b, sf)
        b.put(sf, scales)
        b.put(cache, _cache_bytes(b, cache, scales))
    k, v = global_scales(b)
    b.put("k_scale", torch.tensor(k, dtype=torch.float32))
    b.put("v_scale", torch.tensor(v, dtype=torch.float32))
    for out in ("output_k", "output_v"):
        b.put(out, torch.full(b.shape(out), SENTINEL, dtype=b.torch_dtype(out), device=b.device))
