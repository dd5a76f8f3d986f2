"""Reference tests of op type `gqa_ragged`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/gqa_ragged/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_gqa_ragged = reference_test("gqa_ragged")
