"""sweep/wheelhouse.py: a combination's closure for another machine, its manifest, and the offline install's
check of it. pip is a fake that resolves from a small made-up index and writes stand-in wheels."""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import socket
import sys
import threading
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from flashinfer_trace.cli import main
from flashinfer_trace.sweep import wheelhouse
from flashinfer_trace.sweep.combos import load_combination
from flashinfer_trace.sweep.install import PROJECT_REQUIREMENTS, InstallOptions, install
from flashinfer_trace.sweep.wheelhouse import WheelhouseError

PROBE = wheelhouse.probe_index  # the real one, before the fixture stands in for it

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


@pytest.fixture(autouse=True)
def probed(monkeypatch):
    """No test reaches the network: every index answers, and each probe is recorded as (url, project)."""
    calls: list[tuple[str, str]] = []

    def probe(url: str, project: str, timeout: float = wheelhouse.INDEX_TIMEOUT) -> None:
        calls.append((url, project))

    monkeypatch.setattr(wheelhouse, "probe_index", probe)
    monkeypatch.setattr(wheelhouse, "configured_index", lambda python=None: None)
    return calls


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


# -- the indexes, checked before pip ----------------------------------------------------------------------
def test_each_index_the_build_uses_is_probed_before_pip(tmp_path, probed):
    pip = FakePip()
    wheelhouse.build(COMBO, tmp_path / "wh", version="3.12", pip=pip)
    assert probed == [("https://pypi.org/simple", "torch"), ("https://download.pytorch.org/whl/cu130", "torch")]
    assert _options(pip.calls[0], "--index-url") == []  # pip's own configured index, untouched
    probed.clear()
    pip = FakePip()
    wheelhouse.build(COMBO, tmp_path / "wh2", version="3.12", pip=pip, torch_index="", index_url="http://mirror/simple")
    assert probed == [("http://mirror/simple", "torch")]  # --torch-index "": no torch index at all
    for call in pip.calls:
        assert _options(call, "--index-url") == ["http://mirror/simple"] and _options(call, "--extra-index-url") == []


def test_an_unreachable_index_stops_the_build_before_pip_naming_it_and_the_flag_that_skips_it(tmp_path):
    def probe(url: str, project: str) -> str | None:
        return "no answer within 10 s" if "pytorch" in url else None

    pip = FakePip()
    with pytest.raises(WheelhouseError) as e:
        wheelhouse.build(COMBO, tmp_path / "wh", version="3.12", pip=pip, probe=probe)
    assert pip.calls == [] and not (tmp_path / "wh").exists()
    assert str(e.value).startswith("the torch index https://download.pytorch.org/whl/cu130 is unreachable (no answer "
                                   "within 10 s)")
    assert '--torch-index ""' in str(e.value) and "pypi.org" not in str(e.value)
    with pytest.raises(WheelhouseError, match=r"^the main index http://mirror/simple is unreachable \(down\).*"
                                              r"--index-url URL"):
        wheelhouse.build(COMBO, tmp_path / "wh", version="3.12", pip=pip, index_url="http://mirror/simple",
                         probe=lambda url, project: "down" if "mirror" in url else None)
    assert pip.calls == []


def test_a_probe_that_never_answers_is_cut_off_at_the_timeout():
    hold = threading.Event()

    def stuck(url: str, project: str) -> None:
        hold.wait()  # as a name lookup no socket timeout bounds

    index = wheelhouse.Index("http://stuck/simple", "the main index", "--index-url URL", "torch")
    try:
        with pytest.raises(WheelhouseError, match=r"http://stuck/simple is unreachable \(no answer within 0.2 s\)"):
            wheelhouse.check_indexes([index], stuck, timeout=0.2)
    finally:
        hold.set()


def _closed_port() -> tuple[socket.socket, int]:
    """A port on 127.0.0.1 that refuses connections: bound (no one else takes it), never listening."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


@pytest.fixture
def local_index():
    """A tiny index on 127.0.0.1 in a thread: /simple/torch/ answers 200, other projects 404, /broken/ 503;
    its `seen` lists the paths asked for."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.path)
            code = 200 if self.path == "/simple/torch/" else 503 if self.path.startswith("/broken/") else 404
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"<html></html>")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.seen = seen
    yield server
    server.shutdown()
    server.server_close()


