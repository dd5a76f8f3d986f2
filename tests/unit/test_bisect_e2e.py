"""bisect end to end on the CPU: stand-in releases of a tiny kernel package (wheels built here, one of them and
the later ones computing RMSNorm 5% too large) in a local wheelhouse, each probed in a venv of its own that
reuses this interpreter's torch, checked with `--kernel`; the report names the first bad release, and a rerun
resumes from the probes' records. Four probes of ~25 s each on the 2-core CPU machine (a venv, an offline install,
a check): `heavy` (nox -s tests-heavy)."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from flashinfer_trace.cli import main
from flashinfer_trace.sweep.install import SITE_ENV

pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]
NAME = "bisect_demo_kernel"
SOURCE = """import torch


def rmsnorm(hidden_states, weight, eps):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (y * {factor}).to(hidden_states.dtype)
"""


def build_wheel(folder: Path, version: str, factor: float) -> Path:
    """A pure-Python wheel of the stand-in package (PEP 427: the files, METADATA, WHEEL and RECORD)."""
    info = f"{NAME}-{version}.dist-info"
    files = {f"{NAME}/__init__.py": SOURCE.format(factor=factor),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: bisect-demo-kernel\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}

    def digest(text: str) -> str:
        raw = hashlib.sha256(text.encode()).digest()
        return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    files[f"{info}/RECORD"] = "".join(f"{p},{digest(t)},{len(t.encode())}\n" for p, t in files.items()) + \
        f"{info}/RECORD,,\n"
    path = folder / f"{NAME}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
    return path


def test_bisect_finds_the_planted_release_end_to_end(tmp_path, monkeypatch, capsys):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version, factor in (("1.0.0", 1.0), ("1.1.0", 1.0), ("1.2.0", 1.05), ("1.3.0", 1.05)):
        build_wheel(wheels, version, factor)
    torch_version = torch.__version__.split("+")[0]
    combo = tmp_path / "cpu-demo.toml"
    combo.write_text('[combination]\ncuda = "none"\ntorch_variant = "cpu"\narchs = []\npython = ">=3.10"\n\n'
                     f'[pins]\ntorch = "{torch_version}"\nbisect-demo-kernel = "1.3.0"\n')
    monkeypatch.setenv(SITE_ENV, str(tmp_path / "site"))  # install.py's per-combination folders
    monkeypatch.chdir(ROOT)  # the project each probe layers in
    out = tmp_path / "bisect"
    args = ["bisect", "definitions/rmsnorm/rmsnorm_h128.json", "--package", "bisect-demo-kernel",
            "--kernel", f"{NAME}:rmsnorm", "--good", "1.0.0", "--bad", "1.3.0", "--combination", str(combo),
            "--wheelhouse", str(wheels), "--preinstalled-torch", sys.executable, "--out", str(out),
            "--sizes", "small", "--seeds", "0", "--no-edge-cases", "--json"]
    t0 = time.monotonic()
    assert main(args) == 0
    first_run = time.monotonic() - t0
    report = json.loads(capsys.readouterr().out)
    assert (report["last_good"], report["first_bad"], report["suspects"]) == ("1.1.0", "1.2.0", ["1.2.0"])
    assert [(p["version"], p["verdict"]) for p in report["probes"]] == [
        ("1.3.0", "bad"), ("1.0.0", "good"), ("1.1.0", "good"), ("1.2.0", "bad")]
    failing = report["evidence"]["first_bad_failing"]
    assert failing and all(f["state"] == "fail" and f["tolerance_used"] > 1 for f in failing)
    assert set(report["evidence"]["last_good_same_cases"].values()) == {"pass"}
    assert report["changelog"] is None  # no known repository for the stand-in
    # each release's records are kept, and the kernel the check called is the release probed
    for version in ("1.0.0", "1.1.0", "1.2.0", "1.3.0"):
        stream = out / "rmsnorm_h128" / version / "check.jsonl"
        records = [json.loads(line) for line in stream.read_text().splitlines()]
        assert {r["ground_truth"]["version"] for r in records if r["source"] == "kernel"} == {version}
    assert json.loads((out / "rmsnorm_h128" / "bisect.json").read_text())["first_bad"] == "1.2.0"
    # a rerun resumes: every probe is taken from its probe.json, nothing installed or checked again
    t0 = time.monotonic()
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["first_bad"] == "1.2.0"
    rerun = time.monotonic() - t0
    assert rerun < first_run / 4
    print(f"first run {first_run:.1f} s, rerun {rerun:.1f} s")
