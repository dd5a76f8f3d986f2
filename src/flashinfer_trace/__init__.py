"""Check flashinfer-trace kernel definitions against ground truth across versions and GPUs."""

__version__ = "0.1.0"
