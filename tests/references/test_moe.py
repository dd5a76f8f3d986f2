"""Reference tests of op type `moe`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/moe/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_moe = reference_test("moe")
