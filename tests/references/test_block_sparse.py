"""Reference tests of op type `block_sparse`: every case the engine (flashinfer_trace.check) plans for the
definitions in definitions/block_sparse/, asserted; conftest.py brings the options and fixtures."""

from flashinfer_trace.pytest_plugin import reference_test

test_block_sparse = reference_test("block_sparse")
