"""Reference tests of op type `gqa_paged`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/gqa_paged/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_gqa_paged = reference_test("gqa_paged")
