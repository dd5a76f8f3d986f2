"""Reference tests of op type `moe_routing`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/moe_routing/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_moe_routing = reference_test("moe_routing")
