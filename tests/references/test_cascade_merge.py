"""Reference tests of op type `cascade_merge`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/cascade_merge/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_cascade_merge = reference_test("cascade_merge")
