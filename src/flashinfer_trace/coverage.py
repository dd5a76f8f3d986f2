"""`flashinfer-trace coverage`: which definitions have reference tests, which ground truths exist
per op type, and which axis values (dtype, stage, page size, causal, const sizes) the
definitions of each op type cover, so gaps are visible before a kernel ships without a test."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from . import semantics as sem
from .definition import Definition
from .groundtruth import SOURCES, adapters_for
from .inputs import supported_op_types
from .verdict.compare import governing_dtype


@dataclass
class OpCoverage:
    op_type: str
    definitions: int = 0
    tested: int = 0
    has_generator: bool = False
    ground_truths: dict[str, list[str]] = field(default_factory=dict)  # source -> APIs
    dtypes: set[str] = field(default_factory=set)
    stages: set[str] = field(default_factory=set)
    page_sizes: set[int] = field(default_factory=set)
    causal: set[bool] = field(default_factory=set)
    const_axes: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))

    def as_dict(self) -> dict:
        # asdict cannot copy a defaultdict before Python 3.12: build this one by hand
        d = {k: v for k, v in asdict(replace(self, const_axes={})).items()}
        for k in ("dtypes", "stages", "page_sizes", "causal"):
            d[k] = sorted(d[k])
        d["const_axes"] = {k: sorted(v) for k, v in sorted(self.const_axes.items())}
        return d


@dataclass
class Coverage:
    with_tests: list[str]
    without_tests: list[str]
    stale_tests: list[str]  # op types with a test file and no definition
    op_types: dict[str, OpCoverage]

    def as_dict(self) -> dict:
        return {"with_tests": self.with_tests, "without_tests": self.without_tests,
                "stale_tests": self.stale_tests, "op_types": {k: v.as_dict() for k, v in self.op_types.items()}}


DEFAULT_DIR = Path("tests") / "references"


def tested_op_types(directory: Path = DEFAULT_DIR) -> dict[str, str]:
    """op type -> the test file that declares `reference_test("<op type>")` (every planned case of every
    definition of that op type runs there)."""
    import ast

    out: dict[str, str] = {}
    for path in sorted(directory.glob("test_*.py")):
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, OSError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                    == "reference_test" and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                out[node.args[0].value] = str(path)
    return out


def coverage(definitions: list[Definition], tests_dir: Path = DEFAULT_DIR) -> Coverage:
    generators = set(supported_op_types())
    files = tested_op_types(tests_dir)
    tested = {d.name for d in definitions if d.op_type in files and d.op_type in generators}
    names = {d.name for d in definitions}
    ops: dict[str, OpCoverage] = {}
    for d in sorted(definitions, key=lambda d: (d.op_type, d.name)):
        op = ops.get(d.op_type)
        if op is None:
            op = ops[d.op_type] = OpCoverage(d.op_type, has_generator=d.op_type in generators)
            op.ground_truths = {s: sorted({a.api for a in adapters_for(d.op_type, s)}) for s in SOURCES}
        op.definitions += 1
        op.tested += d.name in tested
        op.dtypes.add(governing_dtype(d))
        if d.op_type == "dsa_paged":  # sparse attention (decode and prefill alike) and its top-k indexer
            op.stages.add(d.stage or "decode+prefill")
            if "page_size" in d.const_axes:
                op.page_sizes.add(d.const_axes["page_size"])
        elif d.op_type in ("gqa_paged", "gqa_ragged", "mla_paged", "mla_ragged"):
            op.stages.add(sem.stage(d))
            op.causal.add(sem.is_causal(d))
            if "page_size" in d.const_axes:
                op.page_sizes.add(d.const_axes["page_size"])
        elif d.stage:
            op.stages.add(d.stage)
        for axis, value in d.const_axes.items():
            if axis != "page_size":
                op.const_axes[axis].add(value)
    return Coverage(sorted(n for n in names if n in tested), sorted(n for n in names if n not in tested),
                    sorted(op for op in files if op not in ops), ops)
