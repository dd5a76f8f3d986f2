"""Reference tests of op type `mamba_ssu`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/mamba_ssu/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_mamba_ssu = reference_test("mamba_ssu")
