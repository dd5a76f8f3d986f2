"""This process's side of a GPU's memory budget: which ledger serves a device, the process's own standing
lease, how much the device may hand out, and what running out of memory looks like.

    budget = device_budget("cuda:0")    # None on a CPU: the CPU's memory is judged per case (inputs.common)
    with budget.lease(nbytes, label="gemm_n65536_k4096 medium") as lease: ...

Settings, read once per process (every process on a device must agree, so they come from the environment
the session hands down, not from each process's own guess):

    FLASHINFER_TRACE_BUDGET_DIR        where the ledgers live (default: <tmp>/flashinfer-trace-budget)
    FLASHINFER_TRACE_DEVICE_BUDGET_GB  the bytes the ledger hands out (default: the device's memory less a
                                       reserve for what no process accounts for: the driver, MPS, fragments)
    FLASHINFER_TRACE_CONTEXT_GB        a process's standing lease: its CUDA context and library handles, and
                                       its reference worker's (default 1.5)
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from .ledger import ALONE, CASE, CONTEXT, BudgetTimeout, Lease, Ledger

ENV_DIR = "FLASHINFER_TRACE_BUDGET_DIR"
ENV_CAPACITY = "FLASHINFER_TRACE_DEVICE_BUDGET_GB"
ENV_CONTEXT = "FLASHINFER_TRACE_CONTEXT_GB"
RESERVE_SHARE = 0.03  # of the device's memory, kept out of every ledger (4.2 GiB of an H200)
DEFAULT_CONTEXT_GB = 1.5
# a case waits at most this long for its memory, then it is not-run (out-of-memory): well inside a test's own time
# limit (900 s by default), whose expiry would record a timeout instead
WAIT_S = 600.0

# what CUDA, torch, cuBLAS and the kernels' own allocators say when the device has no memory left
_OOM = re.compile(r"out of memory|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation|"
                  r"CUDA_ERROR_OUT_OF_MEMORY|failed to allocate .*(?:device|cuda)|OutOfMemoryError", re.IGNORECASE)


# what CUDA says when the device refuses a new process or context (not the case's doing: no verdict); an MPS
# server recovering from another client's fatal fault refuses every new client until its clients have exited
_UNAVAILABLE = re.compile(r"busy or unavailable|cudaErrorDevicesUnavailable|CUDA_ERROR_DEVICE_UNAVAILABLE|"
                          r"no CUDA-capable device is detected|cudaErrorNoDevice|CUDA driver initialization failed|"
                          r"MPS server is not ready|cudaErrorMpsServerNotReady|CUDA_ERROR_MPS_SERVER_NOT_READY|"
                          r"MPS client (?:has been )?terminated|cudaErrorMpsClientTerminated|"
                          r"cudaErrorMpsConnectionFailed", re.IGNORECASE)


def is_device_unavailable(text: str) -> bool:
    """Whether a message says the device refused a process (a worker that could not start there)."""
    return bool(_UNAVAILABLE.search(text))


def is_out_of_memory(e: BaseException | str) -> bool:
    """Whether an exception (or a worker's message) says the device ran out of memory: a harness outcome,
    never a kernel's verdict."""
    if isinstance(e, BaseException):
        import sys

        torch = sys.modules.get("torch")
        if torch is not None and isinstance(e, getattr(torch, "OutOfMemoryError", ())):
            return True
        text = f"{type(e).__name__}: {e}"
    else:
        text = e
    return bool(_OOM.search(text))


@dataclass
class DeviceBudget:
    """One device's ledger as this process uses it."""

    device: str
    ledger: Ledger
    context_bytes: int
    total: int  # the device's memory, of which the ledger hands out `capacity`

    def __post_init__(self) -> None:
        self._context: Lease | None = None
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self.ledger.capacity

    def standing(self) -> None:
        """The process's own lease (its context, its worker's), taken once, before its first case."""
        with self._lock:
            if self._context is None:
                self._context = self.ledger.acquire(self.context_bytes, kind=CONTEXT,
                                                    label=f"process {os.getpid()} context", timeout=WAIT_S)

    def lease(self, nbytes: int, *, label: str, alone: bool = False, timeout: float | None = WAIT_S) -> Lease:
        self.standing()
        return self.ledger.acquire(nbytes, label=label, kind=ALONE if alone else CASE, timeout=timeout)

    def room(self) -> int:
        """The most a case can lease beside every process's context (Ledger.room)."""
        return self.ledger.room()

    def close(self) -> None:
        with self._lock:
            if self._context is not None:
                self._context.release()
                self._context = None


_budgets: dict[str, DeviceBudget] = {}
_guard = threading.Lock()


def budget_root() -> Path:
    return Path(os.environ.get(ENV_DIR) or Path(tempfile.gettempdir()) / "flashinfer-trace-budget")


def device_budget(device: str) -> DeviceBudget | None:
    """The budget of a CUDA device for this process (one per device, made at first use); None on a CPU."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    key = f"cuda:{index}"
    with _guard:
        if key not in _budgets:
            props = torch.cuda.get_device_properties(index)
            ident = _device_id(props, index)
            capacity = _capacity(props.total_memory)
            context = int(float(os.environ.get(ENV_CONTEXT) or DEFAULT_CONTEXT_GB) * 2**30)
            _budgets[key] = DeviceBudget(key, Ledger(budget_root() / ident, capacity), context, props.total_memory)
        return _budgets[key]


def _device_id(props, index: int) -> str:
    """The device's UUID (the same GPU under any CUDA_VISIBLE_DEVICES), else its PCI address, else its index."""
    uuid = getattr(props, "uuid", None)
    if uuid:
        return "gpu-" + re.sub(r"[^0-9A-Za-z-]", "", str(uuid))
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        return f"pci-{getattr(props, 'pci_domain_id', 0)}-{bus}-{getattr(props, 'pci_device_id', 0)}"
    return f"index-{index}"


def _capacity(total: int) -> int:
    given = os.environ.get(ENV_CAPACITY)
    if given:
        value = int(float(given) * 2**30)
        if value <= 0:
            raise ValueError(f"{ENV_CAPACITY}={given!r}: expected a positive number of GiB")
        return min(value, total)
    return int(total * (1 - RESERVE_SHARE))


__all__ = ["BudgetTimeout", "DeviceBudget", "Lease", "budget_root", "device_budget", "is_device_unavailable",
           "is_out_of_memory"]
