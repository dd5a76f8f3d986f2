"""FlashInfer ground truth of chain speculative sampling: `flashinfer.sampling.chain_speculative_sampling`
(op_type `sampling`; FlashInfer's fi_trace files it as `chain_speculative_sampling_v32000`).

Read in flashinfer/sampling.py (python/flashinfer/sampling.py before v0.2.0) and include/flashinfer/sampling.cuh:
* v0.1.0-v0.1.5: (draft_probs, draft_token_ids, uniform_samples, target_probs), the uniforms the caller's; v0.1.4
  adds `deterministic`; v0.1.6-v0.2.2 `maybe_output_accepted_token_num`, `maybe_output_emitted_token_num`. Not
  called here (the uniforms are an input no definition has): api-missing before 0.2.3.
* v0.2.3: (draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None,
  maybe_output_emitted_token_num=None, deterministic=True, generator=None), returning (output_token_ids,
  output_accepted_token_num, output_emitted_token_num); the kernel draws its own Philox uniforms.
* v0.2.5: the third keyword renamed `maybe_output_emitted_draft_token_num` (v0.2.4 still has the old name).
* v0.6.0: `seed=None, offset=None` (explicit Philox seed and offset); v0.6.6: either may be a tensor.
In every release >= 0.2.3 the kernel tests `u * p_draft < p_target` (u = curand_uniform, in (0, 1]), stops at the
first failure, draws the stop's token from relu(target - draft) (the bonus row where nothing failed), pads with
-1 and ADDS its counts into the two count tensors (`+=`: a caller's tensors accumulate across calls). Its accepted
count re-tests the token it stopped at with a fresh uniform (the second loop starts at the stop, not after it),
where the documentation counts every token's own test: the definitions state the documented count
(docs/boundary/speculative.md).

Call modes, each its own path: the plain call (no count tensors, deterministic=True, a seeded torch.Generator
advancing across the calls of a case); `counts-in-place` (count tensors passed, starting at COUNT_START: the
API must add into them and return them; its keyword named per release); `nondeterministic`
(deterministic=False); `seed-offset` (explicit seed= and offset=, the offset moved past what a call consumes;
api-missing before 0.6.0); `replay` (per row: two calls from one generator state agree, the advanced state and
two calls without a generator differ; SamplerCallBroken otherwise, a `bug`).
"""

from __future__ import annotations

from typing import Any

import torch
from packaging.specifiers import SpecifierSet

from ..inputs.speculative import DRAFT, IDS, TARGET, is_chain
from .base import Adapter, Call, GroundTruthUnavailable, SamplerCallBroken, accepts, keywords
from .flashinfer import PACKAGE
from .torch_speculative import encode, sizes

API = "chain_speculative_sampling"
VERSIONS = SpecifierSet(">=0.2.3")
COUNTS_IN_PLACE, NONDETERMINISTIC, SEED_OFFSET, REPLAY = "counts-in-place", "nondeterministic", "seed-offset", "replay"
ACCEPTED = "maybe_output_accepted_token_num"
EMITTED = ("maybe_output_emitted_draft_token_num", "maybe_output_emitted_token_num")  # >= 0.2.5, 0.2.3-0.2.4
COUNT_START = 7  # the in-place mode's count tensors start here: the API adds to them
ELEMENTS_PER_CALL = 1 << 28  # repeated rows x (2n + 1) x vocab float32 per call: 1 GiB
GENERATOR_SEED = 0xF1
REPLAY_DRAWS = 1024


def applies(d) -> str | None:
    if not (d.is_sampler and is_chain(d)):
        return f"not chain speculative sampling (inputs {', '.join(d.inputs)})"
    tags = [t.removeprefix("fi_api:") for t in d.tags if t.startswith("fi_api:")]
    if tags and f"flashinfer.sampling.{API}" not in tags:
        return f"its fi_api tag names {tags[0]}, not flashinfer.sampling.{API}"
    return None


def emitted_keyword(fn) -> str | None:
    return next((k for k in EMITTED if accepts(fn, k)), None)


