"""The prebuild beside the comparisons: `Background` runs `run(jobs, config)` in a thread (records streamed to the
report, a progress line each to stderr) while the caller starts the comparisons of the definitions whose jobs have
ended (report.PrebuildWatch waits for the rest), in the order `readiness` gives: those expected ready first."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TextIO

from .plan import JitConfig, Job, expected
from .report import BuildRecord, summarise

__all__ = ["Background", "readiness"]


def readiness(jobs: Iterable[Job], previous: Iterable[BuildRecord] = (),
              settled: Iterable[tuple[str, str]] = ()) -> dict[str, float]:
    """Each definition's expected seconds until its modules are ready: its longest job's expected build time (the
    order to start comparisons in; a definition with no job is ready at once, 0). `settled`: jobs that will not be
    built here (deferred), which nothing waits for."""
    jobs, settled = list(jobs), set(settled)
    guess = expected(jobs, previous)
    out: dict[str, float] = {}
    for j in jobs:
        out[j.definition] = max(out.get(j.definition, 0.0), 0.0 if j.key in settled else guess[j.key])
    return out


class Background:
    """The prebuild in a daemon thread. `join()` waits for its end and gives (records, summary), re-raising what the
    thread raised; `stop()` ends it early (the running jobs are killed as at a timeout, the report keeps what
    ended). `progress` gets one line per record (None: none; default the stderr of the moment it starts, not the
    one this module was imported under)."""

    def __init__(self, jobs: list[Job], config: JitConfig, *, progress: TextIO | None | str = "stderr",
                 on_record: Callable[[BuildRecord], None] | None = None):
        from . import run  # the package's: what callers (and tests) see as jit.run

        self.jobs, self.config, self.records = jobs, config, []
        self.t0 = time.monotonic()
        self.ended_at: float | None = None  # seconds from start to the prebuild's end
        self._error: BaseException | None = None
        self._halt = threading.Event()
        self._progress, self._on_record = sys.stderr if progress == "stderr" else progress, on_record
        # called here, not in the thread: the report and its state exist when this returns
        self._builds = run(jobs, config, stop=self._halt)
        self.thread = threading.Thread(target=self._main, name="flashinfer-trace-prebuild", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        builds = self._builds
        try:
            for r in builds:
                self.records.append(r)
                if self._progress is not None:
                    mods = f" ({', '.join(r.modules)})" if r.modules else ""
                    print(f"prebuild [{len(self.records)}/{len(self.jobs)}] {r.status} {r.definition} {r.source} "
                          f"{r.seconds:.1f} s{mods}", file=self._progress, flush=True)
                if self._on_record is not None:
                    self._on_record(r)
        except BaseException as e:  # noqa: BLE001 - handed to join()
            self._error = e
        finally:
            close = getattr(builds, "close", None)  # a generator's: the pool's end, the state file marked finished
            if close is not None:
                close()
            self.ended_at = round(time.monotonic() - self.t0, 1)

    def stop(self) -> None:
        self._halt.set()  # the running jobs end now, as at a timeout; their records say so

    def join(self, timeout: float | None = None) -> tuple[list[BuildRecord], dict]:
        self.thread.join(timeout)
        if self._error is not None:
            raise self._error
        return self.records, summarise(self.records) | {"wall_seconds": self.ended_at}
