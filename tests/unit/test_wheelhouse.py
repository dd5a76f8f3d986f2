"""sweep/wheelhouse.py: a combination's closure for another machine, its manifest, and the offline install's
check of it. pip is a fake that resolves from a small made-up index and writes stand-in wheels."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from flashinfer_trace.cli import main
from flashinfer_trace.sweep import wheelhouse
from flashinfer_trace.sweep.combos import load_combination
from flashinfer_trace.sweep.install import PROJECT_REQUIREMENTS, InstallOptions, install
from flashinfer_trace.sweep.wheelhouse import WheelhouseError

ROOT = Path(__file__).resolve().parents[2]
COMBO = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.6.6.toml")
LINUX_311 = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
             "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
             "implementation_name": "cpython", "platform_python_implementation": "CPython"}
# what pip resolves for COMBO on Linux: name -> (version, requires_dist)
INDEX = {
    "torch": ("2.11.0+cu130", ["filelock", "sympy>=1.13", "nvidia-cublas==13.0.0; platform_system == 'Linux'"]),
    "nvidia-cublas": ("13.0.0", []),
    "sympy": ("1.14.0", ["mpmath<1.4"]),
    "mpmath": ("1.3.0", []),
    "flashinfer-python": ("0.6.6", ["torch", "requests[socks]", "apache-tvm-ffi", "nvidia-cudnn-frontend",
                                    "tabulate; extra == 'docs'", "pywin32; sys_platform == 'win32'"]),
    "requests": ("2.32.5", ["filelock", "pysocks>=1.5; extra == 'socks'"]),
    "pysocks": ("1.7.1", []),
    "filelock": ("3.20.0", []),
    "apache-tvm-ffi": ("0.1.15.post2", []),
    "nvidia-cudnn-frontend": ("1.32.0", []),
    "cupti-python": ("13.0.1", []),
    "pytest": ("8.4.2", ["packaging>=20"]),  # the project's own requirements resolve with the pins
    "packaging": ("25.0", []),
    "nox": ("2025.5.1", ["packaging>=20"]),  # resolved only when asked for (--add)
}
FLAGS = ("--dry-run", "--ignore-installed", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check")


def _content(name: str, version: str) -> bytes:
    return f"wheel of {name} {version}".encode()


def _file(name: str, version: str) -> str:
    return f"{name.replace('-', '_')}-{version}-py3-none-any.whl"


class FakePip:
    """`pip install --dry-run --report` writes a resolution report of INDEX; `pip download --no-deps` writes
    each named wheel (with `swap`, other bytes than the report's hash says)."""

    def __init__(self, index=INDEX, environment=LINUX_311, swap: str | None = None):
        self.index, self.environment, self.swap, self.calls = index, environment, swap, []

    def __call__(self, args: list[str]) -> None:
        self.calls.append(args)
        value = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--") and a not in FLAGS}
        wanted = [a for i, a in enumerate(args[1:], 1) if not a.startswith("--") and args[i - 1] not in value]
        if args[0] == "install":
            asked = {canonicalize_name(Requirement(a).name) for a in wanted}
            items = [{"metadata": {"name": n, "version": v, "requires_dist": reqs}, "requested": n in asked,
                      "download_info": {"url": f"https://example.invalid/{_file(n, v)}", "archive_info": {
                          "hashes": {"sha256": hashlib.sha256(_content(n, v)).hexdigest()}}}}
                     for n, (v, reqs) in self.index.items() if n != "nox" or n in asked]
            Path(value["--report"]).write_text(json.dumps({"version": "1", "install": items,
                                                           "environment": self.environment}))
        elif args[0] == "download":
            for req in wanted:
                name, version = req.split("===")
                data = b"swapped!" + _content(name, version) if name == self.swap else _content(name, version)
                (Path(value["--dest"]) / _file(name, version)).write_bytes(data)


def _options(call: list[str], flag: str) -> list[str]:
    return [call[i + 1] for i, a in enumerate(call[:-1]) if a == flag]


def test_the_closure_is_resolved_for_the_target_and_every_wheel_recorded(tmp_path):
    pip, out = FakePip(), tmp_path / "wh"
    manifest = wheelhouse.build(COMBO, out, version="3.12", add=["nox>=2024"], pip=pip)
    resolve, download = pip.calls
    for call in pip.calls:
        assert "--only-binary=:all:" in call and _options(call, "--python-version") == ["3.12"]
        assert _options(call, "--implementation") == ["cp"]
        assert {"manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"} <= set(
            _options(call, "--platform"))
        assert _options(call, "--extra-index-url") == ["https://download.pytorch.org/whl/cu130"]
    asked = [*COMBO.requirements(), *PROJECT_REQUIREMENTS, "nox>=2024"]
    assert resolve[:2] == ["install", "--dry-run"] and resolve[-len(asked):] == asked == manifest["requirements"]
    assert download[:2] == ["download", "--no-deps"] and "torch===2.11.0+cu130" in download
    assert manifest["combination"] == COMBO.id and manifest["constraints_sha256"] == COMBO.sha256
    assert manifest["python_version"] == "3.12" and manifest["platforms"] == ["manylinux_2_28_x86_64"]
    assert {w["name"] for w in manifest["wheels"]} == set(INDEX) and manifest["left_out"] == []
    for w in manifest["wheels"]:
        data = (out / w["file"]).read_bytes()
        assert w["sha256"] == hashlib.sha256(data).hexdigest() and w["size"] == len(data)
        assert w["pinned"] == (COMBO.pin(w["name"]) is not None)
    assert json.loads((out / "wheelhouse.json").read_text()) == manifest
    assert wheelhouse.verify(out, COMBO.id) == manifest
    assert manifest["notes"] == ["pip ran on Python 3.11 and evaluated dependency markers for it, not for 3.12: "
                                 "for an exact closure build with --python python3.12"]


def test_exclude_leaves_out_a_package_and_what_only_it_requires(tmp_path):
    pip = FakePip()
    manifest = wheelhouse.build(COMBO, tmp_path / "wh", version="3.11", exclude=["Torch"], pip=pip)
    kept = {w["name"] for w in manifest["wheels"]}
    assert {w["name"] for w in manifest["left_out"]} == {"torch", "nvidia-cublas", "sympy", "mpmath"}
    assert "filelock" in kept  # torch needs it, and so does requests
    assert "pysocks" in kept  # through requests[socks]
    assert not any(a.startswith(("torch=", "sympy=")) for a in pip.calls[1])
    assert {"pytest", "packaging"} <= kept  # the project's requirements, for the offline install
    assert manifest["excluded"] == ["torch"] and manifest["notes"] == []
    with pytest.raises(WheelhouseError, match=r"--exclude numpy: not in the closure pip resolved"):
        wheelhouse.build(COMBO, tmp_path / "wh2", version="3.11", exclude=["numpy"], pip=FakePip())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"version": "3"}, r"--python-version '3': expected 3.MINOR"),
    ({"version": "3.9"}, r"--python-version 3.9: cu130-torch2.11-fi0.6.6 needs Python <3.14,>=3.10"),
    ({"version": "3.12", "platforms": ["Manylinux 2.28"]}, r"--platform 'Manylinux 2.28': not a wheel platform tag"),
    ({"version": "3.12", "platforms": []}, r"--platform: at least one platform tag"),
    ({"version": "3.12", "add": ["nox>="]}, r"--add 'nox>=': not a requirement"),
])
def test_a_bad_target_is_refused_before_pip_runs(tmp_path, kwargs, message):
    pip = FakePip()
    with pytest.raises(WheelhouseError, match=message):
        wheelhouse.build(COMBO, tmp_path / "wh", pip=pip, **kwargs)
    assert pip.calls == []


