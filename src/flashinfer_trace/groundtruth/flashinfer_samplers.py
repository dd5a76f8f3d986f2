"""FlashInfer ground truth for the samplers of inputs/samplers.py: `flashinfer.sampling.sampling_from_probs`,
`min_p_sampling_from_probs`, `sampling_from_logits` and `top_k_top_p_sampling_from_logits` (op_type `sampling`).

Read in flashinfer/sampling.py and include/flashinfer/sampling.cuh from v0.1.4 to main (2026-11):
min_p_sampling_from_probs and top_k_top_p_sampling_from_logits appear in v0.1.4 and sampling_from_probs in v0.1.0,
all taking a `uniform_samples` tensor up to v0.2.2; v0.2.3 replaced it by `indices=None, deterministic=True,
generator=None` (the API called here, hence >= 0.2.3); sampling_from_logits appears in v0.2.6 (Gumbel-max: argmax of
logit + Gumbel noise, no exp); `seed=` / `offset=` (explicit Philox seed and offset) in v0.6.0; `return_valid` in
v0.6.9 (left at its default). Every one casts its input to float32 and returns int32 samples (the indices' dtype
when `indices` is given). min-p keeps `prob >= max_val * p` (a float32 product) in every release. top_k_top_p over
logits in its default order `top_k_first` is top_k_mask_logits, torch.softmax, top_p_sampling_from_probs; from
v0.6.14 (nightly after 0.6.13) a Python int top_k in (0, 256] on a vocabulary >= 65536 without indices takes a fast
path instead, a radix top-k that keeps exactly k ("ties at the k-th position may be resolved differently"): on a
row with a tie at the k-th logit that path is outside the definitions' tie rule, and the case is an `unsupported`
skip saying so (detected by the release's `_top_k_first_fast_path_applicable`, not by its version).

Call modes, each its own path (docs/ground-truth.md): the definition's form (a per-row tensor or one Python scalar
for every row) and the other form: `scalar` (a per-row definition's row value as a Python scalar: each call draws
from one row repeated, so one value is every row's) or `per-row` (a scalar definition's value as a tensor);
`nondeterministic` (deterministic=False; not for sampling_from_logits, whose flag the API keeps "for
compatibility" only); `indices` (the row once, and `indices` of zeros mapping every output to it: the API's own way
to draw many samples of one distribution; parameters as scalars, since before 0.6 a parameter tensor must have one
value per row of the distribution input); `seed-offset` (explicit `seed=` and `offset=` integers, the offset moved
past what each call consumes; api-missing before 0.6.0); `replay` (before drawing, per row: two calls from the same
generator state must agree, a third from the advanced state must differ, and so must two calls without a
generator; SamplerCallBroken otherwise, a `bug` of the ground-truth side). The plain call passes deterministic=True
and a seeded torch.Generator that advances across the calls of a case, so a case's draws replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from packaging.specifiers import SpecifierSet

from ..inputs.samplers import LOGITS, MIN_P, PROBS, TOP_K, TOP_P, kind
from .base import Adapter, Call, GroundTruthUnavailable, SamplerCallBroken, accepts, keywords
from .flashinfer import PACKAGE

# kind -> (API, the releases whose signature is the one called here)
APIS = {
    "probs": ("sampling_from_probs", SpecifierSet(">=0.2.3")),
    "min_p": ("min_p_sampling_from_probs", SpecifierSet(">=0.2.3")),
    "logits": ("sampling_from_logits", SpecifierSet(">=0.2.6")),
    "logits_top_k_top_p": ("top_k_top_p_sampling_from_logits", SpecifierSet(">=0.2.3")),
}
PARAMS = {TOP_K: torch.int32, TOP_P: torch.float32, MIN_P: torch.float32}  # in the API's positional order
ROWS_PER_CALL = 4096
SCALAR, PER_ROW = "scalar", "per-row"
NONDETERMINISTIC, INDICES, SEED_OFFSET, REPLAY = "nondeterministic", "indices", "seed-offset", "replay"
GENERATOR_SEED = 0xF1  # the generator's seed: the case's seed plus this (the older samplers' value)
FAST_PATH = "_top_k_first_fast_path_applicable"  # flashinfer.sampling, from 0.6.14: exactly k kept
FAST_PATH_MAX_K, FAST_PATH_MIN_VOCAB = 256, 65536
REPLAY_DRAWS = 1024  # draws per replay call; a row is informative when no token takes more than VARIED of them
VARIED = 0.9


def _params_of(d) -> list[str]:
    return [n for n in PARAMS if n in d.inputs]


def _scalar_form(d) -> bool | None:
    """True: the definition's parameters are Python scalars; False: per-row tensors; None: it has none."""
    names = _params_of(d)
    return None if not names else not d.inputs[names[0]].shape


