"""Reference tests of op type `page_append`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/page_append/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_page_append = reference_test("page_append")
