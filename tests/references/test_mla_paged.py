"""Reference tests of op type `mla_paged`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/mla_paged/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_mla_paged = reference_test("mla_paged")
