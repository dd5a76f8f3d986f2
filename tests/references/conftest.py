"""The reference suite's options, fixtures and hooks: flashinfer_trace.pytest_plugin (its docstring
lists them), so they are versioned and unit-tested with the package."""

from flashinfer_trace.pytest_plugin import *  # noqa: F401,F403