class Chain:
    """One case's calls: `draw(row, k, generator)` runs the API on row `row` repeated k times and encodes each
    outcome (torch_speculative.encode: -1 where the deterministic contract is broken)."""

    def __init__(self, call: Call):
        self.call = call
        self.fn = getattr(call.module.sampling, API)
        if accepts(self.fn, "uniform_samples"):
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {API} takes uniform_samples "
                                                        "(the generator API is >= 0.2.3)")
        if call.mode == SEED_OFFSET and not accepts(self.fn, "seed"):
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {API} has no seed / offset "
                                                        "(>= 0.6.0)")
        if call.mode == COUNTS_IN_PLACE and (not accepts(self.fn, ACCEPTED) or emitted_keyword(self.fn) is None):
            raise GroundTruthUnavailable("api-missing", f"flashinfer {call.version} {API} takes no count tensors")
        x = call.inputs.values
        self.draft, self.ids, self.target = x[DRAFT], x[IDS], x[TARGET]
        self.batch, self.n, self.vocab = sizes(x)
        self.seed = call.inputs.seed + GENERATOR_SEED
        self.offset = 0

    @property
    def rows_per_call(self) -> int:
        return max(1, ELEMENTS_PER_CALL // ((2 * self.n + 1) * self.vocab))

    def raw(self, row: int, k: int, generator: torch.Generator | None) -> tuple[torch.Tensor, ...]:
        """(tokens, accepted, emitted) of one call on row `row` repeated k times."""
        rep = [t[row:row + 1].expand(k, *t.shape[1:]).contiguous() for t in (self.draft, self.ids, self.target)]
        kw: dict[str, Any] = keywords(self.fn, deterministic=self.call.mode != NONDETERMINISTIC)
        start = None
        if self.call.mode == COUNTS_IN_PLACE:
            start = [torch.full((k,), COUNT_START, dtype=torch.int32, device=self.ids.device) for _ in range(2)]
            kw[ACCEPTED], kw[emitted_keyword(self.fn)] = start[0], start[1]
        if self.call.mode == SEED_OFFSET:
            kw.update(seed=self.seed, offset=self.offset)
            self.offset += -(-(2 * self.n + 2) // 4) * 4  # past every uniform one row's chain consumes
        elif generator is not None:
            kw.update(keywords(self.fn, generator=generator))
        out = self.fn(*rep, **kw)
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise SamplerCallBroken(f"{API} returned {type(out).__name__}, not (output_token_ids, "
                                    "output_accepted_token_num, output_emitted_draft_token_num)")
        tokens, accepted, emitted = out
        if start is not None:
            for name, given, back in (("accepted", start[0], accepted), ("emitted", start[1], emitted)):
                if back.data_ptr() != given.data_ptr():
                    raise SamplerCallBroken(f"{API}: the {name} count tensor passed in is not the one returned")
            accepted, emitted = accepted - COUNT_START, emitted - COUNT_START  # it adds: the call's own counts
        return tokens, accepted, emitted

    def draw(self, row: int, k: int, generator: torch.Generator | None) -> torch.Tensor:
        tokens, accepted, emitted = self.raw(row, k, generator)
        return encode(tokens, accepted, emitted, self.ids[row:row + 1].expand(k, -1), self.vocab)

    def replay(self) -> None:
        """Same generator state: the same outputs; the advanced state, and no generator: other outputs."""
        for row in range(self.batch):
            g = torch.Generator(device=self.ids.device).manual_seed(self.seed + row)
            state = g.get_state()
            first = self.draw(row, REPLAY_DRAWS, g)
            g.set_state(state)
            again = self.draw(row, REPLAY_DRAWS, g)
            where = f"{API}, row {row}, {REPLAY_DRAWS} calls"
            if not torch.equal(first, again):
                raise SamplerCallBroken(f"{where}: two calls from the same generator state returned differently "
                                        f"({int((first != again).sum())} outcomes differ)")
            if int(torch.bincount(first.clamp(min=0)).max()) > 0.9 * first.numel():
                continue  # an outcome that is (nearly) determined: two calls cannot be told apart
            if torch.equal(again, self.draw(row, REPLAY_DRAWS, g)):
                raise SamplerCallBroken(f"{where}: the call after them returned the same outcomes (the generator's "
                                        "state did not advance)")
            if torch.equal(self.draw(row, REPLAY_DRAWS, None), self.draw(row, REPLAY_DRAWS, None)):
                raise SamplerCallBroken(f"{where}: two calls without a generator returned the same outcomes")


def run(call: Call) -> tuple:
    """[batch, draws] int64 outcome codes: each row repeated, one seeded generator for the case."""
    chain = Chain(call)
    if call.mode == REPLAY:
        chain.replay()
    g = torch.Generator(device=chain.ids.device).manual_seed(chain.seed)
    out = torch.empty(chain.batch, call.draws, dtype=torch.int64)
    for row in range(chain.batch):
        done = 0
        while done < call.draws:
            k = min(call.draws - done, chain.rows_per_call)
            out[row, done:done + k] = chain.draw(row, k, g)
            done += k
    return (out,)


def plan_batch(call: Call):
    """One call on the whole batch, the plain form (what a serving step launches): the closure timing times."""
    fn = getattr(call.module.sampling, API)
    x = call.inputs.values
    g = torch.Generator(device=x[IDS].device).manual_seed(call.inputs.seed + GENERATOR_SEED)
    extra = keywords(fn, deterministic=True, generator=g)
    return lambda: fn(x[DRAFT], x[IDS], x[TARGET], **extra)


ADAPTERS = [
    Adapter("flashinfer", "sampling", f"flashinfer.sampling.{API}", run, package=PACKAGE, versions=VERSIONS,
            requires=(f"sampling.{API}",), applies=applies, needs_cuda=True, kind="sampler",
            modes=(COUNTS_IN_PLACE, NONDETERMINISTIC, SEED_OFFSET, REPLAY)),
]
