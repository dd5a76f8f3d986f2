"""Reference tests of op type `dequantize_fp4`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/dequantize_fp4/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_dequantize_fp4 = reference_test("dequantize_fp4")
