"""What the cases of one group share: the inputs generated once for a definition at one size, seed and edge
case, the reference's outputs on them, and (on a GPU) the memory the group holds from the device's budget
(budget/guard.py). Every consumer gets its own copy of the inputs, so nothing one of them writes reaches
another; `written_inputs` says which inputs a reference changed that it may not."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from .inputs import Inputs, generate_inputs
from .inputs.common import CaseTooLarge, memory_budget, too_large
from .reference import run_reference
from .verdict.errormodel import error_scales

if TYPE_CHECKING:
    from .check import Case
    from .definition import Definition


class Phases:
    """Seconds per phase of one case (inputs, reference, ground_truth, compare), the GPU work each
    queued included: where a case's time goes."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


class Memo:
    """The inputs and reference outputs of the current (definition, size, seed, case): its checks and
    sources share one generation. Every consumer gets its own copy of the inputs, so nothing one of
    them writes reaches another."""

    def __init__(self, device: str, memory: int | None = None):
        from .budget import device_budget
        from .budget.guard import CaseMemory

        self.device = device
        budget = device_budget(device)
        # on a GPU every case's memory comes from the device's budget, shared by every process there (budget/)
        self.memory_guard = CaseMemory(budget) if budget is not None else None
        self.memory = budget.capacity if budget is not None else memory  # bytes a case may use (CaseTooLarge past it)
        self.key: tuple | None = None
        self.inputs: Inputs | None = None
        self.outputs: tuple | None = None
        self.mutated: list[str] = []  # inputs the reference wrote into that the definition does not let it
        self._scales: list | None = None
        self.sampler_draws: dict = {}  # a sampler reference's draws, shared by the case's ground truths
        self._planned: tuple | None = None  # (case, group) of the last memory plan

    def pristine(self, case: Case, phases: Phases) -> Inputs:
        key = self.group(case)
        if key != self.key:  # forgotten before generating: a failure must not leave another case's inputs
            new_definition = self.key is not None and (self.key[0], self.key[4]) != (key[0], key[4])
            self.key = self.inputs = self.outputs = self._scales = None
            if new_definition and torch.cuda.is_initialized():
                # what the last definition cached goes back to the GPU: the suite's test processes share it
                # (two MoE processes held 26 GiB each and the others ran out of memory)
                torch.cuda.empty_cache()
            self.mutated = []
            self.sampler_draws = {}
            self.fits(case.definition)
            guard = self.memory_guard
            if guard is not None:
                guard.before_generation(case.definition, key[:4], case.id)
            with phases("inputs"):
                self.inputs = generate_inputs(case.definition, case.size, case.seed, device=self.device,
                                              case=case.case, memory=self.memory, fresh=case.fresh,
                                              reserve=guard.reserver(case.id) if guard is not None else None)
            if guard is not None:
                guard.after_generation(case.definition, key[:4], self.inputs)
            self.key = key
        if self._planned != (case.id, key):  # once per case: its plan says whether *it* runs the reference
            self._planned = (case.id, key)
            self.plan(case)
        return self.inputs

    def plan(self, case: Case, *, reference: bool = False) -> None:
        """The case's memory plan (on a GPU): with the reference's phase where it runs the reference (the group's
        first to need its outputs, a determinism check, a sampler drawing from it, `reference`)."""
        if self.memory_guard is not None:
            runs = (reference or self.outputs is None or case.check == "deterministic"
                    or case.definition.is_sampler)
            self.memory_guard.plan_case(case.definition, case.source, case.path, 2, case.id,  # a GPU repeats kernels
                                        reference=runs)

    def group(self, case: Case) -> tuple:
        """The cases that share one set of inputs (and the reference's outputs on them): a fresh seed's counts are
        its own, so `fresh` is part of it."""
        return (case.definition.name, case.size, case.seed, case.case, case.definition_set, case.fresh)

    def free(self) -> None:
        """Drop every tensor of the current group (inputs, the reference's outputs, its draws), close the reference
        worker's large CUDA arena, empty the allocator's cache and give the group's lease back."""
        from .sandbox import pool

        self.key = self.inputs = self.outputs = self._scales = self._planned = None
        self.mutated, self.sampler_draws = [], {}
        pool.trim()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        if self.memory_guard is not None:
            self.memory_guard.release()

    def stray_bytes(self) -> int | None:
        """Device memory this process's tensors take beyond the group's and the reference worker's CUDA arena (a
        kernel library's workspaces among them); None off a GPU."""
        if self.memory_guard is None or not torch.cuda.is_initialized():
            return None
        from .sandbox import pool

        try:
            allocated = torch.cuda.memory_allocated(torch.device(self.device))
        except RuntimeError:  # a broken context says so elsewhere (pytest_plugin.release_cuda_cache)
            return None
        return max(0, allocated - self.held() - pool.cuda_arena_bytes())

    def held(self) -> int:
        """Bytes of the group's tensors this memo holds (its inputs and the reference's outputs)."""
        tensors = [*(self.inputs.values.values() if self.inputs is not None else ()), *(self.outputs or ())]
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))

    def fits(self, definition: Definition) -> None:
        """The plan judged the memory once, at the start; on a CPU what is available changes while a run goes on
        (other processes, the last case's pages): judged again before each new case's inputs (the last case's
        are gone by then), a case that no longer fits is `too-large` instead of a worker or a whole run killed
        for memory."""
        why = too_large(definition, self.memory or memory_budget(self.device))
        if why:
            raise CaseTooLarge(f"now: {why}", definition=definition.name)

    def copy(self, case: Case, phases: Phases) -> Inputs:
        inputs = self.pristine(case, phases)
        with phases("inputs"):
            return inputs.to(self.device, copy=True)

    def reference(self, case: Case, phases: Phases) -> tuple:
        pristine = self.pristine(case, phases)
        if self.outputs is None:
            inputs = self.copy(case, phases)
            with phases("reference"):
                self.outputs = run_reference(case.definition, inputs, seed=case.seed)
            self.mutated = written_inputs(case.definition, pristine, inputs)
        return self.outputs

    def scales(self, case: Case) -> list:
        """The error model's per-element scales of these inputs (verdict/errormodel.py), computed once."""
        if self._scales is None:
            self._scales = error_scales(case.definition, self.inputs)
        return self._scales


def written_inputs(definition: Definition, pristine: Inputs, used: Inputs) -> list[str]:
    """The inputs whose bytes differ after the reference ran on its copy, bar the ones the definition declares
    as in-place outputs: a reference may not change what it is given (a write would reach a caller that reuses
    its inputs). Compared as bytes, so a NaN input is equal to itself."""
    allowed = set(definition.in_place_outputs)
    return [name for name, before in pristine.values.items()
            if name not in allowed and isinstance(before, torch.Tensor) and not same_bytes(before, used.values[name])]


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bytes (a NaN is equal to the same NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    x, y = a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)
    if x.numel() % 8 == 0 and x.storage_offset() % 8 == 0 and y.storage_offset() % 8 == 0:
        # the same bytes, compared 8 at a time: ~3x faster on a CPU (every case compares each input once)
        x, y = x.view(torch.int64), y.view(torch.int64)
    return torch.equal(x, y)
