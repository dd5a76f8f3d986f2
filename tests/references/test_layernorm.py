"""Reference tests of op type `layernorm`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/layernorm/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_layernorm = reference_test("layernorm")
