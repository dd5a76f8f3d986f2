"""Reference tests of op type `topk`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/topk/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_topk = reference_test("topk")
