"""The reference worker's settings: time and memory limits, confinement switches, read from the environment (so
the processes a run starts inherit them) and changed by pool.configure; and the pool's sizes."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

ENV_TIMEOUT = "FLASHINFER_TRACE_REFERENCE_TIMEOUT"
ENV_MEMORY = "FLASHINFER_TRACE_REFERENCE_MEMORY_GB"
ENV_ALLOW = "FLASHINFER_TRACE_ALLOW_UNCONFINED"
ENV_DISABLE = "FLASHINFER_TRACE_SANDBOX_DISABLE"  # comma-separated mechanisms to leave off (to see the refusal)
MAX_MESSAGE = 64 << 20
POLL_S = 0.05
MIN_CUDA_ARENA = 256 << 20
MIN_HOST_ARENA = 64 << 20  # address space only: a memfd's pages exist once written
# torch's warning on import where numpy is missing: the fork server shares the caller's stderr, and nothing
# in it uses numpy, so it filters this one warning before it imports torch
NUMPY_MISSING = re.escape("Failed to initialize NumPy: No module named 'numpy'")


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 << 30


@dataclass
class Settings:
    timeout: float = 900.0  # seconds per call (and per compile: the module body runs too)
    memory_bytes: int | None = None  # None: 80% of physical memory
    cpu_seconds: float | None = None  # per call; None: timeout x CPU count (a backstop behind timeout)
    allow_unconfined: bool = False  # run references where a confinement mechanism is missing
    disable: tuple[str, ...] = ()  # mechanisms to leave off on purpose (recorded as missing)
    start_timeout: float = 180.0

    @classmethod
    def from_env(cls) -> Settings:
        s = cls()
        if os.environ.get(ENV_TIMEOUT):
            s.timeout = float(os.environ[ENV_TIMEOUT])
        if os.environ.get(ENV_MEMORY):
            s.memory_bytes = int(float(os.environ[ENV_MEMORY]) * 2**30)
        s.allow_unconfined = os.environ.get(ENV_ALLOW, "") not in ("", "0", "false", "no")
        s.disable = tuple(m for m in os.environ.get(ENV_DISABLE, "").split(",") if m)
        return s

    @property
    def memory(self) -> int:
        return self.memory_bytes or int(0.8 * _total_memory())

    @property
    def cpu(self) -> float:
        return self.cpu_seconds or self.timeout * (os.cpu_count() or 1)


settings = Settings.from_env()
