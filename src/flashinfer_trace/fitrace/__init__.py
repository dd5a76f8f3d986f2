"""FlashInfer's own trace format (`fi_trace`, FlashInfer >= 0.7): emitting and importing its definitions.

`emit` runs the installed FlashInfer's trace templates (standard library, torch and flashinfer only:
it runs inside the confined worker, or in a bare FlashInfer environment as a script);
`importer` is the `flashinfer-trace import-fi-trace` side that asks the worker for them and writes
the `definitions/` layout and its manifest.
"""
