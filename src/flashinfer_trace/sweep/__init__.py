"""The sweep machinery: which combinations exist (combos), how one is installed (install), how its
session runs (session: JIT prebuild, then every test file in its own process: isolation, jit), and
what it leaves behind (results, manifest). The matrix reads what these write.
"""
