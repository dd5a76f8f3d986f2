"""DeepSeek sparse attention inputs (op_type `dsa_paged`, DeepSeek-V3.2): two kinds of definition,
told apart by their inputs.

* **Sparse attention** (`q_nope`, `q_pe`, `ckv_cache`, `kpe_cache`, `sparse_indices`, `sm_scale`):
  absorbed MLA where every query token attends only to the cache slots its row of `sparse_indices`
  names (slot = page * page_size + offset in the page, -1 = an unused entry). The cache is a pool of
  `num_pages` pages, about 1.5 topk tokens (small) so that rows pick most of it; each row's slots are
  distinct and drawn from the whole pool (a random subset, in random order), its -1 entries at the
  tail (or scattered, in one case). Its boundary cases are the attention families' (`SCORE_CASES`,
  shaped by attention.shape_scores over the pool; one_key_dominates puts one slot in every row) and
  `large_offsets` (the pool is the last pages of a latent cache past 2**31 elements).
* **Top-k indexer** (`q_index_fp8`, `k_index_cache_fp8`, `weights`, `seq_lens`, `block_table`): fp8
  index queries against a paged fp8 key cache in DeepGEMM's packed layout: per page, the fp8 keys of
  its page_size tokens (token-major, head_dim bytes each), then their page_size float32 scales; the
  4-d `[num_pages, page_size, 1, head_dim + 4]` int8 shape is only a size. The keys are real float32
  keys quantised per token (scale = amax / 448, the e4m3 maximum), exactly what the reference's
  unpacking inverts. Sequences are long enough for top-k to choose (topk 2048 is a const axis: the
  small tier's longest request has topk + 700 tokens) and one request is shorter than topk (its row
  ends in -1). The slots of a request's last page past its seq_len hold poisoned keys (a copy of the
  request's best key with 64x its scale): a kernel that reads past seq_len selects them.

Everything is made on the CPU (the data is a few MB: the quantisation's amax and the poisoning's
scores are reductions, which the device-independence rule of common.py keeps off the device) and
then moved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .attention import INT32_ELEMENTS, SCORE_CASES, require_large, roles, shape_scores
from .common import Builder, log_uniform, normal, permutation, random_tensor, random_words

OP_TYPES = ("dsa_paged",)

ATTENTION_INPUTS = ("q_nope", "q_pe", "ckv_cache", "kpe_cache", "sparse_indices", "sm_scale")
INDEXER_INPUTS = ("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table")

ATTENTION_CASES = ("single_token", "fewer_than_topk", "scattered_padding", "empty_row")
# the boundary cases the attention families share (inputs/attention.py, docs/boundary/attention.md): the
# softmax's arithmetic at its limits, and a latent cache whose selected slots sit past 2**31 elements
BOUNDARY_CASES = (*SCORE_CASES, "large_offsets")
PAGE_CASES = ("page_boundary",)  # only where a page holds more than one token
INDEXER_CASES = ("batch1", "shorter_than_topk", "empty_request", "exactly_topk", "tied_scores")

# DeepSeek scores MLA with the pre-absorption head dim: qk_nope_head_dim 128 + qk_rope_head_dim.
QK_NOPE_HEAD_DIM = 128
FP8_E4M3_MAX = 448.0
POISON_SCALE = 64.0  # the poisoned slots' scale, relative to the key they copy
TIED_GROUPS = 5  # tied_scores: a request's keys repeat with this period, so scores tie in large groups
WEIGHT_STD = 0.125


@dataclass(frozen=True)
class Tier:
    tokens: int  # attention: query tokens; indexer: requests
    pool: float  # attention: pool tokens as a multiple of topk; indexer: the longest request's tokens / topk
    extra: int  # indexer: tokens beyond pool * topk (so the longest request is not a multiple of a page)


TIERS = {
    "small": Tier(tokens=3, pool=1.5, extra=700),
    "medium": Tier(tokens=8, pool=2.0, extra=1333),
    "large": Tier(tokens=32, pool=8.0, extra=4099),
}


def is_indexer(definition) -> bool:
    return "k_index_cache_fp8" in definition.inputs


def edge_cases(definition) -> list[str]:
    if is_indexer(definition):
        return list(INDEXER_CASES)
    page_size = definition.const_axes.get("page_size", 1)
    return list(ATTENTION_CASES) + list(BOUNDARY_CASES) + (list(PAGE_CASES) if page_size > 1 else [])


def generate(b: Builder) -> None:
    d = b.definition
    known = INDEXER_INPUTS if is_indexer(d) else ATTENTION_INPUTS
    extra = [n for n in d.inputs if n not in known]
    missing = [n for n in known if n not in d.inputs]
    if extra or missing:
        kind = "top-k indexer" if is_indexer(d) else "sparse attention"
        raise b.mismatch(f"the dsa_paged {kind} generator makes {', '.join(known)}; "
                      + (f"unknown input(s) {', '.join(extra)}" if extra else f"missing {', '.join(missing)}"))
    if "topk" not in d.const_axes:
        raise b.error("needs a const axis 'topk' (the number of selected tokens)")
    (_indexer if is_indexer(d) else _attention)(b)


# -- helpers ----------------------------------------------------------------------------------------
def _uniform_ints(n: int, lo: int, hi: int, s) -> list[int]:
    """n integers uniform on [lo, hi] (exact integer arithmetic)."""
    if hi < lo:
        raise ValueError(f"empty range [{lo}, {hi}]")
    w = random_words(n, s) & 0x7FFFFFFF
    return (lo + w % (hi - lo + 1)).tolist()


def _const(b: Builder, name: str) -> int:
    if name not in b.definition.const_axes:
        raise b.error(f"needs a const axis {name!r}")
    return int(b.definition.const_axes[name])


# -- sparse attention -------------------------------------------------------------------------------
def _attention(b: Builder) -> None:
    topk = _const(b, "topk")
    page_size = int(b.definition.const_axes.get("page_size", 1))
    tier = TIERS[b.size]
    tokens = 1 if b.case == "single_token" else tier.tokens
    pool_pages = -(-math.ceil(tier.pool * topk) // page_size)
    pool = pool_pages * page_size
    # large_offsets: the pool is the cache's last pages, past 2**31 elements of the latent; pages before it are 0
    first_page = -(-INT32_ELEMENTS // (page_size * b.dim("ckv_cache", -1))) if b.case == "large_offsets" else 0
    g = b.rng("sparse_indices")

    if b.case == "fewer_than_topk":
        counts = _uniform_ints(tokens, 1, min(64, topk), g)
    else:
        counts = _uniform_ints(tokens, max(1, topk // 2), topk, g)
        counts[0] = topk  # one full row, always
    if b.case == "empty_row" and tokens > 1:
        counts[int(_uniform_ints(1, 1, tokens - 1, g)[0])] = 0  # not the first row only

    rows = permutation(pool, g, rows=tokens) + first_page * page_size  # each row: the pool's slots, shuffled
    indices = torch.full((tokens, topk), -1, dtype=torch.int64)
    for t, n in enumerate(counts):
        indices[t, :n] = rows[t, :n]
    if b.case == "page_boundary":
        indices = _page_boundary_rows(tokens, topk, pool_pages, page_size, g)
    elif b.case == "scattered_padding":
        # the -1 entries anywhere in the row, not only at its end
        order = permutation(topk, g, rows=tokens)
        indices = torch.gather(indices, 1, order)
    dominant = int(rows[0, 0])
    if b.case == "one_key_dominates":  # one slot in every row: the dominant key each softmax sees
        for t, n in enumerate(counts):
            if n and not bool((indices[t, :n] == dominant).any()):
                indices[t, int(_uniform_ints(1, 0, n - 1, g)[0])] = dominant

    b.put("sparse_indices", indices.to(b.torch_dtype("sparse_indices")))
    for name in ("ckv_cache", "kpe_cache"):
        b.set_dim(name, 0, first_page + pool_pages)
    for name in ("q_nope", "q_pe"):
        b.set_dim(name, 0, tokens)
    for name in ("q_nope", "q_pe"):
        b.put_random(name)
    if first_page:
        _put_pool_past_int32(b, first_page)
    else:
        for name in ("ckv_cache", "kpe_cache"):
            b.put_random(name)
    if b.case in SCORE_CASES:  # uniform_keys: the whole pool is one key
        shape_scores(b, roles(b.definition), [torch.arange(pool)], [torch.tensor([dominant])])
    b.put_scalar("sm_scale", 1.0 / math.sqrt(QK_NOPE_HEAD_DIM + b.dim("q_pe", -1)))


def _put_pool_past_int32(b: Builder, first_page: int) -> None:
    """large_offsets: caches of zeros up to `first_page`, random pages from there (the pool the rows read)."""
    names = ("ckv_cache", "kpe_cache")
    nbytes = sum(math.prod(b.shape(n)) * torch.empty(0, dtype=b.torch_dtype(n)).element_size() for n in names)
    require_large(b, nbytes, "a latent cache past 2**31 elements")
    for name in names:
        shape = b.shape(name)
        t = torch.zeros(shape, dtype=b.torch_dtype(name), device=b.device)
        t[first_page:] = random_tensor((shape[0] - first_page, *shape[1:]), b.spec(name).dtype, b.rng(name),
                                       device=b.device)
        b.put(name, t)
        b.sparse.add(name)


def _page_boundary_rows(tokens: int, topk: int, pages: int, page_size: int, g) -> torch.Tensor:
    """Rows of slots that straddle page boundaries: the last slot of a page with the first of the
    next, for random pages, plus the pool's very first and very last slots; the rest -1."""
    indices = torch.full((tokens, topk), -1, dtype=torch.int64)
    pairs = min(topk // 2 - 1, pages - 1)
    for t in range(tokens):
        edges = (permutation(pages - 1, g)[:pairs] + 1) * page_size  # first slot of a page (not page 0)
        chosen = torch.stack([edges - 1, edges], dim=1).flatten()
        chosen = torch.cat([torch.tensor([0, pages * page_size - 1]), chosen]).unique()
        chosen = chosen[permutation(chosen.numel(), g)]
        indices[t, :chosen.numel()] = chosen
    return indices


# -- top-k indexer ----------------------------------------------------------------------------------
def _indexer_lengths(b: Builder, topk: int, page_size: int) -> list[int]:
    tier = TIERS[b.size]
    longest = int(tier.pool * topk) + tier.extra
    g = b.rng("seq_lens")
    case = b.case
    n = 1 if case == "batch1" else tier.tokens
    if case == "shorter_than_topk":
        lens = _uniform_ints(n, 1, topk - 1, g)
        lens[0] = topk - 1
    elif case == "exactly_topk":
        lens = [topk, topk + 1, topk - 1, *_uniform_ints(max(0, n - 3), topk, longest, g)][:n]
    else:
        lens = _uniform_ints(n, topk // 4, longest, g)
        lens[0] = longest  # longer than topk: top-k chooses
        if n > 1:
            lens[1] = _uniform_ints(1, 1, topk - 1, g)[0]  # shorter: its row ends in -1
        if n > 2:
            lens[2] = -(-lens[2] // page_size) * page_size  # a full last page
    if case == "empty_request" and n > 1:
        lens[int(_uniform_ints(1, 1, n - 1, g)[0])] = 0
    return lens


def _indexer(b: Builder) -> None:
    d = b.definition
    topk, page_size = _const(b, "topk"), _const(b, "page_size")
    heads, head_dim = b.dim("q_index_fp8", 1), b.dim("q_index_fp8", 2)
    packed = b.dim("k_index_cache_fp8", -1)
    if packed != head_dim + 4:
        raise b.mismatch(f"k_index_cache_fp8's last dimension is {packed}; the packed layout needs "
                      f"index_head_dim + 4 = {head_dim + 4} (fp8 key bytes, then a float32 scale)")
    if b.dim("k_index_cache_fp8", 2) != 1:
        raise b.mismatch("k_index_cache_fp8 must have one kv head (dimension 2)")
    lens = _indexer_lengths(b, topk, page_size)
    batch = len(lens)
    pages_per = [-(-n // page_size) for n in lens]
    used = sum(pages_per)
    num_pages = used + max(2, used // 4)
    width = max(max(pages_per), -(-topk // page_size))  # the constraint topk <= max_num_pages * page_size
    g = b.rng("block_table")
    order = permutation(num_pages, g)
    table = torch.empty(batch, width, dtype=torch.int64)
    spare = order[used:]
    start = 0
    for r, p in enumerate(pages_per):
        table[r, :p] = order[start:start + p]
        start += p
        # entries past the request's pages name pages that are not its own (never to be read)
        table[r, p:] = spare[torch.arange(width - p) % spare.numel()]

    keys = normal((num_pages, page_size, head_dim), b.rng("k_index_cache_fp8"))
    keys = keys * log_uniform((num_pages, page_size, 1), b.rng("key_norms"), -1.0, 1.0)  # norms vary 4x
    amax = keys.abs().amax(dim=-1)  # [num_pages, page_size], > 0 for any normal draw
    scales = (amax / FP8_E4M3_MAX).to(torch.float32)
    codes = (keys / scales[..., None]).to(torch.float8_e4m3fn)
    q = normal((batch, heads, head_dim), b.rng("q_index_fp8")).to(torch.float8_e4m3fn)
    weights = normal((batch, heads), b.rng("weights"), scale=WEIGHT_STD)

    codes_flat = codes.view(num_pages * page_size, head_dim)
    scales_flat = scales.view(num_pages * page_size)
    for r, n in enumerate(lens):
        if n == 0:
            continue
        slots = (table[r, :pages_per[r], None] * page_size + torch.arange(page_size)).flatten()
        if b.case == "tied_scores":
            src = slots[torch.arange(n) % TIED_GROUPS]
            codes_flat[slots[:n]] = codes_flat[src].clone()
            scales_flat[slots[:n]] = scales_flat[src].clone()
        tail = slots[n:]
        if tail.numel():
            per_head = q[r].to(torch.float64) @ (codes_flat[slots[:n]].to(torch.float64)
                                                 * scales_flat[slots[:n], None].to(torch.float64)).T
            score = (torch.relu(per_head) * weights[r, :, None].to(torch.float64)).sum(dim=0)
            best = slots[int(score.argmax())]
            codes_flat[tail] = codes_flat[best].clone()
            scales_flat[tail] = float(scales_flat[best]) * POISON_SCALE

    cache = pack_index_cache(codes, scales).view(b.torch_dtype("k_index_cache_fp8"))
    b.put("seq_lens", torch.tensor(lens, dtype=b.torch_dtype("seq_lens")))
    b.put("block_table", table.to(b.torch_dtype("block_table")))
    b.put("k_index_cache_fp8", cache)
    b.put("q_index_fp8", q.to(b.torch_dtype("q_index_fp8")))
    b.put("weights", weights.to(b.torch_dtype("weights")))
    for axis in d.axes:  # a var axis only the reference would know (none in the public file) is an error
        if axis not in b.axes:
            raise b.error(f"axis {axis!r}: the indexer generator cannot derive it")


def pack_index_cache(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[num_pages, page_size, head_dim] fp8 codes and [num_pages, page_size] float32 scales -> the packed
    int8 [num_pages, page_size, 1, head_dim + 4] cache (tests build caches with it)."""
    num_pages, page_size, head_dim = codes.shape
    raw = torch.cat([codes.view(torch.uint8).reshape(num_pages, -1),
                     scales.to(torch.float32).contiguous().view(torch.uint8).reshape(num_pages, -1)], dim=1)
    return raw.view(num_pages, page_size, 1, head_dim + 4).view(torch.int8)
