"""The drift report (fitrace/drift.py): pairing, field differences and reference results between our
definitions and FlashInfer's own, on small fixture definitions written here."""

from __future__ import annotations

import json
from pathlib import Path

from flashinfer_trace.cli import main
from flashinfer_trace.fitrace import drift

OURS_REF = """import torch

EPS = {eps}


@torch.no_grad()
def run(hidden_states, weight):
    x = hidden_states.to(torch.float32)
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (x * inv * weight.to(torch.float32)).to(hidden_states.dtype)
"""

# fi_trace renders references like this: a preamble, then the template's function under its own name
THEIRS_REF = """from __future__ import annotations
import math
import torch
import torch.nn.functional as F


@torch.no_grad()
def _norm_reference(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    EPS = {eps}
    x = hidden_states.to(torch.float32)
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return {result}
"""
GOOD = "((x * inv) * weight.to(torch.float32)).to(hidden_states.dtype)"


def ours_rmsnorm(hidden: int = 64, eps: float = 1e-5, name: str | None = None, tags=None) -> dict:
    return {
        "name": name or f"rmsnorm_h{hidden}", "op_type": "rmsnorm",
        "description": "RMSNorm fixture.",
        "tags": tags if tags is not None else ["fi_api:flashinfer.norm.rmsnorm"],
        "axes": {"batch_size": {"type": "var"}, "hidden_size": {"type": "const", "value": hidden}},
        "inputs": {"hidden_states": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"},
                   "weight": {"shape": ["hidden_size"], "dtype": "bfloat16"}},
        "outputs": {"output": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}},
        "reference": OURS_REF.format(eps=eps),
    }


def theirs_rmsnorm(hidden: int = 64, eps: float = 1e-5, result: str = GOOD, api: str = "flashinfer.norm.rmsnorm",
                   name: str | None = None) -> dict:
    d = ours_rmsnorm(hidden, eps, name=name, tags=[f"fi_api:{api}", "status:verified"])
    d["reference"] = THEIRS_REF.format(eps=eps, result=result)
    d["check"] = "def _check(a, b):\n    return True\n"  # fi_trace's extra fields are carried, not compared
    return d


def write(folder: Path, *defs: dict) -> Path:
    for d in defs:
        p = folder / d["op_type"] / f"{d['name']}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(d, indent=1))
    return folder


def run_report(tmp_path: Path, ours: list[dict], theirs: list[dict], **kw) -> dict:
    return drift.report(write(tmp_path / "ours", *ours), write(tmp_path / "0.7.2.post1", *theirs), **kw)


FIELDS_ONLY = drift.ResultSettings(enabled=False)


def fields(p: dict) -> dict[str, tuple]:
    return {d["field"]: (d["ours"], d["theirs"]) for d in p["differences"]}


# -- fields -----------------------------------------------------------------------------------------
def test_identical_definitions_show_no_drift_and_agree(tmp_path):
    r = run_report(tmp_path, [ours_rmsnorm()], [theirs_rmsnorm()])
    assert r["flashinfer"] == "0.7.2.post1"
    (p,) = r["pairs"]
    assert (p["ours"], p["theirs"], p["pairing"]) == ("rmsnorm_h64", "rmsnorm_h64", "fi_api")
    assert p["differences"] == []
    assert {"eps", "outputs.names", "outputs.count", "inputs.hidden_states.dtype", "axes.const.hidden_size"} \
        <= set(p["matched"])
    assert p["result"]["outcome"] == "agree", p["result"]
    assert r["summary"]["drifting"] == 0 and r["summary"]["paired"] == 1


def test_eps_that_differs_is_an_eps_drift(tmp_path):
    r = run_report(tmp_path, [ours_rmsnorm(eps=1e-5)], [theirs_rmsnorm(eps=1e-6)], settings=FIELDS_ONLY)
    (p,) = r["pairs"]
    assert fields(p) == {"eps": (1e-5, 1e-6)}
    assert r["summary"]["drifting_by_field"] == {"eps": 1}


def test_extra_output_shows(tmp_path):
    theirs = theirs_rmsnorm()
    theirs["outputs"]["rms"] = {"shape": ["batch_size"], "dtype": "float32"}
    r = run_report(tmp_path, [ours_rmsnorm()], [theirs], settings=FIELDS_ONLY)
    diffs = fields(r["pairs"][0])
    assert diffs == {"outputs.count": (1, 2), "outputs.names": (["output"], ["output", "rms"])}


def test_dtype_axes_and_constants_drift(tmp_path):
    theirs = theirs_rmsnorm()
    theirs["inputs"]["weight"]["dtype"] = "float32"
    theirs["axes"]["batch_size"] = {"type": "const", "value": 1}  # var in ours
    theirs["reference"] = theirs["reference"].replace("    EPS = 1e-05\n", "    EPS = 1e-05\n    BLOCK = 256\n")
    ours = ours_rmsnorm()
    ours["reference"] = ours["reference"].replace("EPS = 1e-05\n", "EPS = 1e-05\nBLOCK = 128\n")
    diffs = fields(run_report(tmp_path, [ours], [theirs], settings=FIELDS_ONLY)["pairs"][0])
    assert diffs == {"inputs.weight.dtype": ("bfloat16", "float32"),
                     "axes.const.names": (["hidden_size"], ["batch_size", "hidden_size"]),
                     "axes.var.names": (["batch_size"], []), "constants.BLOCK": (128, 256)}


