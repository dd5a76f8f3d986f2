"""A sampler reference's draws, kept on disk for the later runs of the same reference on the same machine.

The draws of a plain-torch sampler reference are fixed by its code, its inputs, the seed of each call, the number
of rows a call takes, and the torch build and device that ran it; never by the FlashInfer release under test. A
sweep of five releases on one node would make the same draws five times: at the GPU settings ~700 000 draws a
check, the reference sorting its whole row for each (docs/ground-truth.md, "Sampling": ~13 GPU-seconds a check,
the bulk of a session's sampler time). The key covers every one of those; a stored file is read back only as an
int64 tensor of the expected shape (`torch.load(weights_only=True)`), anything else is made again. A record says
which it was (`reference_draws` in its sampling plan).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..definition import Definition
    from ..inputs import Inputs

FORMAT = 1  # bump when what a key covers, or how the draws are made (verdict/samples.draw_reference), changes


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes in row-major order (no numpy: the session environments may lack it)."""
    c = t.detach().cpu().contiguous()
    n = c.numel() * c.element_size()
    data = ctypes.string_at(c.data_ptr(), n) if n else b""
    return hashlib.sha256(data).hexdigest()


def machine(device: torch.device | str) -> dict[str, Any]:
    """What the draws depend on besides the call: the torch build and the device that runs the reference."""
    d = torch.device(device)
    where: dict[str, Any] = {"type": d.type}
    if d.type == "cuda":
        index = d.index if d.index is not None else torch.cuda.current_device()
        where |= {"name": torch.cuda.get_device_name(index),
                  "capability": list(torch.cuda.get_device_capability(index)), "cuda": torch.version.cuda}
    return {"torch": torch.__version__, "device": where}


@dataclass(frozen=True)
class DrawStore:
    root: Path

    def key(self, definition: Definition, inputs: Inputs, seed: int, row_draws: int, rows_per_call: int,
            device: torch.device | str) -> str:
        values = []
        for name in sorted(inputs.values):
            v = inputs.values[name]
            if isinstance(v, torch.Tensor):
                values.append([name, str(v.dtype), list(v.shape), tensor_digest(v)])
            else:
                values.append([name, type(v).__name__, repr(v)])
        text = json.dumps({"format": FORMAT, "reference": definition.reference, "entry": definition.reference_entry,
                           "inputs": values, "seed": seed, "row_draws": row_draws, "rows_per_call": rows_per_call,
                           **machine(device)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.pt"

    def get(self, key: str, shape: tuple[int, int]) -> torch.Tensor | None:
        """The stored draws, or None where there are none or the file is not an int64 tensor of `shape`."""
        try:
            t = torch.load(self._path(key), map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - absent, truncated or foreign: made again
            return None
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or tuple(t.shape) != tuple(shape):
            return None
        return t

    def put(self, key: str, draws: torch.Tensor) -> None:
        """Written whole or not at all (a temporary file renamed); a store that cannot be written is no error."""
        path, tmp = self._path(key), None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                torch.save(draws.detach().cpu().to(torch.int64).contiguous(), f)
            os.replace(tmp, path)
        except OSError:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
