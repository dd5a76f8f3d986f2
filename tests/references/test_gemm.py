"""Reference tests of op type `gemm`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/gemm/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_gemm = reference_test("gemm")