# -- results ----------------------------------------------------------------------------------------
def test_result_comparison_catches_a_changed_formula(tmp_path):
    """Same fields, a reference that forgets the weight: only running both shows it."""
    dropped = "(x * inv).to(hidden_states.dtype)"
    r = run_report(tmp_path, [ours_rmsnorm()], [theirs_rmsnorm(result=dropped)])
    (p,) = r["pairs"]
    assert p["differences"] == []
    assert p["result"]["outcome"] == "differ" and p["result"]["outputs"][0]["verdict"] != "pass"
    assert r["summary"]["drifting"] == 1 and r["summary"]["results"] == {"differ": 1}


def test_other_const_values_compare_results_at_ours(tmp_path):
    """Their rmsnorm_h32 and our rmsnorm_h64 are one kernel: the size is an axes.const drift, and the
    results still compare (their reference reads the size off the tensors) at our value, recorded."""
    r = run_report(tmp_path, [ours_rmsnorm(hidden=64)], [theirs_rmsnorm(hidden=32)])
    (p,) = r["pairs"]
    assert fields(p) == {"axes.const.hidden_size": (64, 32)}
    assert p["result"]["outcome"] == "agree" and p["result"]["const_axes_from_ours"] == {"hidden_size": [32, 64]}


def test_results_are_not_compared_where_shapes_do_not_bind(tmp_path):
    theirs = theirs_rmsnorm(hidden=32)
    theirs["axes"] = {"batch_size": {"type": "var"}, "hidden": {"type": "const", "value": 32}}  # renamed
    for spec in (*theirs["inputs"].values(), *theirs["outputs"].values()):
        spec["shape"] = [a.replace("hidden_size", "hidden") for a in spec["shape"]]
    (p,) = run_report(tmp_path, [ours_rmsnorm(hidden=64)], [theirs])["pairs"]
    assert p["result"] == {"outcome": "not-compared", "reason": "hidden_states: shape [4, 64] does not bind theirs "
                                                               "['batch_size', 'hidden'] (hidden = 32)"}


def test_results_are_not_compared_where_their_reference_takes_an_input_we_lack(tmp_path):
    theirs = theirs_rmsnorm()
    theirs["reference"] = theirs["reference"].replace("weight: torch.Tensor)", "weight: torch.Tensor, gate)")
    theirs["inputs"]["gate"] = {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}
    (p,) = run_report(tmp_path, [ours_rmsnorm()], [theirs])["pairs"]
    assert p["result"] == {"outcome": "not-compared",
                           "reason": "their reference takes gate, which our definition has no input for"}


# -- pairing ----------------------------------------------------------------------------------------
def test_pairing_rules_and_the_unpaired(tmp_path):
    ours = [ours_rmsnorm(64), ours_rmsnorm(128),
            ours_rmsnorm(256, name="norm_untagged_h256", tags=[]),  # no tag: op_type + const axes
            ours_rmsnorm(512, name="norm_untagged_h512", tags=[]),  # nothing upstream of that size
            ours_rmsnorm(64, name="wrapped_h64", tags=["fi_api:flashinfer.decode.PagedWrapper"])]
    theirs = [theirs_rmsnorm(64), theirs_rmsnorm(128), theirs_rmsnorm(256, api="flashinfer.norm.other"),
              theirs_rmsnorm(64, api="flashinfer.decode.PagedWrapper.plan", name="paged_plan_h64"),
              theirs_rmsnorm(64, api="flashinfer.decode.PagedWrapper.run", name="paged_run_h64"),
              theirs_rmsnorm(8, api="flashinfer.norm.gemma_rmsnorm", name="gemma_rmsnorm_h8")]
    r = run_report(tmp_path, ours, theirs, settings=FIELDS_ONLY)
    got = {p["ours"]: (p["theirs"], p["pairing"]) for p in r["pairs"]}
    assert got == {"rmsnorm_h64": ("rmsnorm_h64", "fi_api"),  # equal const axes win among the tagged
                   "rmsnorm_h128": ("rmsnorm_h128", "fi_api"),
                   "norm_untagged_h256": ("rmsnorm_h256", "op_type+const_axes"),
                   "wrapped_h64": ("paged_run_h64", "fi_api")}  # the wrapper's run, folded into the class
    assert [u["name"] for u in r["unpaired"]["ours"]] == ["norm_untagged_h512"]
    assert "none of op_type 'rmsnorm' with const axes {'hidden_size': 512}" in r["unpaired"]["ours"][0]["reason"]
    assert sorted(u["name"] for u in r["unpaired"]["upstream"]) == ["gemma_rmsnorm_h8", "paged_plan_h64"]
    assert r["summary"]["unpaired_ours"] == 1 and r["summary"]["unpaired_upstream"] == 2


