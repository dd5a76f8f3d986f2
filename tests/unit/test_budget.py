"""The device's memory budget: the ledger every process consults (budget/ledger.py), a case's plan (plan.py)
and the engine's cases run within it (guard.py). The ledger needs no GPU; the engine's side is driven through a
stand-in device (a meter the test sets) on the CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from flashinfer_trace import check
from flashinfer_trace.budget.device import DeviceBudget, is_out_of_memory
from flashinfer_trace.budget.guard import CaseMemory, Meter
from flashinfer_trace.budget.ledger import BudgetTimeout, Ledger
from flashinfer_trace.budget.plan import Sizes, case_bytes, source_class
from flashinfer_trace.results.memory import memory_summary
from flashinfer_trace.status import Kind, Status

GiB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]


# -- the ledger -----------------------------------------------------------------------------------------------
def test_leases_add_up_and_go_back(tmp_path):
    ledger = Ledger(tmp_path, 10 * GiB)
    a = ledger.acquire(4 * GiB, label="a")
    b = ledger.acquire(5 * GiB, label="b")
    assert ledger.used() == 9 * GiB
    with pytest.raises(BudgetTimeout, match="not granted within"):
        ledger.acquire(2 * GiB, label="c", timeout=0.2)
    a.release()
    c = ledger.acquire(2 * GiB, label="c", timeout=1)
    assert ledger.used() == 7 * GiB
    b.release(), c.release()
    assert ledger.used() == 0 and not list(tmp_path.glob("*.json"))


def test_a_lease_larger_than_the_device_is_refused_at_once(tmp_path):
    ledger = Ledger(tmp_path, 10 * GiB)
    t0 = time.monotonic()
    with pytest.raises(BudgetTimeout, match="more than the device's whole budget"):
        ledger.acquire(11 * GiB, label="huge", timeout=30)
    assert time.monotonic() - t0 < 5


def test_a_waiting_lease_is_granted_when_memory_comes_back(tmp_path):
    ledger = Ledger(tmp_path, 10 * GiB)
    held = ledger.acquire(8 * GiB, label="held")
    got = []
    waiter = threading.Thread(target=lambda: got.append(ledger.acquire(4 * GiB, label="waiter", timeout=20)))
    waiter.start()
    time.sleep(0.3)
    assert not got and any(e.waiting for e in ledger.entries())  # it left a ticket
    held.release()
    waiter.join(10)
    assert got and got[0].nbytes == 4 * GiB and ledger.used() == 4 * GiB
    got[0].release()


def test_resizing_grows_only_where_it_fits_and_never_waits(tmp_path):
    ledger = Ledger(tmp_path, 10 * GiB)
    a, b = ledger.acquire(2 * GiB), ledger.acquire(6 * GiB)
    assert a.resize(4 * GiB) and ledger.used() == 10 * GiB
    t0 = time.monotonic()
    assert not a.resize(5 * GiB)  # 11 GiB: refused now, not waited for
    assert time.monotonic() - t0 < 1
    assert a.nbytes == 4 * GiB and a.resize(1 * GiB) and ledger.used() == 7 * GiB
    a.release(), b.release()


def test_the_lease_of_a_dead_process_is_reclaimed(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT / "src")!r})
        from flashinfer_trace.budget.ledger import Ledger
        lease = Ledger({str(tmp_path)!r}, {10 * GiB}).acquire({9 * GiB}, label="doomed")
        print("held", flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        ledger = Ledger(tmp_path, 10 * GiB)
        assert ledger.used() == 9 * GiB  # alive: its lock is held
        with pytest.raises(BudgetTimeout):
            ledger.acquire(2 * GiB, timeout=0.2)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        lease = ledger.acquire(2 * GiB, timeout=5)  # the dead one's 9 GiB came back without anyone releasing it
        assert ledger.used() == 2 * GiB
        lease.release()
    finally:
        p.kill()
        p.wait()


def test_an_alone_lease_waits_for_every_case_and_holds_off_new_ones(tmp_path):
    ledger = Ledger(tmp_path, 10 * GiB)
    context = ledger.acquire(1 * GiB, kind="context")
    case = ledger.acquire(1 * GiB, label="running case")
    got = []
    alone = threading.Thread(target=lambda: got.append(ledger.acquire(2 * GiB, kind="alone", timeout=20)))
    alone.start()
    time.sleep(0.3)
    assert not got  # a case lease is live
    with pytest.raises(BudgetTimeout):  # 1 GiB would fit, but an alone request is waiting: it goes first
        ledger.acquire(1 * GiB, label="newcomer", timeout=0.3)
    other_context = ledger.acquire(1 * GiB, kind="context", timeout=1)  # a process can still start
    case.release()
    alone.join(10)
    assert got and got[0].kind == "alone"
    assert got[0].nbytes == 10 * GiB - 2 * GiB  # the whole budget but the contexts
    with pytest.raises(BudgetTimeout):
        ledger.acquire(1, label="during alone", timeout=0.3)
    got[0].release()
    ledger.acquire(1 * GiB, label="after", timeout=1).release()
    context.release(), other_context.release()


def test_a_ticket_past_its_patience_goes_before_newer_small_leases(tmp_path):
    ledger = Ledger(tmp_path, 10 * GiB, patience=0.5)
    small = ledger.acquire(3 * GiB)
    got = []
    big = threading.Thread(target=lambda: got.append(ledger.acquire(9 * GiB, label="big", timeout=20)))
    big.start()
    ledger.acquire(1 * GiB, label="early", timeout=0.2).release()  # before its patience: small ones still pass
    time.sleep(0.8)
    with pytest.raises(BudgetTimeout):
        ledger.acquire(1 * GiB, label="late", timeout=0.3)  # it fits, but the big one has waited long enough
    small.release()
    big.join(10)
    assert got and got[0].nbytes == 9 * GiB
    got[0].release()


def test_a_patient_ticket_that_cannot_fit_beside_the_contexts_holds_nobody_up(tmp_path):
    """A case ticket larger than the budget less every process's context can only be granted once processes exit:
    past its patience it must not stop the cases that fit (on an H200, a 128 GiB ticket beside 30 GiB of contexts
    left the device idle for its 600 s timeout, again and again). One that fits once the cases end still does."""
    ledger = Ledger(tmp_path, 10 * GiB, patience=0.3)
    contexts = [ledger.acquire(2 * GiB, kind="context") for _ in range(2)]  # room for cases: 6 GiB
    assert ledger.room() == 6 * GiB
    got = []

    def huge_case():
        try:
            got.append(ledger.acquire(7 * GiB, label="huge", timeout=1.5))
        except BudgetTimeout:
            got.append("timed out")

    huge = threading.Thread(target=huge_case, daemon=True)
    huge.start()
    time.sleep(0.6)  # past its patience
    ledger.acquire(1 * GiB, label="small", timeout=0.3).release()  # not held up
    huge.join(5)
    assert got == ["timed out"]  # the huge one waits in vain (its caller takes the device alone instead: below)
    got.clear()
    fits = threading.Thread(target=lambda: got.append(ledger.acquire(6 * GiB, label="fits", timeout=10)))
    case = ledger.acquire(1 * GiB, label="running")
    fits.start()
    time.sleep(0.6)
    with pytest.raises(BudgetTimeout):  # a patient ticket that can be granted once the cases end goes first
        ledger.acquire(1 * GiB, label="late", timeout=0.3)
    case.release()
    fits.join(10)
    assert got and got[0].nbytes == 6 * GiB
    got[0].release()
    for c in contexts:
        c.release()


def test_a_need_larger_than_the_room_takes_the_device_alone(tmp_path):
    """CaseMemory asks for the device alone where the need cannot fit beside the other processes' contexts: it waits
    for the running cases to end, not for processes to exit."""
    budget = DeviceBudget("cuda:0", Ledger(tmp_path / "ledger", 10 * GiB), context_bytes=GiB, total=10 * GiB)
    guard = CaseMemory(budget, wait=5, meter=_Meter())
    others = [budget.ledger.acquire(2 * GiB, kind="context") for _ in range(2)]  # two other processes
    budget.standing()  # this process's own context: room 5 GiB
    guard.ensure(7 * GiB, "large")
    assert guard.alone and guard.lease.nbytes >= 7 * GiB
    guard.release()
    guard.ensure(4 * GiB, "fits")
    assert not guard.alone and guard.lease.nbytes == 4 * GiB
    guard.release()
    for c in others:
        c.release()


def test_room_asked_by_a_generator_does_not_grow_each_time_the_group_starts_again(tmp_path):
    """The generator asks room for each large tensor; a group started again (NeedMemory) already holds a lease with
    room for them, and asking again must not add them a second time (8 GiB of cache had grown to 128 GiB)."""
    budget = DeviceBudget("cuda:0", Ledger(tmp_path / "ledger", 100 * GiB), context_bytes=GiB // 4, total=100 * GiB)
    guard = CaseMemory(budget, wait=5, meter=_Meter())
    definition = _definition()
    sizes = []
    for _ in range(3):  # three starts of the same group, the lease kept between them as `guarded` keeps it
        guard.before_generation(definition, ("k",), "case")
        reserve = guard.reserver("case")
        reserve(2 * GiB, "k cache")
        reserve(2 * GiB, "v cache")
        sizes.append(guard.lease.nbytes)
    assert sizes[0] >= 16 * GiB and sizes[0] < 18 * GiB  # four times each tensor, and the generation's floor
    assert sizes == [sizes[0]] * 3
    guard.release()


def test_many_processes_never_hold_more_than_the_budget(tmp_path):
    """Eight processes take and give back leases of random sizes; each writes what it holds while it holds it,
    and at no moment does the sum of what is written pass the budget."""
    code = textwrap.dedent(f"""
        import os, random, sys, time, json
        sys.path.insert(0, {str(ROOT / "src")!r})
        from flashinfer_trace.budget.ledger import Ledger
        ledger = Ledger({str(tmp_path / "ledger")!r}, 100, poll=0.005)
        rng = random.Random(int(sys.argv[1]))
        log = {str(tmp_path / "log")!r}
        for _ in range(25):
            n = rng.randint(10, 70)
            lease = ledger.acquire(n, timeout=60)
            with open(log, "a") as f:
                f.write(json.dumps([time.monotonic(), n]) + "\\n")
            time.sleep(rng.random() * 0.01)
            with open(log, "a") as f:
                f.write(json.dumps([time.monotonic(), -n]) + "\\n")
            lease.release()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)]) for i in range(8)]
    assert all(p.wait(120) == 0 for p in procs)
    events = sorted(json.loads(line) for line in (tmp_path / "log").read_text().splitlines())
    level, top = 0, 0
    for _, delta in events:  # a release is logged before it happens, a grant after: a true sum never reads low
        level += delta
        top = max(top, level)
    assert len(events) == 8 * 25 * 2 and level == 0
    assert top <= 100


