"""Reference tests of op type `mhc_post`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/mhc_post/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_mhc_post = reference_test("mhc_post")
