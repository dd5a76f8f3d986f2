"""Device time of the ground-truth kernels: what to launch (kernels), how to time it (timers: CUPTI,
CUDA graphs, events) and what the time means against the GPU's peaks (roofline)."""

from .kernels import PREPARERS, Prepared, prepare
from .timers import TIMERS, Timing, gpu_clocks, require_cuda, time_device

__all__ = ["PREPARERS", "TIMERS", "Prepared", "Timing", "gpu_clocks", "prepare", "require_cuda", "time_device"]
