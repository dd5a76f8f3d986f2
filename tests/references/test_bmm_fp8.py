"""Reference tests of op type `bmm_fp8`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/bmm_fp8/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_bmm_fp8 = reference_test("bmm_fp8")
