"""Reference tests of op type `single_prefill`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/single_prefill/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_single_prefill = reference_test("single_prefill")
