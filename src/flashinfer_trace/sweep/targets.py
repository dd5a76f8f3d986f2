"""Which test processes a reference session runs (sweep/session.py's targets): test files, a large file's shards,
small files grouped, and which definitions each target runs (what a GPU session's target waits for)."""

from __future__ import annotations

from pathlib import Path

from .isolation import Target

__all__ = ["group_small", "order_targets", "shard", "target_definitions", "target_files"]


def shard(files: list[str], jobs: int, definitions: Path, own: dict[str, tuple] | None = None) -> list[Target]:
    """Test files split into shards that run side by side: about 2 x jobs processes in all, each file's
    share in proportion to its definitions (test_<op>.py: definitions/<op>/), so a file with many
    definitions (GEMM's) is not the whole session's critical path. `own`: a file's pytest arguments of its
    own (test_fi_trace.py: --fi-trace-definitions DIR, whose definitions it counts, every op type)."""
    own = own or {}

    def target(f: str, *more: str) -> Target:
        args = (*own.get(f, ()), *more)
        return (f, args) if args else f

    if jobs <= 1:
        return [target(f) for f in files]

    def count(f: str) -> int:
        if f in own and len(own[f]) >= 2:
            return len(list(Path(own[f][1]).rglob("*.json")))
        return len(list((definitions / Path(f).stem.removeprefix("test_")).glob("*.json")))

    counts = {f: max(1, count(f)) for f in files}
    total = sum(counts.values())
    out: list[Target] = []
    for f in sorted(files, key=lambda f: -counts[f]):  # the big files first: their shards start early
        n = max(1, min(counts[f], round(2 * jobs * counts[f] / total)))
        out += [target(f)] if n == 1 else [target(f, "--shard", f"{i}/{n}") for i in range(n)]
    return out


def group_small(targets: list[Target], jobs: int, definitions: Path) -> list[Target]:
    """Small test files together in one process: (first file, (the others)). Every test process starts torch, pytest
    and a reference worker's fork server (~4 s of a CPU), which ~25 of the ~35 files' own cases do not take much
    longer than. Files of fewer definitions than a group's share (1/(4 x jobs) of them all) are packed into groups
    of at most that share, the largest first; a larger file, a shard, or a file with arguments of its own stays
    alone. The supervisor still isolates every test (a crash fails it, the rest of the group runs anew)."""
    def weight(t: Target) -> int:
        names = target_definitions(t, definitions)
        return max(1, len(names)) if names is not None else 0

    weights = {i: weight(t) for i, t in enumerate(targets)}
    share = max(1, sum(weights.values()) // max(1, 4 * jobs))
    small = sorted((i for i, t in enumerate(targets) if isinstance(t, str) and 0 < weights[i] < share),
                   key=lambda i: (-weights[i], i))
    bins: list[list[int]] = []
    for i in small:  # first fit, the largest first
        room = next((b for b in bins if sum(weights[j] for j in b) + weights[i] <= share), None)
        if room is None:
            bins.append([i])
        else:
            room.append(i)
    grouped = {b[0]: b for b in bins if len(b) > 1}
    inside = {j for b in grouped.values() for j in b}
    out: list[tuple[int, int, Target]] = []
    for i, t in enumerate(targets):
        if i in grouped:
            members = [targets[j] for j in grouped[i]]
            out.append((sum(weights[j] for j in grouped[i]), i, (members[0], tuple(members[1:]))))
        elif i not in inside:
            out.append((weights[i], i, t))
    # the heaviest first, as shard() orders them: their processes start early
    return [t for _, _, t in sorted(out, key=lambda x: (-x[0], x[1]))]


def target_files(target: Target) -> list[str]:
    """The test files (or node ids) a target runs: its path, and a group's other files among its arguments."""
    path, own = (target, ()) if isinstance(target, str) else target
    return [path, *(a for a in own if a.endswith(".py") or ".py::" in a)]


def target_definitions(target: Target, definitions: Path) -> list[str] | None:
    """The definitions a test target runs (test_<op>.py: definitions/<op>/; a `--shard I/N` of it: every N-th of
    their sorted names from the I-th, the plugin's rule); None when not known (the target then waits for the whole
    prebuild). A -k filter can move definitions between shards: their cases then wait inside the test process."""
    path, own = (target, ()) if isinstance(target, str) else target
    if len(files := target_files(target)) > 1:  # a group of small files (group_small): each file's definitions
        found = [target_definitions(f, definitions) for f in files]
        return None if any(n is None for n in found) else [d for n in found for d in n]
    folder = definitions / Path(path.split("::")[0]).stem.removeprefix("test_")
    if not folder.is_dir():
        return None
    names = sorted(f.stem for f in folder.glob("*.json"))
    if "--shard" in own:
        index, _, count = own[own.index("--shard") + 1].partition("/")
        i, n = int(index), int(count)
        names = [d for k, d in enumerate(names) if k % n == i]
    return names


def order_targets(targets: list[Target], ready: dict[str, float], definitions: Path) -> list[Target]:
    """The targets whose definitions' modules are expected ready first (their slowest job's expected seconds);
    otherwise in the given order (the big files' shards first)."""
    def key(item: tuple[int, Target]) -> tuple[float, int]:
        names = target_definitions(item[1], definitions)
        worst = max(ready.values(), default=0.0) if names is None else max((ready.get(d, 0.0) for d in names),
                                                                             default=0.0)
        return worst, item[0]

    return [t for _, t in sorted(enumerate(targets), key=key)]
