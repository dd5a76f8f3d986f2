"""Reference tests of op type `gemm_bf16`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/gemm_bf16/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_gemm_bf16 = reference_test("gemm_bf16")
