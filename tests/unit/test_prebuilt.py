"""sweep/prebuilt.py: another machine's JIT modules go into FlashInfer's AOT folder, only where they belong."""

import sys
from pathlib import Path

import pytest

from flashinfer_trace.sweep import prebuilt
from flashinfer_trace.sweep.combos import load_combination
from flashinfer_trace.sweep.install import parse_session_args

ROOT = Path(__file__).resolve().parents[2]
COMBO = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.5.3.toml")


def _module(root: Path, combination: str, version: str, arch: str, name: str, data: bytes) -> Path:
    so = root / combination / ".cache" / "flashinfer" / version / arch / "cached_ops" / name / f"{name}.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(data)
    return so


def _package(tmp_path: Path) -> tuple[str, Path]:
    """A python whose import path holds a stand-in flashinfer package (found without importing it)."""
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper), site / "flashinfer"


def test_only_the_same_combination_version_and_arch_are_placed(tmp_path):
    root = tmp_path / "carried"
    _module(root, COMBO.id, "0.5.3", "90a", "norm", b"norm-0.5.3-sm90")
    _module(root, COMBO.id, "0.5.3", "90a", "rope", b"rope-0.5.3-sm90")
    _module(root, COMBO.id, "0.5.3", "100a", "norm_b", b"other arch")
    _module(root, COMBO.id, "0.6.6", "90a", "sampling", b"other release")
    _module(root, "cu130-torch2.11-fi0.6.6", "0.5.3", "90a", "gemm_sm90", b"other combination")
    (root / COMBO.id / ".cache" / "flashinfer" / "0.5.3" / "90a" / "cached_ops" / "half_built").mkdir()  # no .so
    assert prebuilt.arch_folder("sm90") == "90a" and prebuilt.arch_folder("sm80") == "80"
    assert set(prebuilt.find(root, COMBO.id, "0.5.3", "sm90")) == {"norm", "rope"}
    python, package = _package(tmp_path)
    line = prebuilt.carry_in(root, COMBO, python, "sm90")
    assert line.startswith("placed 2 prebuilt JIT modules of flashinfer 0.5.3 (90a)") and "norm, rope" in line
    aot = package / "data" / "aot"
    assert sorted(p.name for p in aot.iterdir()) == ["norm", "rope"]
    assert (aot / "norm" / "norm.so").read_bytes() == b"norm-0.5.3-sm90"
    assert not list(aot.rglob("*.part"))


def test_a_changed_library_replaces_the_placed_one_and_an_empty_root_says_so(tmp_path):
    root = tmp_path / "carried"
    so = _module(root, COMBO.id, "0.5.3", "90a", "norm", b"first build")
    python, package = _package(tmp_path)
    prebuilt.carry_in(root, COMBO, python, "sm90")
    so.write_bytes(b"second build")
    prebuilt.carry_in(root, COMBO, python, "sm90")
    assert (package / "data" / "aot" / "norm" / "norm.so").read_bytes() == b"second build"
    line = prebuilt.carry_in(tmp_path / "empty", COMBO, python, "sm90")
    assert "no modules of cu130-torch2.11-fi0.5.3 (flashinfer 0.5.3, 90a)" in line and "compiles here" in line
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "python").write_text(f"#!/bin/sh\nexec {sys.executable} -I \"$@\"\n")
    (nothing / "python").chmod(0o755)
    assert "finds no flashinfer package" in prebuilt.carry_in(root, COMBO, str(nothing / "python"), "sm90")


def test_the_session_flag_needs_a_folder(tmp_path):
    opts, rest = parse_session_args(["--jit-modules", str(tmp_path), "-k", "norm"], environ={})
    assert opts.jit_modules == tmp_path and rest == ["-k", "norm"]
    with pytest.raises(ValueError, match="--jit-modules .*: not a folder"):
        parse_session_args(["--jit-modules", str(tmp_path / "missing")], environ={})


def test_a_release_with_an_artifact_index_gets_nothing_and_a_failed_copy_is_a_line_not_a_crash(tmp_path, monkeypatch):
    newer = load_combination(ROOT / "constraints" / "cu130-torch2.11-fi0.7.2.post1.toml")
    root = tmp_path / "carried"
    _module(root, newer.id, "0.7.2.post1", "90a", "norm", b"norm")
    python, package = _package(tmp_path)
    line = prebuilt.carry_in(root, newer, python, "sm90")
    assert "index of artifacts" in line and "nothing placed" in line and not (package / "data").exists()
    _module(root, COMBO.id, "0.5.3", "90a", "norm", b"norm")

    def full(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prebuilt.shutil, "copyfile", full)
    line = prebuilt.carry_in(root, COMBO, python, "sm90")
    assert line.startswith("--jit-modules") and "No space left on device" in line and "compiles here" in line