def test_the_real_probe_on_a_local_index_and_a_closed_port(local_index, tmp_path):
    base = f"http://127.0.0.1:{local_index.server_address[1]}"
    assert PROBE(f"{base}/simple", "torch") is None
    assert PROBE(f"{base}/simple/", "Flashinfer_Python") is None  # a 404: the index is there
    assert local_index.seen == ["/simple/torch/", "/simple/flashinfer-python/"]  # one GET each, the name normalized
    assert PROBE(f"{base}/broken", "torch") == f"HTTP 503 for {base}/broken/torch/"
    sock, port = _closed_port()
    try:
        why = PROBE(f"http://127.0.0.1:{port}/simple", "torch", timeout=5)
    finally:
        sock.close()
    assert why is not None and "refused" in why.lower()
    assert PROBE(tmp_path.as_uri(), "torch") is None
    assert PROBE((tmp_path / "absent").as_uri(), "torch") == f"{tmp_path / 'absent'} does not exist"


def test_the_command_stops_at_once_on_an_unreachable_index(tmp_path, monkeypatch, capsys, local_index):
    """Through the real probe: a closed port as the main index, a local index as the torch index."""
    monkeypatch.setattr(wheelhouse, "probe_index", PROBE)
    pip = FakePip()
    monkeypatch.setattr(wheelhouse, "pip_runner", lambda python: pip)
    sock, port = _closed_port()
    closed, reachable = f"http://127.0.0.1:{port}/simple", f"http://127.0.0.1:{local_index.server_address[1]}/simple"
    args = ["wheelhouse", "build", "--combination", COMBO.id, "--out", str(tmp_path / "wh"), "--constraints",
            str(ROOT / "constraints")]
    try:
        assert main([*args, "--index-url", closed, "--torch-index", reachable]) == 2
    finally:
        sock.close()
    err = capsys.readouterr().err
    assert f"error: the main index {closed} is unreachable" in err and "--index-url URL" in err
    assert "torch index" not in err and pip.calls == []
    assert main([*args, "--index-url", reachable, "--torch-index", ""]) == 0  # both answer: the build goes on
    assert len(pip.calls) == 2 and _options(pip.calls[0], "--index-url") == [reachable]


def test_the_configured_main_index_is_what_pip_of_that_python_says(tmp_path, monkeypatch):
    monkeypatch.undo()  # the real configured_index
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport sys\nassert sys.argv[1:] == ['-m', 'pip', 'config', 'list']\n"
                    "print(\"global.index-url='https://global/simple'\")\n"
                    "print(\"global.extra-index-url='https://extra/simple'\")\n"
                    "print(\"download.index-url='https://download/simple'\")\n")
    fake.chmod(0o755)
    assert wheelhouse.configured_index(str(fake)) == "https://download/simple"
    fake.write_text(f"#!{sys.executable}\nprint(\"global.extra-index-url='https://extra/simple'\")\n")
    assert wheelhouse.configured_index(str(fake)) is None  # PyPI
    monkeypatch.setenv("PIP_INDEX_URL", "https://env/simple")
    assert wheelhouse.configured_index(str(fake)) == "https://env/simple"
    monkeypatch.delenv("PIP_INDEX_URL")
    assert wheelhouse.configured_index(str(tmp_path / "no-such-python")) is None


def test_the_target_python_defaults_to_the_resolving_interpreters(tmp_path, monkeypatch):
    """`--python` names another interpreter: without `--python-version` the wheels are for its Python, not for
    the one running the command (a 3.11 machine building for a 3.12 node with --python python3.12)."""
    fake = tmp_path / "python3.99"
    fake.write_text(f"#!{sys.executable}\nprint('3.99')\n")
    fake.chmod(0o755)
    assert wheelhouse.interpreter_version(str(fake)) == "3.99"
    assert wheelhouse.interpreter_version(sys.executable) == "{}.{}".format(*sys.version_info[:2])
    fake.write_text(f"#!{sys.executable}\nprint('not a version')\n")
    with pytest.raises(WheelhouseError, match="give --python-version"):
        wheelhouse.interpreter_version(str(fake))
    with pytest.raises(WheelhouseError, match="cannot run"):
        wheelhouse.interpreter_version(str(tmp_path / "no-such-python"))
    seen = {}
    monkeypatch.setattr(wheelhouse, "configured_index", lambda python: None)
    monkeypatch.setattr(wheelhouse, "build", lambda combo, out, *, version, **kw: seen.setdefault("version", version)
                        and {"wheels": [], "python_version": version, "platforms": [], "left_out": [],
                                                                  "notes": []})
    fake.write_text(f"#!{sys.executable}\nprint('3.12')\n")
    assert main(["wheelhouse", "build", "--combination", COMBO.id, "--out", str(tmp_path / "wh"), "--python", str(fake),
                 "--constraints", str(ROOT / "constraints")]) == 0
    assert seen["version"] == "3.12"