def test_an_uninstallable_combination_or_a_foreign_folder_is_refused(tmp_path):
    gone = load_combination(ROOT / "constraints" / "cu128-torch2.8-fi0.4.1.toml")
    with pytest.raises(WheelhouseError, match=r"cu128-torch2.8-fi0.4.1 is marked uninstallable \(flashinfer-python "
                                              r"0.4.1 pins"):
        wheelhouse.build(gone, tmp_path / "wh", version="3.12", pip=FakePip())
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(WheelhouseError, match=r"busy: not empty and holds no wheelhouse.json"):
        wheelhouse.build(COMBO, tmp_path / "busy", version="3.12", pip=FakePip())
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]


def test_a_rebuild_drops_the_wheels_the_new_closure_no_longer_has(tmp_path):
    out = tmp_path / "wh"
    wheelhouse.build(COMBO, out, version="3.12", pip=FakePip())
    newer = {**INDEX, "filelock": ("3.21.0", [])}
    manifest = wheelhouse.build(COMBO, out, version="3.12", pip=FakePip(newer))
    assert not (out / _file("filelock", "3.20.0")).exists() and (out / _file("filelock", "3.21.0")).is_file()
    assert sorted(p.name for p in out.glob("*.whl")) == sorted(w["file"] for w in manifest["wheels"])


