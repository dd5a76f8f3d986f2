"""Reference tests of op type `sampling`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/sampling/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_sampling = reference_test("sampling")
