"""A failing case, saved so it replays: inputs are a pure function of (definition, size, seed, case),
so the record names those and the command that reruns it; `inputs=True` also writes the tensors
as safetensors (when that package is installed) for use outside this project."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .results.stream import write_atomic

DEFAULT_DIR = Path("results") / "failures"


def replay_command(definition: str, size: str, seed: int, case: str | None, source: str, device: str,
                   fresh: bool = False) -> str:
    """`check` on exactly this case: its seed alone, as the run's fresh seed where it was one (whose counts are
    drawn from it too), else with no fresh seed beside it."""
    parts = ["flashinfer-trace", "check", definition, "--size", size, "--seed", str(seed),
             "--fresh-seed", str(seed) if fresh else "off", "--ground-truth", source, "--device", device]
    if case:
        parts += ["--case", case]
    return " ".join(parts)


def save_failure(record: dict[str, Any], directory: str | Path = DEFAULT_DIR, *, inputs: bool = False) -> Path:
    """Write `<directory>/<id>.json` (and `<id>.safetensors` with inputs=True); returns the JSON path.
    The id starts with the definition set where there is one (FlashInfer's fi_trace files may share our names)."""
    directory = Path(directory)
    fields = ("definition_set", "definition", "check", "source", "size", "seed", "case")
    key = "-".join(str(record.get(k)) for k in fields if record.get(k) is not None)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", key)[:200]
    target = record.get("definition_path") or record["definition"]
    # a reference-only check (shape, dtype, determinism) has source None: any ground truth replays it
    record = {**record, "replay": replay_command(target, record.get("size") or "small",
                                                 int(record.get("seed") or 0), record.get("case"),
                                                 record.get("source") or "all", record.get("device") or "cpu",
                                                 bool(record.get("fresh")))}
    if inputs:
        record["inputs_file"] = _save_inputs(record, directory / f"{stem}.safetensors")
    path = directory / f"{stem}.json"
    write_atomic(path, json.dumps(record, indent=2, default=str))
    return path


def _save_inputs(record: dict[str, Any], path: Path) -> str | None:
    try:
        from safetensors.torch import save_file
    except ImportError:
        return None
    import torch

    from .inputs import generate_inputs

    x = generate_inputs(record["definition_path"] or record["definition"], record.get("size", "small"),
                        int(record.get("seed", 0)), case=record.get("case"), fresh=bool(record.get("fresh")))
    tensors = {k: v.contiguous() for k, v in x.values.items() if isinstance(v, torch.Tensor)}
    scalars = {k: str(v) for k, v in x.values.items() if not isinstance(v, torch.Tensor)}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=scalars)
    return str(path)