def test_ambiguous_op_type_pairing_stays_unpaired(tmp_path):
    a = theirs_rmsnorm(64, api="flashinfer.norm.a", name="a_h64")
    b = theirs_rmsnorm(64, api="flashinfer.norm.b", name="b_h64")
    r = run_report(tmp_path, [ours_rmsnorm(64, tags=[])], [a, b], settings=FIELDS_ONLY)
    assert r["pairs"] == []
    assert r["unpaired"]["ours"][0]["reason"] == "ambiguous: op_type and const axes match a_h64, b_h64"


def test_unreadable_upstream_files_are_problems_and_manifests_are_skipped(tmp_path):
    up = write(tmp_path / "up", theirs_rmsnorm())
    (up / "broken.json").write_text("{")
    (up / "manifest.json").write_text(json.dumps({"flashinfer": "0.7.2"}))
    r = drift.report(write(tmp_path / "ours", ours_rmsnorm()), up, version="0.7.2", settings=FIELDS_ONLY)
    assert [Path(p["path"]).name for p in r["problems"]] == ["broken.json"]
    assert r["summary"]["upstream"] == 1 and r["flashinfer"] == "0.7.2"


def test_sandboxable_drops_future_imports_and_annotations():
    code = drift.sandboxable(THEIRS_REF.format(eps=1e-6, result=GOOD))
    assert "__future__" not in code and "torch.Tensor)" not in code and "->" not in code
    assert "EPS = 1e-06" in code


# -- the command ------------------------------------------------------------------------------------
def test_cli_writes_the_report_and_prints_the_counts(tmp_path, capsys):
    ours, up = write(tmp_path / "ours", ours_rmsnorm()), write(tmp_path / "0.7.2", theirs_rmsnorm(eps=1e-6))
    out = tmp_path / "results" / "drift-0.7.2.json"
    assert main(["drift", "--ours", str(ours), "--upstream", str(up), "--out", str(out), "--no-results"]) == 0
    text = capsys.readouterr().out
    assert "flashinfer 0.7.2: 1 paired of 1 ours / 1 upstream; 1 drifting" in text
    assert "drifting by field: eps 1" in text
    saved = json.loads(out.read_text())
    assert saved["schema_version"] == 1 and fields(saved["pairs"][0]) == {"eps": (1e-5, 1e-6)}


def test_missing_upstream_folder_is_an_error(tmp_path, capsys):
    ours = write(tmp_path / "ours", ours_rmsnorm())
    assert main(["drift", "--ours", str(ours), "--upstream", str(tmp_path / "nope")]) == 2
    assert "upstream folder" in capsys.readouterr().err


# -- the matrix -------------------------------------------------------------------------------------
def test_matrix_shows_a_drift_column_and_section(tmp_path):
    from flashinfer_trace.matrix import build, render_md
    from flashinfer_trace.matrix.render_html import render_html
    from flashinfer_trace.sweep.results import SessionInfo, TestRecord, write_session

    root = tmp_path / "results"
    recs = [TestRecord(f"tests/references/test_rmsnorm.py::test_matches[{n}-torch]", "passed", 0.1, None,
                       {"definition": n, "source": "torch"}) for n in ("rmsnorm_h64", "rmsnorm_h128", "rmsnorm_h32")]
    write_session(root / "references-cpu", SessionInfo("references-cpu", "cpu-torch", arch="cpu",
                                                       finished="2026-11-22T10:00:00"), records=recs)
    ours = [ours_rmsnorm(64), ours_rmsnorm(128), ours_rmsnorm(32, tags=[])]
    r = run_report(tmp_path, ours, [theirs_rmsnorm(64, eps=1e-6), theirs_rmsnorm(128)], settings=FIELDS_ONLY)
    drift.write(r, root / "drift" / "drift-0.7.2.post1.json")
    (root / "drift-0.6.6.json").write_text("{")  # corrupt: a problem, not a crash

    m = build([root], definitions_dir=tmp_path / "ours")
    assert [x["flashinfer"] for x in m["drift"]] == ["0.7.2.post1"]
    assert m["drift"][0]["summary"]["drifting_by_field"] == {"eps": 1}
    defs = {d["name"]: d for d in m["definitions"]}
    assert defs["rmsnorm_h64"]["drift"]["0.7.2.post1"]["fields"] == ["eps"]
    assert defs["rmsnorm_h128"]["drift"]["0.7.2.post1"]["state"] == "same"
    assert defs["rmsnorm_h32"]["drift"]["0.7.2.post1"]["state"] == "unpaired"
    assert any(p["path"].endswith("drift-0.6.6.json") and "corrupt drift report" in p["problem"]
               for p in m["problems"])

    md = render_md(m)
    assert "| definition | drift (fi 0.7.2.post1) |" in md
    assert "| `rmsnorm_h64` | Δ eps |" in md and "| `rmsnorm_h128` | = |" in md
    assert "| `rmsnorm_h32` | unpaired |" in md

    html = render_html(m)
    assert 'href="#drift-0.7.2.post1-rmsnorm_h64"' in html and 'id="drift-0.7.2.post1-rmsnorm_h64"' in html
    assert "eps: 1e-05 / 1e-06" in html and '<section id="drift"' in html
