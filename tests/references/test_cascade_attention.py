"""Reference tests of op type `cascade_attention`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/cascade_attention/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_cascade_attention = reference_test("cascade_attention")
