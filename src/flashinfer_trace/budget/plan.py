"""A case's planned peak of device memory: every copy that lives at once, from the sizes of its inputs.

One case group (a definition's inputs at one size, seed and edge case) is generated once and shared by its
checks and sources (check.Memo), so the plan is the group's standing data plus the largest phase of the case
being run:

    standing    the pristine inputs, the reference's outputs
    reference   a copy of the inputs for the call, the CUDA arena holding inputs and outputs for the worker,
                the worker's own temporaries (a plain-torch reference upcasts to float32); only in the cases that
                run the reference (the group's first, a determinism check): the others keep its outputs
    kernel      per run, a copy of the inputs, its outputs and the first run's kept for the spread; the
                wrapper's workspace; a CUDA graph or plan-reuse path keeps a live copy of the inputs and the
                other data besides
    torch       the float64 ground truth: every floating input upcast, and its intermediates
    sampler     one call's repeated rows (the reference's and the kernel's chunks), and the draws
    compare     both outputs upcast to float64 and what is computed from them, a slice of at most
                COMPARE_CHUNK elements at a time (verdict/compare.py)

After each case the process gives back what its phases cached and its lease shrinks to what the group still
holds (guard.CaseMemory.settle): the first case of a large group may need the device alone, its later ones not.

What the plan leaves out it learns: a case whose measured peak passes its plan is reported (a bug of the
planner, CaseRecord.memory) and raises every later plan of its op type and source (`Learned`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs

MiB = 1 << 20
WORKSPACE = 512 * MiB  # FlashInfer's wrappers' float workspace (groundtruth/flashinfer.py WORKSPACE_BYTES)
SLACK = 64 * MiB  # the allocator's rounding and the libraries' small buffers
MARGIN = 1.25  # over the sum: block rounding, fragmentation
REFERENCE_CHUNK = 4 << 28  # a sampler's reference call: 2**28 float32 elements (verdict/samples CHUNK_ELEMENTS)
KERNEL_SAMPLER_ROWS = 4096  # the samplers' rows per kernel call (groundtruth ROWS_PER_CALL)
LEARN_RATIO_FROM = 1 << 30  # a miss of a plan this large teaches a ratio; of a smaller one, a fixed sum
GENERATION_GUESS = 256 * MiB  # the var-sized inputs of a small or medium case, before any was made
COMPARE_CHUNK = 1 << 26  # verdict/compare.py CHUNK: elements widened to float64 at once
COMPARE_BUFFERS = 6  # float64 buffers of a slice: actual, expected, err, allowed, ratio, the scale
ARENA_MIN = 256 * MiB  # sandbox/pool.py MIN_CUDA_ARENA: the first reference call of a process allocates this much


@dataclass(frozen=True)
class Sizes:
    """The bytes of one case group's tensors."""

    inputs: int  # every input tensor
    floats: int  # elements of the floating inputs the reference and the torch truth widen (not the sparse ones)
    outputs: int  # the outputs' bytes (the declared dtypes; unknown dimensions counted as 1)
    output_elements: int
    vocab_rows: tuple[int, int] | None = None  # a sampler's (rows, vocab)

    @classmethod
    def of(cls, definition: Definition, inputs: Inputs) -> Sizes:
        from ..dtypes import torch_dtype
        from ..reference import expected_shapes

        tensors = {k: v for k, v in inputs.values.items() if isinstance(v, torch.Tensor)}
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        # a sparse input (a cache past 2**31 elements, read at a few rows) is copied whole but widened only where read
        floats = sum(t.numel() for k, t in tensors.items() if t.is_floating_point() and k not in inputs.sparse)
        out_bytes = out_elements = 0
        for spec, shape in zip(definition.outputs.values(), expected_shapes(definition, inputs), strict=True):
            if shape is None or spec.dtype is None:
                continue
            n = math.prod(d or 1 for d in shape)
            out_elements += n
            out_bytes += n * torch.empty(0, dtype=torch_dtype(spec.dtype)).element_size()
        rows = None
        if definition.is_sampler:
            from ..inputs.sampling import distribution_input

            dist = inputs.values.get(distribution_input(definition))
            if isinstance(dist, torch.Tensor) and dist.dim() == 2:
                rows = (int(dist.shape[0]), int(dist.shape[1]))
        return cls(nbytes, floats, out_bytes, out_elements, rows)


def source_class(source: str | None, kind: str | None, path: str | None) -> str:
    """How a ground truth spends memory: torch's float64, a sampler, a kernel (plain or planned), none."""
    if source is None:
        return "structure"
    if kind == "sampler":
        return "sampler"
    if source == "torch":
        return "torch"
    return "kernel-planned" if path and any(m in path for m in ("graph", "plan-reuse")) else "kernel"


