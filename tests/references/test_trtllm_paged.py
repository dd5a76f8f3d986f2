"""Reference tests of op type `trtllm_paged`: every case the engine (flashinfer_trace.check) plans for the definitions
in definitions/trtllm_paged/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_trtllm_paged = reference_test("trtllm_paged")
