"""Reference tests of op type `segment_gemm`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/segment_gemm/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_segment_gemm = reference_test("segment_gemm")
