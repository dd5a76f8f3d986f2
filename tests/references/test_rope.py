"""Reference tests of op type `rope`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/rope/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_rope = reference_test("rope")
