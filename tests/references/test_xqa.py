"""Reference tests of op type `xqa`: every case the engine (flashinfer_trace.check) plans for the definitions in
definitions/xqa/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_xqa = reference_test("xqa")
