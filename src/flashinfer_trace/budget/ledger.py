"""One device's memory, handed out by one ledger that every process allocating there consults.

Processes on one GPU (a session's test processes, their reference workers' parents, the JIT prebuild's
warm-ups, a second session placed on the same GPU) used to size themselves each on its own guess; three of
them grew to 40 GiB apiece and the rest of an H200 session ran out of memory. Here a process takes a
*lease* of the bytes it plans to use before it allocates them and gives it back after; a lease that does
not fit waits until the memory is given back.

The ledger is a folder (one per device, named by its UUID), no server: every transaction holds an exclusive
`flock` on `lock`; each lease is a small JSON file whose owner keeps an exclusive `flock` on it for as long
as the lease lives, so a lease whose owner died (killed, crashed, its container gone) is found unlocked and
reclaimed by the next transaction. Nothing has to be started or stopped, and a process that never asks
cannot be hurt by a stale entry.

Kinds of lease:
    context   the fixed cost of a process that uses the device (CUDA context, libraries' handles): granted
              whenever it fits, never queued (a process must be able to start)
    case      what one case (or group of cases sharing inputs) plans to hold at its peak
    alone     a case run with the device to itself (a retry after running out of memory): granted once no
              other case lease is live; while one waits, no new case lease is granted

Waiters leave a ticket; a ticket older than `patience` seconds goes first (a large case is not starved by
a stream of small ones) -- if it can be granted at all once the other cases end: a case ticket larger than the
budget less every process's context (`room`) waits for processes to exit, not for cases to end, and holding the
queue for it would stall the device for its whole timeout (docs/evidence/device-memory.md). Such a case asks for
the device alone instead (budget/guard.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BudgetTimeout", "Lease", "Ledger"]

CONTEXT, CASE, ALONE = "context", "case", "alone"
KINDS = (CONTEXT, CASE, ALONE)


class BudgetTimeout(TimeoutError):
    """A lease could not be granted in time; the message says what was asked and what held the device."""


@dataclass
class Lease:
    """A grant of `nbytes` of the device, held until `release` (or the owner's death)."""

    ledger: Ledger
    path: Path
    nbytes: int
    kind: str
    label: str
    fd: int = field(repr=False, default=-1)

    @property
    def live(self) -> bool:
        return self.fd >= 0

    def resize(self, nbytes: int) -> bool:
        """Grow or shrink to `nbytes` now if the budget allows; never waits (a caller that holds memory and
        waits for more could deadlock with another doing the same: it gives back and asks again instead)."""
        return self.ledger.resize(self, nbytes)

    def shrink(self, nbytes: int) -> None:
        """Give back all but `nbytes` now, an alone lease becoming a case lease (the others may run beside it)."""
        self.ledger.shrink(self, nbytes)

    def release(self) -> None:
        self.ledger.release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass(frozen=True)
class Entry:
    """A live lease or a waiting ticket as another process sees it."""

    name: str
    nbytes: int
    kind: str
    label: str
    pid: int
    since: float
    waiting: bool


class Ledger:
    """The budget of one device: `capacity` bytes, in `root`."""

    def __init__(self, root: str | Path, capacity: int, *, poll: float = 0.05, patience: float = 20.0) -> None:
        if capacity <= 0:
            raise ValueError(f"a device budget needs a positive capacity, not {capacity}")
        self.root = Path(root)
        self.capacity = int(capacity)
        self.poll = poll
        self.patience = patience
        self.root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.root, 0o1777)  # processes of other users on the host share it, as they share the GPU

    # -- the public face ------------------------------------------------------------------------------------
    def acquire(self, nbytes: int, *, label: str = "", kind: str = CASE, timeout: float | None = None) -> Lease:
        """A lease of `nbytes`, waiting until it fits (or `timeout` seconds: BudgetTimeout). An alone lease
        waits for every other case lease to end, and its size is what it asked for or the device's whole
        budget less the contexts, whichever is larger."""
        if kind not in KINDS:
            raise ValueError(f"unknown lease kind {kind!r}; expected one of {', '.join(KINDS)}")
        nbytes = max(0, int(nbytes))
        if kind != ALONE and nbytes > self.capacity:
            raise BudgetTimeout(f"{label or 'a lease'}: {_gib(nbytes)} is more than the device's whole budget of "
                                f"{_gib(self.capacity)}")
        deadline = None if timeout is None else time.monotonic() + timeout
        ticket: tuple[Path, int] | None = None
        delay = self.poll
        try:
            while True:
                with self._locked():
                    entries = self._entries()
                    me = None if ticket is None else ticket[0].name
                    if self._grantable(entries, nbytes, kind, me):
                        if kind == ALONE:
                            nbytes = max(nbytes, self.capacity - _used(entries, (CONTEXT,)))
                        lease = self._write(nbytes, kind, label)
                        return lease
                    if ticket is None and kind != CONTEXT:
                        ticket = self._ticket(nbytes, kind, label)
                if deadline is not None and time.monotonic() >= deadline:
                    raise BudgetTimeout(f"{label or 'a lease'}: {_gib(nbytes)} ({kind}) not granted within "
                                        f"{timeout:g} s; {self.describe()}")
                time.sleep(delay)
                delay = min(0.5, delay * 1.5)
        finally:
            if ticket is not None:
                self._drop(ticket[0], ticket[1])

    def resize(self, lease: Lease, nbytes: int) -> bool:
        if not lease.live:
            raise ValueError(f"lease {lease.label!r} was released")
        nbytes = max(0, int(nbytes))
        with self._locked():
            if nbytes > lease.nbytes:
                entries = [e for e in self._entries() if e.name != lease.path.name]
                if not self._grantable(entries, nbytes, CASE if lease.kind == ALONE else lease.kind, None,
                                       resizing=lease.kind == ALONE):
                    return False
            _rewrite(lease.fd, self._body(nbytes, lease.kind, lease.label))
            lease.nbytes = nbytes
        return True

    def shrink(self, lease: Lease, nbytes: int) -> None:
        if not lease.live:
            raise ValueError(f"lease {lease.label!r} was released")
        nbytes = max(0, min(int(nbytes), lease.nbytes))
        kind = CASE if lease.kind == ALONE else lease.kind
        with self._locked():
            _rewrite(lease.fd, self._body(nbytes, kind, lease.label))
            lease.nbytes, lease.kind = nbytes, kind

    def release(self, lease: Lease) -> None:
        if not lease.live:
            return
        with self._locked():
            self._drop(lease.path, lease.fd)
        lease.fd = -1

    def entries(self) -> list[Entry]:
        """The live leases and waiting tickets (stale ones reclaimed)."""
        with self._locked():
            return self._entries()

    def used(self) -> int:
        return _used(self.entries())

    def room(self) -> int:
        """What the cases could have if every case lease ended: the budget less every process's context."""
        return self.capacity - _used(self.entries(), (CONTEXT,))

    def describe(self) -> str:
        entries = self.entries()
        live = [e for e in entries if not e.waiting]
        waiting = [e for e in entries if e.waiting]
        held = ", ".join(f"{e.label or e.name} {_gib(e.nbytes)} ({e.kind}, pid {e.pid})"
                         for e in sorted(live, key=lambda e: -e.nbytes)[:8])
        return (f"{_gib(_used(entries))} of {_gib(self.capacity)} held by {len(live)} lease(s)"
                + (f": {held}" if held else "") + (f"; {len(waiting)} waiting" if waiting else ""))

    # -- the rule ---------------------------------------------------------------------------------------------
    def _grantable(self, entries: list[Entry], nbytes: int, kind: str, me: str | None, *,
                   resizing: bool = False) -> bool:
        live = [e for e in entries if not e.waiting]
        free = self.capacity - _used(live)
        if kind == CONTEXT:
            return nbytes <= free
        if any(e.kind == ALONE for e in live) and not resizing:
            return False
        now = time.time()
        mine = next((e for e in entries if e.name == me), None)
        room = self.capacity - _used(live, (CONTEXT,))
        for e in entries:  # the tickets that go first: an alone one, or one that has waited its patience and fits
            if not e.waiting or e.name == me or (mine is not None and e.since >= mine.since):
                continue
            if e.kind == ALONE or (now - e.since > self.patience and e.nbytes <= room):
                return False
        if kind == ALONE:
            return not any(e.kind == CASE for e in live)
        return nbytes <= free

    # -- files ------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def _body(self, nbytes: int, kind: str, label: str, since: float | None = None) -> bytes:
        return json.dumps({"bytes": nbytes, "kind": kind, "label": label[:200], "pid": os.getpid(),
                           "since": time.time() if since is None else since}).encode()

    def _create(self, prefix: str, body: bytes) -> tuple[Path, int]:
        path = self.root / f"{prefix}-{os.getpid()}-{secrets.token_hex(6)}.json"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held while the lease (or ticket) lives: its owner's sign of life
        os.write(fd, body)
        return path, fd

    def _write(self, nbytes: int, kind: str, label: str) -> Lease:
        path, fd = self._create("lease", self._body(nbytes, kind, label))
        return Lease(self, path, nbytes, kind, label, fd)

    def _ticket(self, nbytes: int, kind: str, label: str) -> tuple[Path, int]:
        return self._create("wait", self._body(nbytes, kind, label))

    def _drop(self, path: Path, fd: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with contextlib.suppress(OSError):
            os.close(fd)

    def _entries(self) -> list[Entry]:
        """Every live lease and ticket; one whose owner holds no lock on it any more is removed."""
        out = []
        for path in self.root.glob("*.json"):
            waiting = path.name.startswith("wait-")
            if not (waiting or path.name.startswith("lease-")):
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # its owner holds it: alive
                    data = _read(fd)
                else:  # nobody holds it: its owner is gone
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    continue
            finally:
                os.close(fd)
            if not isinstance(data, dict) or data.get("kind") not in KINDS:
                continue
            out.append(Entry(path.name, int(data.get("bytes") or 0), data["kind"], str(data.get("label") or ""),
                             int(data.get("pid") or 0), float(data.get("since") or 0.0), waiting))
        return out


def _read(fd: int) -> dict | None:
    try:
        return json.loads(os.pread(fd, 1 << 16, 0) or b"null")
    except (OSError, ValueError):
        return None


def _rewrite(fd: int, body: bytes) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, body, 0)


def _used(entries: list[Entry], kinds: tuple[str, ...] = KINDS) -> int:
    return sum(e.nbytes for e in entries if not e.waiting and e.kind in kinds)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
