"""Reference tests of FlashInfer's own definitions (fi_trace, >= 0.7): every case the engine plans for the
definitions under `--fi-trace-definitions DIR` (flashinfer-trace import-fi-trace --out DIR; every op type),
recorded as definition set fi_trace. Without the option: one skip."""

from flashinfer_trace.pytest_plugin import fi_trace_test

test_fi_trace = fi_trace_test()
