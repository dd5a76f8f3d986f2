"""Reference tests of op type `rmsnorm`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/rmsnorm/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_rmsnorm = reference_test("rmsnorm")
