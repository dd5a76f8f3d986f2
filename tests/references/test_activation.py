"""Reference tests of op type `activation`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/activation/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_activation = reference_test("activation")
