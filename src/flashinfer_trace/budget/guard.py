"""The engine's cases on a GPU, each within the memory its plan took from the device's budget.

`CaseMemory` is the memory side of one test process's `check.Memo`: the lease of the case group it holds
(grown as the group's cases need more; given back when the group changes), the planner's learning, and the
measurement of each case's peak. `guarded` runs one case under it:

    a new group          the last group's tensors are dropped, the allocator's cache emptied, its lease given back
    before generating    a lease for what generating may take (learned from an earlier seed where there was one)
    a large tensor       the generator asks first (Builder.require_bytes -> reserve): the lease grows to room for
                         every large tensor asked for so far in this generation and their copies, or the group
                         starts again once the memory is there (NeedMemory; nothing is held while waiting)
    larger than the room a need larger than the budget less every process's context cannot be met beside the
                         other processes: the case takes the device alone (it waits for the other cases to end)
    after generating     the case's plan (plan.py) from the real sizes; the lease grows to it the same way
    out of memory        never a verdict: every tensor of the group dropped, the worker and its arena closed, and
                         the case run again *alone* (the device's budget to itself); out of memory alone is the
                         harness's failure (not-run: out-of-memory), a plan larger than the device is too-large
    after the case       its measured peak (this process's allocator and its worker's) beside its plan, in the
                         record; a peak past its plan raises the later plans of its kind (plan.Learned); the
                         allocator's cache emptied and the lease shrunk to the group's tensors (settle), an alone
                         lease becoming a case lease; the group's later cases plan no reference phase
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..status import Kind, Status
from .device import WAIT_S, DeviceBudget, is_device_unavailable, is_out_of_memory
from .ledger import BudgetTimeout, Lease
from .plan import MARGIN, SLACK, Learned, Sizes, case_bytes, generation_bytes, source_class

SETTLE_FROM = 1 << 30  # a lease this much larger than its group's tensors shrinks after a case

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs
    from ..results.record import CaseRecord


class NeedMemory(Exception):
    """The group needs `nbytes` and the lease could not grow now: drop everything, wait for it, start again."""

    def __init__(self, nbytes: int, why: str):
        super().__init__(f"{why}: {nbytes / 2**30:.2f} GiB")
        self.nbytes = nbytes


class Meter:
    """A process's allocator on the device: `start()` resets its peak and says what it holds now, `peak()` the
    most it held since (bytes)."""

    def start(self) -> int:
        raise NotImplementedError

    def peak(self) -> int:
        raise NotImplementedError

    def give_back(self) -> None:
        """Return what the allocator caches but no tensor uses to the device."""


class CudaMeter(Meter):
    def __init__(self, device: str) -> None:
        self.device = torch.device(device)

    def start(self) -> int:
        torch.cuda.reset_peak_memory_stats(self.device)
        return int(torch.cuda.memory_reserved(self.device))

    def peak(self) -> int:
        return int(torch.cuda.max_memory_reserved(self.device))

    def give_back(self) -> None:
        torch.cuda.empty_cache()


class CaseMemory:
    def __init__(self, budget: DeviceBudget, *, wait: float | None = WAIT_S, meter: Meter | None = None) -> None:
        self.budget = budget
        self.wait = wait
        self.meter = meter or CudaMeter(budget.device)
        self.lease: Lease | None = None
        self.learned = Learned()
        self.sizes: Sizes | None = None
        self.planned = 0  # the current case's plan (bytes), 0 before its group's inputs exist
        self.base = 0  # the same before the learned scale
        self.klass = "structure"
        self.worker_peak: Callable[[], int] = lambda: 0  # the reference worker's peak since the last ask
        self.arena_bytes: Callable[[], int] = lambda: 0  # the reference worker's CUDA arena, kept for the group
        self.waited = 0.0  # seconds spent waiting for leases since the last case began (a phase of its record)
        self.generation_floor = 0  # what generating the group may take besides its large tensors
        self.reserved = 0  # the large tensors the generator asked room for in this generation (bytes)

    @property
    def device(self) -> str:
        return self.budget.device

    # -- the lease --------------------------------------------------------------------------------------------
    def ensure(self, nbytes: int, label: str) -> None:
        """Hold at least `nbytes`: take a lease (waiting: nothing of the group is held yet) or grow the one held
        (not waiting: NeedMemory)."""
        if nbytes > self.budget.capacity:
            from ..inputs.common import CaseTooLarge

            raise CaseTooLarge(f"its plan is {nbytes / 2**30:.1f} GiB of device memory, more than the "
                               f"{self.budget.capacity / 2**30:.1f} GiB this device's budget hands out "
                               f"({self.budget.total / 2**30:.1f} GiB in all)")
        if self.lease is None:
            self.acquire(nbytes, label, alone=nbytes > self.budget.room())
        elif nbytes > self.lease.nbytes and not self.lease.resize(nbytes):
            raise NeedMemory(nbytes, f"{label}: the device's budget cannot grow this lease now")

    def acquire(self, nbytes: int, label: str, *, alone: bool = False) -> None:
        self.release()
        t0 = time.perf_counter()
        try:
            self.lease = self.budget.lease(nbytes, label=label, alone=alone, timeout=self.wait)
        finally:
            self.waited += time.perf_counter() - t0

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    @property
    def alone(self) -> bool:
        return self.lease is not None and self.lease.kind == "alone"

    # -- the plan ---------------------------------------------------------------------------------------------
    def before_generation(self, definition: Definition, key: tuple, label: str) -> None:
        self.sizes, self.planned, self.reserved = None, 0, 0
        held = 0 if self.lease is None else self.lease.nbytes
        self.generation_floor = generation_bytes(definition, self.learned.inputs.get(key))
        self.ensure(max(held, self.generation_floor), label)

    def reserver(self, label: str) -> Callable[[int, str], None]:
        """The generator's ask before a large tensor: room for it and every large one before it in this generation,
        each with its copies for the reference and its arena. Counted from what was asked, not from the lease: a
        group started again after NeedMemory holds a lease that already has room for them, and a sum on top of the
        lease would grow by four times the tensors at every start."""
        def reserve(nbytes: int, what: str) -> None:
            self.reserved += nbytes
            self.ensure(self.generation_floor + 4 * self.reserved, f"{label} ({what})")

        return reserve

    def after_generation(self, definition: Definition, key: tuple, inputs: Inputs) -> None:
        self.sizes = Sizes.of(definition, inputs)
        self.learned.inputs[key] = self.sizes.inputs

    def plan_case(self, definition: Definition, source: str | None, path: str | None, repeats: int,
                  label: str, *, reference: bool = True) -> None:
        """The case's plan from its group's sizes (`reference`: whether it runs the reference); the lease grows
        to it."""
        if self.sizes is None:
            return
        self.klass = source_class(source, "sampler" if definition.is_sampler else None, path)
        self.base = case_bytes(self.sizes, self.klass, repeats=repeats, reference=reference)["total"]
        self.planned = self.learned.plan(definition.op_type, self.klass, self.base)
        self.ensure(max(self.planned, self.lease.nbytes if self.lease is not None else 0), label)

    def settle(self, held: int) -> bool:
        """After a case: what its phases cached goes back to the device, and the lease shrinks to the group's
        tensors (`held`, with the worker's arena), an alone lease becoming a case lease: a large group's first
        case may need the device alone, its later ones (no reference, no generation) run beside the others.
        Worth an empty cache only where it gives back a GiB or more."""
        if self.lease is None:
            return False
        keep = int(MARGIN * (held + self.arena_bytes())) + SLACK
        if self.lease.nbytes - keep < SETTLE_FROM:
            return False
        self.meter.give_back()
        self.lease.shrink(keep)
        return True

    # -- the measurement ----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def measured(self, out: dict[str, Any], held: Callable[[], int]) -> Any:
        """`out` gets the case's peak as the plan counts it: what this process's allocator grew by during the case
        (its peak, reset at the start, less what it had reserved then), the group's tensors held from before
        (`held()`: its inputs and the reference's outputs), and its reference worker's peak. Buffers a process
        keeps for good (a kernel library's workspace) are its standing lease's, not the case's."""
        start = self.meter.start()
        before = held()
        self.worker_peak()  # forget the last case's
        try:
            yield
        finally:
            with contextlib.suppress(RuntimeError):  # a context broken by the case: no figure, not a crash
                out["measured"] = max(0, self.meter.peak() - start) + before + int(self.worker_peak())

    def report(self, definition: Definition, measured: int | None) -> dict[str, Any] | None:
        """The record's `memory`: planned, measured and held bytes; `over_plan` where the planner missed."""
        if self.planned <= 0 and measured is None:
            return None
        memory: dict[str, Any] = {"planned": self.planned, "measured": measured,
                                  "lease": self.lease.nbytes if self.lease is not None else None,
                                  "ground_truth": self.klass}
        if measured is not None and self.learned.learn(definition.op_type, self.klass, self.base, self.planned,
                                                       measured):
            memory["over_plan"] = True
        if self.alone:
            memory["alone"] = True
        return memory


def guarded(case, guard: CaseMemory, run: Callable[[], CaseRecord], free: Callable[[], None],
            held: Callable[[], int]) -> CaseRecord:
    """One case, start to record, within the device's budget: `run` is the case's body, `free` drops every
    tensor the group holds (the memo's, the reference worker's arena) and gives the lease back, `held` the bytes
    of the group's tensors now. Waits for memory are a phase of the record (`memory_wait`)."""
    retried, restarted, measured = None, False, {}
    guard.waited = 0.0
    record = None
    for _ in range(8):  # regenerations as the group's need becomes known, a retry alone, regenerations within it
        try:
            with guard.measured(measured, held):
                record = run()
        except NeedMemory as need:
            free()
            try:
                guard.acquire(need.nbytes, f"{case.id} (again)",
                              alone=retried is not None or need.nbytes > guard.budget.room())
            except BudgetTimeout as e:
                record = case.record(Status.NOT_RUN, kind=Kind.OUT_OF_MEMORY, detail=f"out-of-memory: {e}")
                break
            continue
        except BudgetTimeout as e:  # the first lease of a group, taken inside the run
            free()
            record = case.record(Status.NOT_RUN, kind=Kind.OUT_OF_MEMORY, detail=f"out-of-memory: {e}")
            break
        if record.kind is Kind.WORKER_START and not restarted:  # never a verdict: once more, in a new worker
            restarted = True
            free()
            continue
        if record.kind is Kind.OUT_OF_MEMORY and retried is None:  # never a verdict: alone, once
            retried = record.detail
            planned = guard.planned
            free()
            try:
                guard.acquire(max(planned, 1), f"{case.id} (alone)", alone=True)
            except BudgetTimeout as e:
                record = case.record(Status.NOT_RUN, kind=Kind.OUT_OF_MEMORY, detail=f"out-of-memory: {e}")
                break
            continue
        break
    if record is None:  # the group's need kept growing past every lease it was given
        free()
        record = case.record(Status.NOT_RUN, kind=Kind.OUT_OF_MEMORY,
                             detail=f"out-of-memory: the case's memory could not be held after 8 tries (planned "
                                    f"{guard.planned / 2**30:.2f} GiB)")
    if record.kind is Kind.OUT_OF_MEMORY and retried is not None and record.status is Status.NOT_RUN:
        record.detail = (f"out-of-memory even with the device to itself (planned "
                         f"{guard.planned / 2**30:.2f} GiB of {guard.budget.capacity / 2**30:.1f} GiB): "
                         f"{(record.detail or '')[:600]}")
    record.memory = guard.report(case.definition, measured.get("measured"))
    if retried is not None and record.memory is not None:
        record.memory["retried_alone_after"] = (retried or "")[:300]
    if guard.waited >= 0.001:
        record.phases["memory_wait"] = round(guard.waited, 4)
    # what the case cached goes back and an alone lease to the others at once: shrunk to the group's tensors where
    # that gives back a GiB or more, else (or after running out of memory) with the group's tensors
    oom = record.status is Status.NOT_RUN and record.kind is Kind.OUT_OF_MEMORY
    if oom or (not guard.settle(held()) and guard.alone):
        free()
    return record


def classify(e: BaseException) -> tuple[Status, Kind, str] | None:
    """The device's refusals as the engine records them (never an error of the kernel's): running out of memory,
    and a reference worker that could not start because the device refused it."""
    text = " ".join(str(e).split())
    if is_out_of_memory(e):
        return Status.NOT_RUN, Kind.OUT_OF_MEMORY, f"out-of-memory: {type(e).__name__}: {text[:400]}"
    from ..sandbox import ReferenceFailure

    if isinstance(e, ReferenceFailure) and "the worker did not start" in text and is_device_unavailable(text):
        return Status.NOT_RUN, Kind.WORKER_START, f"worker-start: {text[-600:]}"
    return None