def applies_to(want: str, scalar: bool | None, api: str):
    def applies(d) -> str | None:
        if not d.is_sampler or kind(d) != want:
            return f"not {api} (inputs {', '.join(d.inputs)})"
        tags = [t.removeprefix("fi_api:") for t in d.tags if t.startswith("fi_api:")]
        if tags and f"flashinfer.sampling.{api}" not in tags:
            return f"its fi_api tag names {tags[0]}, not flashinfer.sampling.{api}"
        if _scalar_form(d) != scalar:
            return "parameters per row" if scalar else "parameters as scalars"
        return None
    return applies


class Drawer:
    """The arguments of one call drawing n samples from row `row` in a call mode, and the draws."""

    def __init__(self, call: Call, fn: Callable, api: str, *, fixed: dict[str, Any] | None = None):
        self.call, self.fn, self.api = call, fn, api
        x = call.inputs.values
        self.dist = x[LOGITS] if LOGITS in x else x[PROBS]
        self.names = _params_of(call.definition)
        mode = call.mode
        scalar = _scalar_form(call.definition)
        self.as_scalar = mode in (SCALAR, INDICES) or (scalar is True and mode != PER_ROW)
        self.fixed = dict(fixed or {})
        self.seed = call.inputs.seed + GENERATOR_SEED
        self.offset = 0
        for name, needed in ((INDICES, "indices"), (SEED_OFFSET, "seed")):
            if mode == name and not accepts(fn, needed):
                raise GroundTruthUnavailable("api-missing", f"{call.module.__name__} {call.version} {api} has no "
                                                            f"{needed}")

    def values(self, row: int, n: int) -> list[Any]:
        x, out = self.call.inputs.values, []
        for name in self.names:
            v = x[name]
            if self.as_scalar:
                v = v[row].item() if isinstance(v, torch.Tensor) else v
                out.append(int(v) if name == TOP_K else float(v))
            elif isinstance(v, torch.Tensor):
                out.append(v[row:row + 1].to(PARAMS[name]).expand(n).contiguous())
            else:
                out.append(torch.full((n,), v, dtype=PARAMS[name], device=self.dist.device))
        return out

    def arguments(self, row: int, n: int) -> tuple[list[Any], dict[str, Any]]:
        """(positional arguments, keywords without the generator)."""
        kw = dict(self.fixed)
        kw.update(keywords(self.fn, deterministic=self.call.mode != NONDETERMINISTIC))
        if self.call.mode == INDICES:
            dist = self.dist[row:row + 1].contiguous()
            kw["indices"] = torch.zeros(n, dtype=torch.int32, device=self.dist.device)
        else:
            dist = self.dist[row:row + 1].expand(n, -1).contiguous()
        params = self.values(row, n)
        self._fast_path_ties(row, params, kw)
        return [dist, *params], kw

    def _fast_path_ties(self, row: int, params: list[Any], kw: dict[str, Any]) -> None:
        """The release's top_k_first fast path keeps exactly k: a tie at the k-th logit is not the definition's."""
        sampling = getattr(self.call.module, "sampling", None)  # sgl_kernel has none
        if TOP_K not in self.names or "indices" in kw or not hasattr(sampling, FAST_PATH):
            return
        k, vocab = params[self.names.index(TOP_K)], self.dist.shape[1]
        if not isinstance(k, int) or not (0 < k <= FAST_PATH_MAX_K) or k >= vocab or vocab < FAST_PATH_MIN_VOCAB:
            return
        top = torch.topk(self.dist[row].float(), k + 1).values
        if bool(top[k - 1] == top[k]):
            raise GroundTruthUnavailable("unsupported", f"flashinfer {self.call.version} {self.api}: a Python int "
                                         f"top_k <= {FAST_PATH_MAX_K} takes the top_k_first fast path, a radix top-k "
                                         f"keeping exactly k, and row {row} ties at the k-th logit: outside the "
                                         "definition's tie rule (docs/boundary/samplers.md)")

    def draw(self, row: int, n: int, generator: torch.Generator | None) -> torch.Tensor:
        args, kw = self.arguments(row, n)
        if self.call.mode == SEED_OFFSET:
            kw.update(seed=self.seed, offset=self.offset)
            self.offset += -(-n * self.dist.shape[1] // 4) * 4  # past every value the call consumes
        elif generator is not None:
            kw.update(keywords(self.fn, generator=generator))
        out = self.fn(*args, **kw)
        return (out[0] if isinstance(out, (tuple, list)) else out).reshape(-1).to(torch.int64)

    def replay(self, rows: int) -> None:
        """Same generator state: the same draws; the advanced state, and no generator: other draws."""
        device = self.dist.device
        for row in range(rows):
            g = torch.Generator(device=device).manual_seed(self.seed + row)
            state = g.get_state()
            first = self.draw(row, REPLAY_DRAWS, g)
            g.set_state(state)
            again = self.draw(row, REPLAY_DRAWS, g)
            where = f"{self.api}, row {row}, {REPLAY_DRAWS} draws"
            if not torch.equal(first, again):
                raise SamplerCallBroken(f"{where}: two calls from the same generator state drew differently "
                                        f"({int((first != again).sum())} draws differ)")
            if not _varied(first):
                continue
            if torch.equal(again, self.draw(row, REPLAY_DRAWS, g)):
                raise SamplerCallBroken(f"{where}: the call after them drew the same tokens (the generator's state "
                                        "did not advance)")
            if torch.equal(self.draw(row, REPLAY_DRAWS, None), self.draw(row, REPLAY_DRAWS, None)):
                raise SamplerCallBroken(f"{where}: two calls without a generator drew the same tokens")


def _varied(draws: torch.Tensor) -> bool:
    """Whether two independent sets of these draws can be told apart: no token takes more than VARIED of them."""
    return int(torch.bincount(draws.cpu()).max()) <= VARIED * draws.numel()


def draw_all(drawer: Drawer, draws: int) -> tuple:
    """[batch, draws] int64: each row repeated, ROWS_PER_CALL draws a call, one seeded generator for the case."""
    batch = drawer.dist.shape[0]
    if drawer.call.mode == REPLAY:
        drawer.replay(batch)
    g = torch.Generator(device=drawer.dist.device).manual_seed(drawer.seed)
    out = torch.empty(batch, draws, dtype=torch.int64, device=drawer.dist.device)
    for row in range(batch):
        done = 0
        while done < draws:
            n = min(draws - done, ROWS_PER_CALL)
            out[row, done:done + n] = drawer.draw(row, n, g)
            done += n
    return (out,)


def sampler(api: str):
    def run(call: Call) -> tuple:
        fn = getattr(call.module.sampling, api)
        fixed = {"filter_apply_order": "top_k_first"} if api == "top_k_top_p_sampling_from_logits" else {}
        return draw_all(Drawer(call, fn, api, fixed=keywords(fn, **fixed)), call.draws)
    return run


def plan_batch(api: str):
    """One call on the whole batch, one draw per row, the definition's form (what a serving step launches): the
    closure the timing harness times (timing/kernels.py)."""
    def launch(call: Call):
        fn = getattr(call.module.sampling, api)
        x = call.inputs.values
        dist = x[LOGITS] if LOGITS in x else x[PROBS]
        params = [x[n].to(PARAMS[n]) if isinstance(x[n], torch.Tensor) else x[n] for n in _params_of(call.definition)]
        g = torch.Generator(device=dist.device).manual_seed(call.inputs.seed + GENERATOR_SEED)
        extra = keywords(fn, deterministic=True, generator=g)
        if api == "top_k_top_p_sampling_from_logits":
            extra.update(keywords(fn, filter_apply_order="top_k_first"))
        return lambda: fn(dist, *params, **extra)
    return launch


def _adapters() -> list[Adapter]:
    out = []
    for k, (api, versions) in APIS.items():
        common = (NONDETERMINISTIC,) if k != "logits" else ()
        forms = (None,) if k in ("probs", "logits") else (False, True)
        for scalar in forms:
            flip = () if scalar is None else ((PER_ROW,) if scalar else (SCALAR,))
            out.append(Adapter("flashinfer", "sampling", f"flashinfer.sampling.{api}", sampler(api), package=PACKAGE,
                               versions=versions, requires=(f"sampling.{api}",), applies=applies_to(k, scalar, api),
                               needs_cuda=True, kind="sampler", modes=(*flip, *common, INDICES, SEED_OFFSET, REPLAY)))
    return out


ADAPTERS = _adapters()
