"""sweep/jitarchive.py: a combination's built JIT modules packed on one machine and unpacked on another, refused
whole when they are for another FlashInfer, CUDA or arch, damaged, or would land outside the destination. A fake
module tree stands in for a JIT cache; the GPU and the environment's versions are injected."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from flashinfer_trace.cli import main
from flashinfer_trace.sweep import jitarchive, prebuilt
from flashinfer_trace.sweep.combos import load_combination
from flashinfer_trace.sweep.jitarchive import Build, JitArchiveError

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = str(ROOT / "constraints")
COMBO = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.5.3.toml")
BUILD = Build("0.5.3", "13.0", "sm90")
OPS = f"{COMBO.id}/.cache/flashinfer/0.5.3/90a/cached_ops"


def _module(root: Path, name: str, data: bytes, arch_folder: str = "90a") -> Path:
    so = root / COMBO.id / ".cache" / "flashinfer" / "0.5.3" / arch_folder / "cached_ops" / name / f"{name}.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(data)
    return so


def _cache(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    _module(root, "norm", b"norm library " * 100)
    _module(root, "rope", b"rope library " * 50)
    _module(root, "norm_b", b"another arch", arch_folder="100a")
    return root


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tar.xz", ".tbz2"])
def test_export_then_import_gives_a_root_the_sessions_load_from(tmp_path, suffix):
    root, archive, dest = _cache(tmp_path), tmp_path / f"mods{suffix}", tmp_path / "dest"
    manifest = jitarchive.export(root, COMBO, archive, BUILD)
    assert (manifest["combination"], manifest["flashinfer"], manifest["cuda"], manifest["arch"]) == (
        COMBO.id, "0.5.3", "13.0", "sm90")
    assert manifest["constraints_sha256"] == COMBO.sha256 and manifest["arch_folder"] == "90a"
    norm = root / OPS / "norm" / "norm.so"
    assert manifest["modules"][0] == {"name": "norm", "path": f"{OPS}/norm/norm.so", "size": norm.stat().st_size,
                                      "sha256": hashlib.sha256(norm.read_bytes()).hexdigest()}
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert names == ["jit-archive.json", f"{OPS}/norm/norm.so", f"{OPS}/rope/rope.so"]
        assert all(m.uid == 0 and m.uname == "" for m in tar.getmembers())
    got, placed = jitarchive.import_archive(archive, dest, BUILD, COMBO.id)
    assert got == manifest and sorted(placed) == ["norm", "rope"]
    assert _files(dest) == {k: v for k, v in _files(root).items() if "/90a/" in k}
    assert prebuilt.find(dest, COMBO.id, "0.5.3", "sm90") == placed  # what --jit-modules DEST takes
    assert not list(tmp_path.glob(".mods*.part"))


@pytest.mark.parametrize(("expect", "combination", "message"), [
    (Build("0.6.6", "13.0", "sm90"), None, r"FlashInfer 0.5.3 in the archive, 0.6.6 here"),
    (Build("0.5.3", "12.8", "sm90"), None, r"CUDA 13.0 in the archive, 12.8 here"),
    (Build("0.5.3", "13.0", "sm100"), None, r"arch sm90 in the archive, sm100 here"),
    (BUILD, "cu130-torch2.11-fi0.6.6", r"modules of cu130-torch2.11-fi0.5.3, not cu130-torch2.11-fi0.6.6"),
])
def test_modules_for_another_target_are_refused_before_anything_is_written(tmp_path, expect, combination, message):
    archive = tmp_path / "mods.tar.gz"
    jitarchive.export(_cache(tmp_path), COMBO, archive, BUILD)
    with pytest.raises(JitArchiveError, match=message):
        jitarchive.import_archive(archive, tmp_path / "new" / "dest", expect, combination)
    assert not (tmp_path / "new" / "dest").exists()


def _archive(path: Path, manifest: dict, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tar:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("jit-archive.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for info, body in members:
            if body is not None:
                info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def _manifest_of(tmp_path: Path) -> dict:
    return jitarchive.export(_cache(tmp_path), COMBO, tmp_path / "good.tar", BUILD)


def test_a_damaged_member_is_refused_and_the_destination_kept_as_it_was(tmp_path):
    manifest = _manifest_of(tmp_path)
    norm = (tmp_path / "cache" / OPS / "norm" / "norm.so").read_bytes()
    rope = (tmp_path / "cache" / OPS / "rope" / "rope.so").read_bytes()
    flipped = bytes([norm[0] ^ 1]) + norm[1:]
    archive = _archive(tmp_path / "bad.tar", manifest, [(_member(f"{OPS}/rope/rope.so"), rope),
                                                        (_member(f"{OPS}/norm/norm.so"), flipped)])
    dest = tmp_path / "dest"
    (dest / OPS / "rope").mkdir(parents=True)
    (dest / OPS / "rope" / "rope.so").write_bytes(b"an earlier import")
    with pytest.raises(JitArchiveError, match=rf"{OPS}/norm/norm.so: sha256 [0-9a-f]{{64}}, the manifest says "
                                              rf"{manifest['modules'][0]['sha256']}: damaged, nothing written"):
        jitarchive.import_archive(archive, dest, BUILD)
    short = _archive(tmp_path / "short.tar", manifest, [(_member(f"{OPS}/norm/norm.so"), norm[:-1])])
    with pytest.raises(JitArchiveError, match=rf"norm.so: {len(norm) - 1} bytes, the manifest says {len(norm)}"):
        jitarchive.import_archive(short, dest, BUILD)
    assert _files(dest) == {f"{OPS}/rope/rope.so": b"an earlier import"}  # rope checked fine, yet not moved
    assert [p.name for p in dest.iterdir()] == [COMBO.id]  # the staging folder is gone


@pytest.mark.parametrize(("member", "body", "message"), [
    (_member("../evil.so"), b"x", r"member '../evil.so' is not a plain relative path"),
    (_member(f"{OPS}/../../../../../evil.so"), b"x", r"is not a plain relative path"),
    (_member("/tmp/evil.so"), b"x", r"member '/tmp/evil.so' has an absolute path"),
    (_member(f"{OPS}/norm/norm.so", tarfile.SYMTYPE, "/etc/passwd"), None, r"is a link \(to '/etc/passwd'\)"),
    (_member(f"{OPS}/norm/norm.so", tarfile.LNKTYPE, "jit-archive.json"), None, r"is a link"),
    (_member(f"{OPS}/norm/norm.so", tarfile.FIFOTYPE), None, r"is not a regular file"),
    (_member(f"{OPS}/extra/extra.so"), b"x", r"member '.*/extra/extra.so' is not a module its manifest lists"),
])
def test_a_member_that_could_land_outside_or_is_not_listed_is_refused(tmp_path, member, body, message):
    manifest = _manifest_of(tmp_path)
    archive = _archive(tmp_path / "bad.tar", manifest, [(member, body)])
    with pytest.raises(JitArchiveError, match=message):
        jitarchive.import_archive(archive, tmp_path / "a" / "dest", BUILD)
    assert not (tmp_path / "a").exists() and not (tmp_path / "evil.so").exists()


def test_an_archive_that_is_not_one_of_export_is_refused(tmp_path):
    manifest = _manifest_of(tmp_path)
    rope = (tmp_path / "cache" / OPS / "rope" / "rope.so").read_bytes()
    dest = tmp_path / "dest"
    missing = _archive(tmp_path / "m.tar", manifest, [(_member(f"{OPS}/rope/rope.so"), rope)])
    with pytest.raises(JitArchiveError, match=r"1 listed module\(s\) missing \(.*norm/norm.so\): nothing written"):
        jitarchive.import_archive(missing, dest, BUILD)
    twice = _archive(tmp_path / "t.tar", manifest, [(_member(f"{OPS}/rope/rope.so"), rope)] * 2)
    with pytest.raises(JitArchiveError, match=r"member '.*/rope/rope.so' appears twice: refused, nothing written"):
        jitarchive.import_archive(twice, dest, BUILD)
    escaping = {**manifest, "modules": [{**manifest["modules"][0], "path": "../../norm.so"}]}
    with pytest.raises(JitArchiveError, match=r"module norm: path '../../norm.so' is not cu130"):
        jitarchive.import_archive(_archive(tmp_path / "e.tar", escaping, []), dest, BUILD)
    for bad, message in (({**manifest, "arch": "sm91"}, r"arch 'sm91': expected one of"),
                         ({**manifest, "cuda": "thirteen"}, r"cuda 'thirteen': expected a CUDA version"),
                         ({**manifest, "kind": "other"}, r"not a JIT module manifest")):
        with pytest.raises(JitArchiveError, match=message):
            jitarchive.import_archive(_archive(tmp_path / "b.tar", bad, []), dest, BUILD)
    with tarfile.open(tmp_path / "late.tar", "w") as tar:
        tar.add(tmp_path / "cache" / OPS / "rope" / "rope.so", arcname="rope.so")
    with pytest.raises(JitArchiveError, match=r"its first member is not jit-archive.json"):
        jitarchive.import_archive(tmp_path / "late.tar", dest, BUILD)
    with tarfile.open(tmp_path / "good.tar") as tar:
        cut = tar.getmembers()[-1].offset_data + 100  # inside the last module
    (tmp_path / "cut.tar").write_bytes((tmp_path / "good.tar").read_bytes()[:cut])
    with pytest.raises(JitArchiveError, match=r"cut.tar: unreadable or damaged \(.*\); nothing written"):
        jitarchive.import_archive(tmp_path / "cut.tar", dest, BUILD)
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 64)
    with pytest.raises(JitArchiveError, match=r"junk.tar: not a tar archive"):
        jitarchive.import_archive(tmp_path / "junk.tar", dest, BUILD)
    assert not dest.exists()


def test_export_says_what_is_missing(tmp_path):
    root = _cache(tmp_path)
    with pytest.raises(JitArchiveError, match=r"mods.zip: the name must end in .tar, .tar.gz"):
        jitarchive.export(root, COMBO, tmp_path / "mods.zip", BUILD)
    with pytest.raises(JitArchiveError, match=r"no built modules in .*/0.5.3/80/cached_ops \(there are of sm90, "
                                              r"sm100: --arch\): build them first"):
        jitarchive.export(root, COMBO, tmp_path / "mods.tar", Build("0.5.3", "13.0", "sm80"))
    with pytest.raises(JitArchiveError, match=r"pins flashinfer-python 0.5.3, not 0.6.6"):
        jitarchive.export(root, COMBO, tmp_path / "mods.tar", Build("0.6.6", "13.0", "sm90"))
    assert not list(tmp_path.glob("*mods*"))
    assert jitarchive.cuda_of_variant("cu128") == "12.8" and jitarchive.cuda_of_variant("cpu") is None
    assert jitarchive.cuda_version("13.0.2") == "13.0"


def _gpu(monkeypatch, arch: str | None, found: dict | None = None) -> list[str]:
    probed: list[str] = []
    monkeypatch.setattr(jitarchive, "detect_arch", lambda: arch)

    def probe(python: str) -> dict:
        probed.append(python)
        return found or {"flashinfer": None, "cuda": None}

    monkeypatch.setattr(jitarchive, "probe", probe)
    return probed


def test_the_commands(tmp_path, monkeypatch, capsys):
    root, archive, dest = _cache(tmp_path), tmp_path / "mods.tar.xz", tmp_path / "dest"
    _gpu(monkeypatch, None)
    export = ["jit", "export", "--out", str(archive), "--combination", COMBO.id, "--jit-cache", str(root),
              "--constraints", CONSTRAINTS]
    assert main(export) == 2  # no GPU, and the cache has two archs
    assert "has modules of sm90, sm100 for flashinfer 0.5.3: pass --arch" in capsys.readouterr().err
    assert main([*export, "--arch", "sm90"]) == 0
    assert f"exported 2 module(s), 0.0 MiB, of {COMBO.id} (flashinfer 0.5.3, CUDA 13.0, sm90)" in (
        capsys.readouterr().out)
    imp = ["jit", "import", str(archive), "--dest", str(dest), "--constraints", CONSTRAINTS]
    assert main(imp) == 2  # this interpreter has no flashinfer, no combination named
    assert "cannot tell which FlashInfer the modules are for" in capsys.readouterr().err
    assert main([*imp, "--combination", COMBO.id]) == 2
    assert "cannot tell the arch: nvidia-smi finds no GPU here; pass --arch" in capsys.readouterr().err
    _gpu(monkeypatch, "sm90")
    assert main([*imp, "--combination", COMBO.id, "--cuda", "13"]) == 2
    assert "--cuda '13': expected a CUDA version MAJOR.MINOR" in capsys.readouterr().err
    assert main([*imp, "--combination", "cu130-torch2.11-fi0.6.6"]) == 2
    assert "modules of cu130-torch2.11-fi0.5.3, not cu130-torch2.11-fi0.6.6: nothing written" in (
        capsys.readouterr().err)
    assert main([*imp, "--combination", COMBO.id, "--flashinfer-version", "0.6.6"]) == 2
    assert "FlashInfer 0.5.3 in the archive, 0.6.6 here" in capsys.readouterr().err
    assert not dest.exists()
    assert main([*imp, "--combination", COMBO.id]) == 0
    assert f"sessions load them with --jit-modules {dest}" in capsys.readouterr().out
    assert sorted(prebuilt.find(dest, COMBO.id, "0.5.3", "sm90")) == ["norm", "rope"]


def test_import_places_into_an_interpreters_flashinfer(tmp_path, monkeypatch, capsys):
    archive = tmp_path / "mods.tgz"
    jitarchive.export(_cache(tmp_path), COMBO, archive, BUILD)
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    probed = _gpu(monkeypatch, "sm90", {"flashinfer": "0.5.3", "cuda": "13.0"})
    assert main(["jit", "import", str(archive), "--dest", str(tmp_path / "dest"), "--python", str(python),
                 "--place"]) == 0
    assert probed == [str(python)]
    assert f"placed 2 into {site / 'flashinfer' / 'data' / 'aot'}" in capsys.readouterr().out
    assert (site / "flashinfer" / "data" / "aot" / "rope" / "rope.so").read_bytes() == b"rope library " * 50
    _gpu(monkeypatch, "sm90", {"flashinfer": "0.7.2.post1", "cuda": "13.0"})
    assert main(["jit", "import", str(archive), "--python", str(python), "--place"]) == 2
    assert "--place: flashinfer 0.7.2.post1 finds AOT modules through an index" in capsys.readouterr().err
