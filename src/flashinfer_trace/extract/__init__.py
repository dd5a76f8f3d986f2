"""`flashinfer-trace extract`: the definitions of every kernel a model's serving stack runs, from its
config, added to the dataset without duplicates.

    load (bundled name or config file) -> plan (architecture -> kernel specs) -> instantiate (one
    op-family template per kernel, with model / tp / ep tags) -> dedup (new / shared / unchanged /
    conflict) -> write (only what changed) -> report (summary, conflicts, kernels shared across models)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import ConfigError, ModelConfig, bundled, load_config, select_models
from .dedup import Dataset, Outcome, add, write
from .plan import KernelSpec, Plan, plan

__all__ = ["ConfigError", "Extraction", "ModelConfig", "bundled", "extract", "instantiate", "load_config", "plan",
           "select_models", "shared_kernels"]


@dataclass
class Extraction:
    plans: list[Plan]
    outcomes: list[Outcome]
    written: list[Path] = field(default_factory=list)
    dry_run: bool = False

    def counts(self, model: str | None = None) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for o in self.outcomes:
            if model is None or o.model == model:
                out[o.status] += 1
        return dict(out)


def instantiate(spec: KernelSpec, cfg: ModelConfig) -> dict[str, Any]:
    """The template's definition with this model's tags (model, parallelism)."""
    from .templates import FAMILIES

    d = FAMILIES[spec.family](**spec.kwargs)
    tags = [*d.get("tags", []), f"model:{cfg.name}", *spec.parallel]
    return {**d, "tags": list(dict.fromkeys(tags))}


def extract(configs: list[ModelConfig], definitions: str | Path, *, page_size: int = 1, dry_run: bool = False
            ) -> Extraction:
    ds = Dataset(Path(definitions))
    plans, outcomes = [], []
    for cfg in configs:
        p = plan(cfg, page_size=page_size)
        plans.append(p)
        for spec in p.kernels:
            try:
                definition = instantiate(spec, cfg)
            except ValueError as e:
                raise ConfigError(f"{cfg.source}: {spec.family} {spec.kwargs}: {e}") from None
            outcomes.append(add(ds, definition, cfg.name, list(spec.roles)))
    written = [] if dry_run else write(ds)
    return Extraction(plans, outcomes, written, dry_run)


def shared_kernels(definitions: str | Path) -> dict[str, list[str]]:
    """Every definition tagged with more than one model: name -> models."""
    import json

    out = {}
    for path in sorted(Path(definitions).rglob("*.json")):
        try:
            tags = json.loads(path.read_text()).get("tags", [])
        except (OSError, ValueError):
            continue
        models = [t.removeprefix("model:") for t in tags if isinstance(t, str) and t.startswith("model:")]
        if len(models) > 1:
            out[path.stem] = models
    return out
