"""Reference tests of op type `gdn`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/gdn/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_gdn = reference_test("gdn")