def case_bytes(sizes: Sizes, klass: str, *, repeats: int = 1, reference: bool = True) -> dict[str, int]:
    """The parts of one case's peak (bytes): standing data, then each phase; `total` is the plan. `reference`:
    whether the case runs the reference; a later case of its group does not (the outputs are kept), and then
    only the reference worker's arena, kept for the group, stands beside the group's tensors."""
    i, o = sizes.inputs, sizes.outputs
    arena = max(i + o, ARENA_MIN)  # the reference worker's CUDA arena is never smaller (sandbox/pool.py)
    parts = {"standing": i + o if reference else i + o + arena}
    phases = {"reference": i + arena + 2 * (4 * sizes.floats + 4 * sizes.output_elements)} if reference else {}
    if klass in ("kernel", "kernel-planned"):
        kept = o * (2 if repeats > 1 else 1)
        phases["kernel"] = i + o + kept + WORKSPACE + (2 * i if klass == "kernel-planned" else 0)
    elif klass == "torch":
        phases["torch"] = i + 2 * 8 * sizes.floats + 2 * 8 * sizes.output_elements
    elif klass == "sampler" and sizes.vocab_rows is not None:
        rows, vocab = sizes.vocab_rows
        chunk = min(REFERENCE_CHUNK, 4 * vocab * max(1, REFERENCE_CHUNK // max(4 * vocab, 1)))
        phases["reference"] = max(phases["reference"], 2 * chunk + 4 * chunk)  # rows, arena copy, the sort's
        phases["kernel"] = 3 * 4 * KERNEL_SAMPLER_ROWS * vocab + WORKSPACE
    if klass != "structure":
        phases["compare"] = COMPARE_BUFFERS * 8 * min(sizes.output_elements, COMPARE_CHUNK)
    parts.update(phases)
    parts["total"] = int(MARGIN * (parts["standing"] + max(phases.values(), default=0))) + SLACK
    return parts


def generation_bytes(definition: Definition, learned: int | None = None) -> int:
    """What generating a group's inputs may take before anything of it is known: the inputs this process
    made last for the same definition, size and edge case, else its fixed-size inputs and a small case's
    var-sized ones (a generator that makes a large tensor asks for it first: Builder.require_bytes)."""
    from ..inputs.common import fixed_bytes

    if learned is not None:
        return int(MARGIN * learned) + SLACK
    return int(MARGIN * 2 * fixed_bytes(definition)) + GENERATION_GUESS


@dataclass
class Learned:
    """What measurement taught the planner in this process, per (op type, source class): how much larger than its
    plan a case of a gigabyte or more came out (a ratio: what grows with the data), and how many bytes more a
    smaller one did (a fixed sum: a library's handle, the worker's first arena; as a ratio of a 70 MB plan it
    would have multiplied a 30 GB case's plan five-fold); and per case group the bytes its inputs took. A ratio
    holds for plans of the same order of magnitude (a factor of four): a fixed cost that a 1.5 GiB plan missed is
    no reason to plan a 17 GiB case at 60."""

    ratios: dict[tuple[str, str, int], float] = field(default_factory=dict)
    extra: dict[tuple[str, str], int] = field(default_factory=dict)
    inputs: dict[tuple, int] = field(default_factory=dict)

    @staticmethod
    def magnitude(base: int) -> int:
        return max(0, int(base).bit_length() - 1) // 2  # plans within a factor of four share a ratio

    def plan(self, op_type: str, klass: str, base: int) -> int:
        ratio = self.ratios.get((op_type, klass, self.magnitude(base)), 1.0)
        return int(base * ratio) + self.extra.get((op_type, klass), 0)

    def learn(self, op_type: str, klass: str, base: int, planned: int, measured: int) -> bool:
        """Record a measurement of a case planned at `planned` (`base` before what was learned); True where it passed
        its plan (the planner's miss): later plans of its kind are raised to cover it, with a margin."""
        if base <= 0 or measured <= planned:
            return False
        key = (op_type, klass)
        if base >= LEARN_RATIO_FROM:
            at = (op_type, klass, self.magnitude(base))
            self.ratios[at] = max(self.ratios.get(at, 1.0), MARGIN * (measured - self.extra.get(key, 0)) / base)
        else:
            self.extra[key] = max(self.extra.get(key, 0), int(MARGIN * (measured - planned)) + self.extra.get(key, 0))
        return True