# -- out of memory --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["CUDA out of memory. Tried to allocate 2.00 GiB",
                                  "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate",
                                  "the worker did not start: torch.OutOfMemoryError: CUDA out of memory"])
def test_what_running_out_of_device_memory_looks_like(text):
    assert is_out_of_memory(RuntimeError(text))
    status, kind, detail = check.outcome_of(RuntimeError(text))
    assert (status, kind) == (Status.NOT_RUN, Kind.OUT_OF_MEMORY) and detail.startswith("out-of-memory")


@pytest.mark.parametrize("text", ["CUDA error: an illegal memory access was encountered",
                                  "resident memory 20.0 GiB passed the limit of 16.0 GiB; the worker was killed",
                                  "shape mismatch: out of range"])
def test_other_errors_stay_errors(text):
    assert not is_out_of_memory(RuntimeError(text))
    assert check.outcome_of(RuntimeError(text))[0] is Status.ERROR


def test_torch_out_of_memory_error_is_memory():
    assert is_out_of_memory(torch.OutOfMemoryError("no room"))


# -- the plan ---------------------------------------------------------------------------------------------------
def _sizes(inputs: int, outputs: int = 0) -> Sizes:
    return Sizes(inputs, inputs // 2, outputs, outputs // 2)


def test_a_plan_counts_each_copy_that_lives_at_once():
    s = _sizes(GiB, 256 << 20)
    kernel = case_bytes(s, "kernel", repeats=5)
    planned = case_bytes(s, "kernel-planned", repeats=5)
    torch_gt = case_bytes(s, "torch")
    assert kernel["standing"] == GiB + (256 << 20)
    assert planned["kernel"] == kernel["kernel"] + 2 * GiB  # a graph keeps a live copy of the inputs and the other data
    assert torch_gt["torch"] > torch_gt["reference"]  # float64 of every floating input
    assert kernel["total"] >= 1.25 * (kernel["standing"] + max(kernel["reference"], kernel["kernel"]))
    assert source_class("flashinfer", None, "tensor-cores+graph") == "kernel-planned"
    assert source_class("torch", None, None) == "torch" and source_class(None, None, None) == "structure"


def test_a_sparse_input_is_copied_but_not_widened():
    from flashinfer_trace.inputs.common import Inputs

    d = _definition()
    x = torch.zeros(1024, 4096, dtype=torch.bfloat16)
    dense = Inputs(d.name, "small", 0, None, {"input": x, "weight": torch.ones(4096, dtype=torch.bfloat16)},
                   {"batch_size": 1024, "hidden_size": 4096})
    sparse = Inputs(**{**dense.__dict__, "sparse": ("input",)})
    a, b = Sizes.of(d, dense), Sizes.of(d, sparse)
    assert a.inputs == b.inputs and b.floats == a.floats - x.numel()


# -- the engine under a budget (a stand-in device) ----------------------------------------------------------
class _Meter(Meter):
    """A device allocator the test drives: `grow` is what each case adds on top of what it starts with."""

    def __init__(self):
        self.now, self.grow = 0, 0

    def start(self) -> int:
        return self.now

    def peak(self) -> int:
        return self.now + self.grow


def _definition():
    from flashinfer_trace.dataset import Dataset

    return Dataset().load("rmsnorm_h4096")


def _memo(tmp_path, capacity=8 * GiB, meter=None) -> check.Memo:
    memo = check.Memo("cpu")
    budget = DeviceBudget("cuda:0", Ledger(tmp_path / "ledger", capacity), context_bytes=GiB // 4, total=capacity)
    memo.memory_guard = CaseMemory(budget, wait=5, meter=meter or _Meter())
    memo.memory = capacity
    return memo


def _case(source="torch", seed=0):
    return check.Case(_definition(), check.Check.MATCH, "small", seed, source=source)


def test_each_gpu_case_records_its_plan_and_its_measured_peak(tmp_path):
    meter = _Meter()
    memo = _memo(tmp_path, meter=meter)
    meter.grow = 1 << 20
    record = check.run_case(_case(), memo, check.CheckConfig(device="cpu"))
    assert record.status is Status.PASS
    m = record.memory
    assert m["ground_truth"] == "torch" and m["planned"] > 0 and m["lease"] >= m["planned"]
    assert m["measured"] >= 1 << 20 and not m.get("over_plan")
    ledger = memo.memory_guard.budget.ledger
    assert ledger.used() == m["lease"] + GiB // 4  # the group's lease and the process's standing one
    check.run_case(_case(seed=1), memo, check.CheckConfig(device="cpu"))  # another group: the last went back
    assert len([e for e in ledger.entries() if e.kind == "case"]) == 1


def test_a_case_over_its_plan_is_reported_and_raises_the_next_plans(tmp_path):
    meter = _Meter()
    memo = _memo(tmp_path, meter=meter)
    first = check.run_case(_case(), memo, check.CheckConfig(device="cpu"))
    meter.grow = 3 * first.memory["planned"]  # the planner missed
    second = check.run_case(_case(seed=1), memo, check.CheckConfig(device="cpu"))
    assert second.memory["over_plan"] and second.memory["measured"] > second.memory["planned"]
    third = check.run_case(_case(seed=2), memo, check.CheckConfig(device="cpu"))
    assert third.memory["planned"] > 3 * first.memory["planned"]  # learned within the run
    summary = memory_summary([first, second, third])
    assert summary["over_plan"] == 1 and summary["out_of_memory"] == 0
    assert summary["measured_max_bytes"] == max(r.memory["measured"] for r in (first, second, third))


def _flaky_memory(fails: int):
    """A ground truth that runs out of device memory `fails` times, then computes."""
    from flashinfer_trace.groundtruth import get_ground_truth

    calls = {"n": 0}

    def resolve(source, d, **kw):
        gt = get_ground_truth(source, d, **kw)

        class OutOfMemoryFirst:
            def __getattr__(self, name):
                return getattr(gt, name)

            def __call__(self, inputs, **more):
                calls["n"] += 1
                if calls["n"] <= fails:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
                return gt(inputs, **more)

        return OutOfMemoryFirst()

    return resolve, calls


def test_out_of_memory_is_retried_alone_and_never_a_verdict(tmp_path):
    memo = _memo(tmp_path)
    resolve, calls = _flaky_memory(1)
    record = check.run_case(_case(), memo, check.CheckConfig(device="cpu", resolve=resolve))
    assert record.status is Status.PASS and calls["n"] >= 2
    assert record.memory["alone"] and "out of memory" in record.memory["retried_alone_after"]
    assert not [e for e in memo.memory_guard.budget.ledger.entries() if e.kind == "alone"]  # given back at once


def test_out_of_memory_alone_is_the_harness_s_failure(tmp_path):
    memo = _memo(tmp_path)
    resolve, _ = _flaky_memory(10)
    record = check.run_case(_case(), memo, check.CheckConfig(device="cpu", resolve=resolve))
    assert (record.status, record.kind) == (Status.NOT_RUN, Kind.OUT_OF_MEMORY)
    assert "even with the device to itself" in record.detail
    summary = memory_summary([record])
    assert summary["out_of_memory"] == 1


def test_a_case_larger_than_the_device_is_too_large_with_its_plan(tmp_path):
    memo = _memo(tmp_path, capacity=1 << 20)  # a 1 MiB device: the rmsnorm case's plan does not fit
    record = check.run_case(_case(), memo, check.CheckConfig(device="cpu"))
    assert (record.status, record.kind) == (Status.SKIP, Kind.TOO_LARGE)
    assert "its plan is" in record.detail and "GiB in all" in record.detail


def test_a_case_waits_for_memory_another_process_holds(tmp_path):
    memo = _memo(tmp_path, capacity=2 * GiB)
    ledger = memo.memory_guard.budget.ledger
    hog = ledger.acquire(2 * GiB - GiB // 4, label="another process")  # all but this process's standing lease
    threading.Timer(0.5, hog.release).start()
    record = check.run_case(_case(), memo, check.CheckConfig(device="cpu"))
    assert record.status is Status.PASS and record.phases["memory_wait"] >= 0.4  # until the other gave it back


def test_a_small_case_s_miss_adds_bytes_and_a_large_one_s_scales():
    """A 70 MB plan missed by 300 MB (a fixed overhead) must not make every later plan of its kind five times larger:
    a 30 GiB case would then be planned past the device. A large plan's miss scales what grows with the data."""
    from flashinfer_trace.budget.plan import MARGIN, Learned

    learned = Learned()
    small, big = 70 << 20, 30 * GiB
    assert learned.learn("gqa_paged", "kernel", small, small, small + (300 << 20))
    assert learned.plan("gqa_paged", "kernel", big) == big + int(MARGIN * (300 << 20))  # added, not multiplied
    assert learned.plan("gqa_paged", "kernel", small) >= small + (300 << 20)  # and it covers the small one
    planned = learned.plan("gqa_paged", "kernel", big)
    assert learned.learn("gqa_paged", "kernel", big, planned, 2 * big)
    assert learned.plan("gqa_paged", "kernel", big) >= 2 * big  # a large miss scales
    assert learned.plan("gqa_paged", "torch", big) == big
    assert not learned.learn("gqa_paged", "kernel", big, 3 * big, big)


def test_a_ratio_learned_on_a_small_plan_does_not_scale_a_much_larger_one():
    """A 1.5 GiB plan that came out at 4.5 GiB (a fixed cost larger than the data) scales plans of its own order of
    magnitude, not a 17 GiB one (H200: such a ratio planned 60 and 91 GiB for cases measured at 12.5 GiB)."""
    from flashinfer_trace.budget.plan import Learned

    learned = Learned()
    small, big = 3 * GiB // 2, 17 * GiB
    assert learned.learn("mla_paged", "torch", small, small, 3 * small)
    assert learned.plan("mla_paged", "torch", small) >= 3 * small
    assert learned.plan("mla_paged", "torch", 2 * GiB) >= 3 * 2 * GiB  # within a factor of four
    assert learned.plan("mla_paged", "torch", big) == big


def test_a_worker_the_device_refused_is_retried_and_never_a_verdict(tmp_path):
    """CUDA's "device busy or unavailable" at a worker's start is the harness's (not-run: worker-start), tried once
    more; a worker that does not start for its own reasons stays an error of the reference."""
    from flashinfer_trace.sandbox import ReferenceFailure

    refused = ReferenceFailure("d", "crash", "the worker did not start: torch.AcceleratorError: CUDA error: "
                                             "CUDA-capable device(s) is/are busy or unavailable")
    assert check.outcome_of(refused)[:2] == (Status.NOT_RUN, Kind.WORKER_START)
    own = ReferenceFailure("d", "crash", "the worker did not start: SyntaxError: invalid syntax")
    assert check.outcome_of(own)[:2] == (Status.ERROR, Kind.REFERENCE)
    from flashinfer_trace.groundtruth import get_ground_truth

    calls = {"n": 0}

    def resolve(source, d, **kw):
        gt = get_ground_truth(source, d, **kw)

        class RefusedFirst:
            def __getattr__(self, name):
                return getattr(gt, name)

            def __call__(self, inputs, **more):
                calls["n"] += 1
                if calls["n"] == 1:
                    raise refused
                return gt(inputs, **more)

        return RefusedFirst()

    memo = _memo(tmp_path)
    record = check.run_case(_case(), memo, check.CheckConfig(device="cpu", resolve=resolve))
    assert record.status is Status.PASS and calls["n"] == 2
    calls["n"] = -10  # refused every time: the harness's failure, counted apart
    record = check.run_case(_case(seed=1), memo, check.CheckConfig(device="cpu", resolve=_always(refused)))
    assert (record.status, record.kind) == (Status.NOT_RUN, Kind.WORKER_START)
    summary = memory_summary([record])
    assert summary["harness"] == 1 and summary["out_of_memory"] == 0


def _always(error):
    from flashinfer_trace.groundtruth import get_ground_truth

    def resolve(source, d, **kw):
        gt = get_ground_truth(source, d, **kw)

        class Raises:
            def __getattr__(self, name):
                return getattr(gt, name)

            def __call__(self, inputs, **more):
                raise error

        return Raises()

    return resolve


def test_the_compare_phase_is_bounded_by_the_slice_not_the_output():
    """A KV cache of 2**31 elements is compared a slice at a time: its compare phase is the slice's float64
    buffers, not 24 bytes per element of the cache (the 130 GiB plan of page_append `large_page_index`)."""
    from flashinfer_trace.budget import plan as p
    from flashinfer_trace.verdict import compare

    assert p.COMPARE_CHUNK == compare.CHUNK
    huge = p.Sizes(inputs=2 * 2**31, floats=0, outputs=2 * 2**31, output_elements=2 * 2**31)
    small = p.Sizes(inputs=1 << 20, floats=1 << 18, outputs=1 << 20, output_elements=1 << 19)
    assert p.case_bytes(huge, "kernel")["compare"] == p.COMPARE_BUFFERS * 8 * compare.CHUNK
    assert p.case_bytes(small, "kernel")["compare"] == p.COMPARE_BUFFERS * 8 * (1 << 19)
    parts = p.case_bytes(huge, "kernel")
    assert parts["compare"] < parts["reference"]  # the comparison no longer sets the peak (it was 3 x 8 x 4.3e9)


# -- after a case: the lease shrinks to the group, the group's later cases plan no reference ----------------------
def test_a_case_that_does_not_run_the_reference_plans_its_arena_not_its_phase():
    sizes = Sizes(inputs=8 * GiB, floats=2 * GiB, outputs=8 * GiB, output_elements=2 * GiB)
    first = case_bytes(sizes, "kernel", repeats=2)
    later = case_bytes(sizes, "kernel", repeats=2, reference=False)
    assert "reference" in first and "reference" not in later
    assert later["standing"] == first["standing"] + 16 * GiB  # the worker's arena stays for the group
    assert later["total"] < first["total"]
    assert case_bytes(sizes, "structure", reference=False)["total"] > 0  # nothing but the standing data


def test_a_shrunk_alone_lease_is_a_case_lease_and_lets_the_others_in(tmp_path):
    ledger = Ledger(tmp_path, 10 * GiB)
    alone = ledger.acquire(9 * GiB, label="large", kind="alone")
    assert alone.nbytes == 10 * GiB
    with pytest.raises(BudgetTimeout):
        ledger.acquire(GiB, label="other", timeout=0.2)
    alone.shrink(3 * GiB)
    assert alone.kind == "case" and ledger.used() == 3 * GiB
    assert [e.kind for e in ledger.entries()] == ["case"]
    other = ledger.acquire(6 * GiB, label="other", timeout=2)
    alone.shrink(5 * GiB)  # never grows
    assert alone.nbytes == 3 * GiB
    other.release(), alone.release()


class _GivingMeter(_Meter):
    def __init__(self):
        super().__init__()
        self.given_back = 0

    def give_back(self) -> None:
        self.given_back += 1


def test_after_a_case_the_lease_shrinks_to_the_group_and_its_next_case_plans_no_reference(tmp_path):
    meter = _GivingMeter()
    memo = _memo(tmp_path, capacity=16 * GiB, meter=meter)
    guard = memo.memory_guard
    plans = []
    real = guard.plan_case

    def spy(*a, reference=True, **kw):
        plans.append(reference)
        return real(*a, reference=reference, **kw)

    guard.plan_case = spy
    guard.arena_bytes = lambda: 0
    guard.ensure(12 * GiB, "a large first phase")  # as if the group's first case had needed that much
    first = check.run_case(_case("torch"), memo, check.CheckConfig(device="cpu"))
    assert first.status is Status.PASS and plans == [True]  # the group's first case runs the reference
    assert meter.given_back == 1 and guard.lease.nbytes < GiB  # settled: what the group holds, not 12 GiB
    shape = check.Case(_definition(), check.Check.SHAPE, "small", 0)  # the same group, another case
    second = check.run_case(shape, memo, check.CheckConfig(device="cpu"))
    assert second.status is Status.PASS and plans[-1] is False  # the reference's outputs are kept: no reference phase
    assert second.memory["planned"] < first.memory["planned"]
    deterministic = check.Case(_definition(), check.Check.DETERMINISTIC, "small", 0)
    check.run_case(deterministic, memo, check.CheckConfig(device="cpu"))
    assert plans[-1] is True  # it runs the reference again
    memo.free()


def test_an_alone_case_leaves_a_case_lease_for_its_group(tmp_path):
    meter = _GivingMeter()
    budget = DeviceBudget("cuda:0", Ledger(tmp_path / "ledger", 10 * GiB), context_bytes=GiB, total=10 * GiB)
    guard = CaseMemory(budget, wait=5, meter=meter)
    budget.standing()
    guard.ensure(9.5 * GiB, "large")
    assert guard.alone
    assert guard.settle(2 * GiB) and not guard.alone and guard.lease.nbytes < 3 * GiB
    assert not guard.settle(2 * GiB)  # nothing more to give back: the cache is not emptied again
    assert meter.given_back == 1
    guard.release()