def test_a_download_that_is_not_the_resolved_file_is_refused(tmp_path):
    with pytest.raises(WheelhouseError, match=r"apache_tvm_ffi-0.1.15.post2-py3-none-any.whl: sha256 [0-9a-f]{64}, "
                                              r"but the resolution chose a file with"):
        wheelhouse.build(COMBO, tmp_path / "wh", version="3.12", pip=FakePip(swap="apache-tvm-ffi"))
    assert not (tmp_path / "wh" / "wheelhouse.json").exists()


def test_notes_say_where_pip_evaluated_markers_for_another_machine():
    mac = {**LINUX_311, "python_version": "3.12", "sys_platform": "darwin", "platform_machine": "arm64"}
    tags = wheelhouse.platform_tags(["manylinux_2_28_x86_64"])
    assert wheelhouse.target_notes(mac, "3.12", tags) == [
        "pip ran on darwin, the target is Linux: markers such as torch's `platform_system == 'Linux'` were "
        "evaluated for the builder"]
    arm = {**LINUX_311, "python_version": "3.12", "platform_machine": "aarch64"}
    assert "pip ran on aarch64, the target is x86_64" in wheelhouse.target_notes(arm, "3.12", tags)[0]
    assert wheelhouse.platform_tags(["manylinux2014_aarch64"])[-1] == "manylinux2014_aarch64"
    assert "manylinux1_aarch64" not in wheelhouse.platform_tags(["manylinux2014_aarch64"])


def test_the_offline_install_refuses_a_wheelhouse_that_changed_on_the_way(tmp_path):
    out = tmp_path / "wh"
    wheelhouse.build(COMBO, out, version="3.12", pip=FakePip())
    damaged = out / _file("flashinfer-python", "0.6.6")
    data = bytearray(damaged.read_bytes())
    data[0] ^= 1  # one bit, same size
    damaged.write_bytes(bytes(data))
    shutil.copy(out / _file("mpmath", "1.3.0"), out / "six-1.17.0-py3-none-any.whl")
    (out / _file("pysocks", "1.7.1")).unlink()
    log = tmp_path / "install.log"
    result = install(COMBO, str(tmp_path / "no-python"), InstallOptions(wheelhouse=out), project=ROOT, log=log)
    assert not result.ok and result.error.startswith("WheelhouseError: ")
    for problem in ("flashinfer_python-0.6.6-py3-none-any.whl: sha256", "six-1.17.0-py3-none-any.whl: not in the "
                    "manifest", "pysocks-1.7.1-py3-none-any.whl: missing", "nothing installed"):
        assert problem in result.error
    assert log.read_text().startswith("refused: ")
    with pytest.raises(WheelhouseError, match=r"built for cu130-torch2.11-fi0.6.6, not cpu-torch2.13"):
        wheelhouse.verify(out, "cpu-torch2.13")
    (out / "wheelhouse.json").write_text('{"format": 1, "wheels": [{"file": "../x.whl", "size": 1, "sha256": "a"}]}')
    with pytest.raises(WheelhouseError, match=r"`wheels` must list"):
        wheelhouse.verify(out)


