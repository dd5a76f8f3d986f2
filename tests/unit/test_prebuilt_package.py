"""FlashInfer's own prebuilt modules (flashinfer-jit-cache, from its index): a combination names the index and pins
the package; the install passes the index to pip; a session whose environment has the package of its
flashinfer-python release builds nothing and records every job `prebuilt`. The package is a locally built
stand-in wheel served from a local PEP 503 index (FlashInfer's index is not reachable from the tests)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flashinfer_trace.sweep import install, prebuilt, session
from flashinfer_trace.sweep.combos import CombinationError, load_combination
from flashinfer_trace.sweep.jit.plan import Job
from flashinfer_trace.sweep.jit.report import read_report

GPU_COMBO = """[combination]
cuda = "13"
torch_variant = "cu130"
archs = ["sm90"]
python = ">=3.10"
indexes = [{indexes}]

[pins]
torch = "2.11.0"
flashinfer-python = "0.6.6"
flashinfer-jit-cache = "0.6.6+cu130"
"""


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal valid wheel: metadata only (a stand-in for the real package)."""
    dist = name.replace("-", "_")
    files = {f"{dist}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  "Tag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()}"
                     f",{len(t.encode())}\n" for p, t in files.items()) + f"{dist}-{version}.dist-info/RECORD,,\n"
    files[f"{dist}-{version}.dist-info/RECORD"] = record
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
    return path


def _index(root: Path, *wheels: Path) -> str:
    """A PEP 503 simple index over the wheels: file://ROOT/simple."""
    for w in wheels:
        project = w.name.split("-")[0].replace("_", "-")
        page = root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        (page / "index.html").write_text(f'<a href="{w.resolve().as_uri()}">{w.name}</a>\n')
    return (root / "simple").resolve().as_uri()


def test_a_combination_names_its_indexes_and_a_bad_one_is_refused(tmp_path):
    good = tmp_path / "cu130-fi0.6.6-jitcache.toml"
    good.write_text(GPU_COMBO.format(indexes='"https://flashinfer.ai/whl/cu130"'))
    combo = load_combination(good)
    assert combo.indexes == ("https://flashinfer.ai/whl/cu130",) and combo.metadata()["indexes"] == list(combo.indexes)
    bad = tmp_path / "bad.toml"
    bad.write_text(GPU_COMBO.format(indexes='"flashinfer.ai/whl"'))
    with pytest.raises(CombinationError, match="combination.indexes"):
        load_combination(bad)


def test_the_install_passes_the_combinations_index_to_pip(tmp_path, monkeypatch):
    path = tmp_path / "cu130-fi0.6.6-jitcache.toml"
    path.write_text(GPU_COMBO.format(indexes='"file:///idx/simple"'))
    calls: list[list[str]] = []
    monkeypatch.setattr(install, "site_packages", lambda python: tmp_path / "site")
    monkeypatch.setattr(install._Runner, "__call__", lambda self, cmd: calls.append([str(c) for c in cmd]) or "")
    (tmp_path / "site").mkdir()
    result = install._install(load_combination(path), "python", install.InstallOptions(), project=tmp_path,
                              log=tmp_path / "install.log")
    assert result.ok, result.error
    pins = next(c for c in calls if "flashinfer-jit-cache==0.6.6+cu130" in c)
    assert pins[pins.index("--extra-index-url") + 1] == "file:///idx/simple"
    torch = next(c for c in calls if "torch==2.11.0" in c)
    assert "file:///idx/simple" not in torch  # torch comes from its own index only


def test_the_stand_in_package_from_a_local_index_is_recognised(tmp_path):
    index = _index(tmp_path / "index", _wheel(tmp_path / "wheels", "flashinfer-python", "0.6.6"),
                   _wheel(tmp_path / "wheels", "flashinfer-jit-cache", "0.6.6+cu130"))
    target = tmp_path / "env"
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_NO_INPUT="1")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    "--index-url", index, "flashinfer-python==0.6.6", "flashinfer-jit-cache==0.6.6+cu130"],
                   check=True, env=env, capture_output=True)
    code = ("import json; from flashinfer_trace.sweep import manifest, prebuilt; "
            "print(json.dumps(prebuilt.package_of(manifest.package_versions())))")
    src = Path(__file__).resolve().parents[2] / "src"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=f"{target}{os.pathsep}{src}")).stdout
    package, why_not = json.loads(out)
    assert package == {"package": "flashinfer-jit-cache", "version": "0.6.6+cu130", "flashinfer-cubin": None}
    assert why_not is None


def test_another_releases_package_is_not_used():
    package, why = prebuilt.package_of({"flashinfer-python": "0.6.14", "flashinfer-jit-cache": "0.6.6+cu130"})
    assert package is None and "not of flashinfer-python 0.6.14" in why
    assert prebuilt.package_of({"flashinfer-python": "0.6.6", "flashinfer-jit-cache": None}) == (None, None)


JOBS = [Job("rmsnorm_h4096", "rmsnorm_h4096.json", "rmsnorm", "flashinfer", "flashinfer.norm.rmsnorm", 600.0),
        Job("top_k_sampling_v128256", "t.json", "sampling", "flashinfer", "flashinfer.sampling.top_k", 600.0)]


def _fake_plan(monkeypatch, ran: list):
    from flashinfer_trace.sweep import jit

    monkeypatch.setattr(jit, "plan", lambda definitions, config: list(JOBS))
    monkeypatch.setattr(jit, "run", lambda jobs, config, stop=None: ran.append(jobs) or iter(()))
    monkeypatch.setattr(jit, "libraries", lambda roots: {})
    monkeypatch.setattr(jit, "cache_roots", lambda: [])


def test_with_the_package_the_session_builds_nothing_and_records_prebuilt(tmp_path, monkeypatch):
    ran: list = []
    _fake_plan(monkeypatch, ran)
    summary, _ = session.prebuild(tmp_path, [], versions={"flashinfer-python": "0.6.6",
                                                          "flashinfer-jit-cache": "0.6.6+cu130"})
    assert ran == []  # no build ran
    assert summary["counts"] == {"prebuilt": 2} and summary["prebuilt"]["version"] == "0.6.6+cu130"
    records = read_report(tmp_path / session.JIT_STREAM)
    assert [(r.definition, r.status, r.checked_by) for r in records] == [
        ("rmsnorm_h4096", "prebuilt", "package"), ("top_k_sampling_v128256", "prebuilt", "package")]
    from flashinfer_trace.pytest_plugin import _jit_ready
    from flashinfer_trace.sweep.jit.report import JitReport

    assert _jit_ready(JitReport(records).outcome, "rmsnorm_h4096", "flashinfer")


def test_without_the_package_of_its_release_the_session_builds(tmp_path, monkeypatch):
    ran: list = []
    _fake_plan(monkeypatch, ran)
    summary, _ = session.prebuild(tmp_path, [], versions={"flashinfer-python": "0.6.14",
                                                          "flashinfer-jit-cache": "0.6.6+cu130"})
    assert ran == [JOBS] and "prebuilt" not in summary and "not of flashinfer-python" in summary["note"]
