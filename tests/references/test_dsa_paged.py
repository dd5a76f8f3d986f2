"""Reference tests of op type `dsa_paged`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/dsa_paged/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_dsa_paged = reference_test("dsa_paged")