def test_the_commands(tmp_path, monkeypatch, capsys):
    pip = FakePip()
    monkeypatch.setattr(wheelhouse, "pip_runner", lambda python: pip)
    out, constraints = tmp_path / "wh", str(ROOT / "constraints")
    assert main(["wheelhouse", "build", "--combination", COMBO.id, "--out", str(out), "--python-version", "3.11",
                 "--platform", "manylinux_2_28_x86_64", "--exclude", "torch", "--constraints", constraints]) == 0
    printed = capsys.readouterr().out
    assert "9 wheel(s)" in printed and "left out: mpmath 1.3.0, nvidia-cublas 13.0.0, sympy 1.14.0, torch" in printed
    assert main(["wheelhouse", "verify", str(out), "--combination", COMBO.id, "--constraints", constraints]) == 0
    assert "9 wheel(s) of cu130-torch2.11-fi0.6.6 match" in capsys.readouterr().out
    (out / _file("filelock", "3.20.0")).write_bytes(b"x" * len(_content("filelock", "3.20.0")))
    assert main(["wheelhouse", "verify", str(out)]) == 1
    assert "filelock-3.20.0-py3-none-any.whl: sha256" in capsys.readouterr().err
    assert main(["wheelhouse", "build", "--combination", "cu999-nothing", "--out", str(tmp_path / "x"),
                 "--constraints", constraints]) == 2
    assert "no combination 'cu999-nothing' in" in capsys.readouterr().err
    assert main(["wheelhouse", "verify", str(tmp_path)]) == 2
    assert "no wheelhouse.json" in capsys.readouterr().err


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal pure-Python wheel, for a real pip on a local folder."""
    import base64
    import zipfile

    dist = f"{name.replace('-', '_')}-{version}"
    files = {f"{name.replace('-', '_')}/__init__.py": b"",
             f"{dist}.dist-info/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                            + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        b"Tag: py3-none-any\n"}
    record = "".join(f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},"
                     f"{len(v)}\n" for k, v in files.items())
    files[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        for k, v in files.items():
            z.writestr(k, v)


def test_a_real_pip_takes_the_arguments_and_downloads_exactly_what_it_resolved(tmp_path):
    """pip itself on a local folder (no index): the resolution report, --exclude, and a download of exactly the
    resolved version, where `==` would take a local-version wheel beside it that the resolution turned down."""
    pytest.importorskip("pip")
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "torch", "2.13.0", ("fakecuda", "shared"))
    _wheel(index, "torch", "2.13.0+cpu", ("not-in-the-index",))  # newer by its local label, unresolvable
    _wheel(index, "fakecuda", "1.0")
    _wheel(index, "shared", "2.0")
    _wheel(index, "pytest", "8.0", ("shared", "winonly; sys_platform == 'win32'"))
    combo = load_combination(ROOT / "constraints" / "cpu-torch2.13.toml")
    real = wheelhouse.pip_runner()

    def pip(args: list[str]) -> None:  # --isolated: no pip.conf or PIP_* of this machine
        real([args[0], "--isolated", "--no-index", "--find-links", str(index), *args[1:]])

    out = tmp_path / "wh"
    manifest = wheelhouse.build(combo, out, version="3.12", project=False, add=["pytest"], pip=pip)
    assert sorted(w["file"] for w in manifest["wheels"]) == [
        "fakecuda-1.0-py3-none-any.whl", "pytest-8.0-py3-none-any.whl", "shared-2.0-py3-none-any.whl",
        "torch-2.13.0-py3-none-any.whl"]
    manifest = wheelhouse.build(combo, out, version="3.12", project=False, add=["pytest"], exclude=["torch"], pip=pip)
    assert sorted(p.name for p in out.glob("*.whl")) == ["pytest-8.0-py3-none-any.whl", "shared-2.0-py3-none-any.whl"]
    assert manifest["left_out"] == [{"name": "fakecuda", "version": "1.0"}, {"name": "torch", "version": "2.13.0"}]
    assert wheelhouse.verify(out, combo.id) == manifest
