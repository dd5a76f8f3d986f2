"""Reference tests of op type `pod`: every case the engine (flashinfer_trace.check) plans for the definitions in
definitions/pod/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_pod = reference_test("pod")
