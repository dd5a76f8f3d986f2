"""`flashinfer-trace bisect`: which release between a good and a bad one first computes a definition wrong.

A pipeline of plain steps over one `BisectConfig`, as the other runs:

    list_versions(config)           -> [Version]      the package's releases (an index, or a wheelhouse folder)
    between(versions, config)       -> [Version]      strictly between good and bad, in order
    search(candidates, probe, cfg)  -> BisectReport   git-bisect over them; `probe(version)` -> Probe
    probe_release(version, config)  -> Probe          the bad combination with the package pinned to the
                                                      version, in a venv of its own: install, the JIT prebuild
                                                      of this definition only, `check` of its cases

A probe's verdict comes from the one status vocabulary: its kernel cases' worst `CellState`; good is every case
passing, bad a wrong result (fail, flaky-wrong), anything else (a skip, install-failed, build-failed, an error)
makes the release untestable, and the search steps past it as `git bisect skip` does, saying so. Each probe's
records stay under out/<definition>/<version>/, so nothing is lost and a rerun resumes.

This package needs no torch: the probes run in their own environments.
"""

from __future__ import annotations

from .search import (
    BAD_STATES,
    BisectConfig,
    BisectError,
    BisectReport,
    Probe,
    Verdict,
    between,
    changelog,
    classify,
    pinned,
    search,
)
from .versions import index_versions, list_versions, parse_pip_index, wheelhouse_versions

__all__ = ["BAD_STATES", "BisectConfig", "BisectError", "BisectReport", "Probe", "Verdict", "between", "changelog",
           "classify", "index_versions", "list_versions", "parse_pip_index", "pinned", "search",
           "wheelhouse_versions"]
