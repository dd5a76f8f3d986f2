"""constraints/: every combination file, the loader's errors, session flags and torch checks."""

import re
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from flashinfer_trace.sweep.combos import (
    ALIASES,
    CombinationError,
    arch_env,
    arch_of,
    default_combination,
    load_combination,
    load_combinations,
)
from flashinfer_trace.sweep.install import InstallOptions, parse_session_args, torch_differences

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "constraints").glob("*.toml"))
COMBO_FILES = [p for p in FILES if p.name != "known-issues.toml"]


@pytest.mark.parametrize("path", COMBO_FILES, ids=lambda p: p.stem)
def test_every_combination_file_is_pinned_and_complete(path):
    c = load_combination(path)
    text = path.read_text()
    assert text.lstrip().startswith("#"), "each file starts with a comment saying what the combination is"
    assert c.pins["torch"] and all(str(v) == str(v.public) for v in c.pins.values())  # exact, no local labels
    assert all(r.count("==") == 1 for r in c.requirements())
    assert c.sha256 and len(c.sha256) == 64
    if c.gpu:
        assert c.archs and c.torch_variant.startswith(f"cu{c.cuda}")
        assert c.pin("flashinfer-python") is not None, "a GPU combination pins flashinfer"
    else:
        assert c.torch_variant == "cpu" and not c.archs
    if c.cuda == "12" and c.pin("cuda-python"):
        assert c.pin("cuda-python").major == 12, "cuda-python>=12 resolves to 13.x bindings: pin below 13 on CUDA 12"
    if c.sglang:  # sglang pins exact torch and flashinfer: the combination follows them
        assert c.pin("sglang-kernel") is not None


def test_the_required_combinations_exist():
    combos = {c.id: c for c in load_combinations(ROOT / "constraints")}
    by = {(c.cuda, str(c.torch.release[:2]), str(c.flashinfer) if c.flashinfer else None, str(c.sglang or ""))
          for c in combos.values()}
    assert ("none", "(2, 13)", None, "") in by
    assert ("12", "(2, 9)", "0.5.3", "") in by and ("12", "(2, 9)", "0.6.6", "") in by
    assert ("13", "(2, 11)", "0.6.6", "") in by and ("13", "(2, 11)", "0.7.2.post1", "") in by
    assert ("12", "(2, 9)", "0.6.7.post3", "0.5.10.post1") in by
    assert ("13", "(2, 14)", "0.7.2", "0.5.23") in by
    for alias in ALIASES:
        assert default_combination(list(combos.values()), alias) is not None, alias


def test_flashinfer_04_is_recorded_as_uninstallable():
    combos = load_combinations(ROOT / "constraints")
    old = [c for c in combos if c.flashinfer and c.flashinfer.release[:2] == (0, 4)]
    assert old and all(not c.installable and "tvm-ffi" in c.reason for c in old)


def write(tmp_path, text, name="cu130-torch2.11-fi0.6.6"):
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return p


GOOD = """
[combination]
cuda = "13"
torch_variant = "cu130"
archs = ["sm90"]
python = ">=3.10"

[pins]
torch = "2.11.0"
flashinfer-python = "0.6.6"
"""


@pytest.mark.parametrize("change,field", [
    (lambda s: s.replace('torch = "2.11.0"', 'torch = ">=2.11"'), "pins.torch"),
    (lambda s: s.replace('cuda = "13"', 'cuda = "11"'), "combination.cuda"),
    (lambda s: s.replace('torch_variant = "cu130"', 'torch_variant = "cu128"'), "combination.torch_variant"),
    (lambda s: s.replace('archs = ["sm90"]', 'archs = ["sm91"]'), "combination.archs"),
    (lambda s: s.replace('archs = ["sm90"]', "archs = []"), "combination.archs"),
    (lambda s: s.replace('python = ">=3.10"', 'python = "three"'), "combination.python"),
    (lambda s: s.replace('python = ">=3.10"\n', ""), "combination.python"),
    (lambda s: s.replace('python = ">=3.10"', 'python = ">=3.10"\nstatus = "broken"'), "combination.status"),
    (lambda s: s.replace('python = ">=3.10"', 'python = ">=3.10"\nstatus = "uninstallable"'), "combination.reason"),
    (lambda s: s.replace('python = ">=3.10"', 'python = ">=3.10"\ncolour = "red"'), "unknown field"),
    (lambda s: s.replace('torch = "2.11.0"\n', ""), "pins.torch"),
    (lambda s: s.replace('flashinfer-python = "0.6.6"', 'flashinfer-python = 6'), "pins.flashinfer-python"),
    (lambda s: s + "[extra]\n", "unknown table"),
    (lambda s: s.replace("[pins]", "[pins"), "not valid TOML"),
])
def test_loader_errors_name_the_file_and_field(tmp_path, change, field):
    path = write(tmp_path, change(GOOD))
    with pytest.raises(CombinationError) as e:
        load_combination(path)
    assert str(path) in str(e.value) and field in str(e.value)


def test_two_defaults_for_one_alias_are_refused(tmp_path):
    text = GOOD.replace('python = ">=3.10"', 'python = ">=3.10"\ndefault_for = ["cuda13"]')
    write(tmp_path, text, "a")
    write(tmp_path, text, "b")
    with pytest.raises(CombinationError, match="already the default"):
        load_combinations(tmp_path)


def test_good_file_and_arch_helpers(tmp_path):
    c = load_combination(write(tmp_path, GOOD))
    assert c.id == "cu130-torch2.11-fi0.6.6" and c.label == "CUDA 13 / torch 2.11.0 / flashinfer 0.6.6"
    assert c.constraints_text() == "torch==2.11.0\nflashinfer-python==0.6.6\n"
    assert c.pin("Flashinfer_Python") == c.pins[canonicalize_name("flashinfer-python")]
    assert arch_env("sm90") == {"FLASHINFER_CUDA_ARCH_LIST": "9.0a", "TORCH_CUDA_ARCH_LIST": "9.0"}
    assert arch_env("sm89") == {"FLASHINFER_CUDA_ARCH_LIST": "8.9", "TORCH_CUDA_ARCH_LIST": "8.9"}
    assert arch_env("sm100")["FLASHINFER_CUDA_ARCH_LIST"] == "10.0a"
    assert arch_of("9.0") == "sm90" and arch_of((12, 0)) == "sm120"


def test_session_flags_are_split_from_pytest_args(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    opts, rest = parse_session_args(["--wheelhouse", str(wh), "-k", "rmsnorm", "--preinstalled-torch",
                                     "--jobs=3", "-x"], environ={})
    assert opts.wheelhouse == wh and opts.preinstalled_torch == "python3" and opts.jobs == 3
    assert rest == ["-k", "rmsnorm", "-x"] and opts.mode == "preinstalled-torch+offline"
    opts, rest = parse_session_args(["--preinstalled-torch", "/opt/torch/.venv/bin/python3", "-q"], environ={})
    assert opts.preinstalled_torch == "/opt/torch/.venv/bin/python3" and rest == ["-q"]
    opts, _ = parse_session_args([], environ={"FLASHINFER_TRACE_WHEELHOUSE": str(wh),
                                              "FLASHINFER_TRACE_TORCH_INDEX": "https://example/whl"})
    assert opts.wheelhouse == wh and opts.torch_index == "https://example/whl" and opts.mode == "offline"
    assert InstallOptions().mode == "fresh"
    with pytest.raises(ValueError, match="not a folder"):
        parse_session_args(["--wheelhouse", str(tmp_path / "missing")], environ={})
    # one set of arguments for every session of a sweep: each combination its own wheelhouse
    (tmp_path / "wh" / "cu130-x").mkdir(parents=True)
    opts, _ = parse_session_args(["--wheelhouse", str(tmp_path / "wh" / "{combination}"), "--extra-wheels",
                                  str(tmp_path / "wh" / "{combination}")], environ={}, combination="cu130-x")
    assert opts.wheelhouse == opts.extra_wheels == tmp_path / "wh" / "cu130-x"
    with pytest.raises(ValueError, match="not a folder"):
        parse_session_args(["--wheelhouse", str(tmp_path / "wh" / "{combination}")], environ={}, combination="c2")
    with pytest.raises(ValueError, match="outside a combination"):
        parse_session_args(["--wheelhouse", str(tmp_path / "wh" / "{combination}")], environ={})
    with pytest.raises(ValueError, match="needs a value"):
        parse_session_args(["--jobs"], environ={})


def test_preinstalled_torch_differences_are_recorded(tmp_path):
    c = load_combination(write(tmp_path, GOOD))
    assert torch_differences(c, {"version": "2.11.0+cu130", "cuda": "13.0"}) == []
    assert torch_differences(c, {"version": "2.9.1+cu128", "cuda": "12.8"}) == [
        "torch 2.9.1 instead of 2.11.0", "torch variant cu128 instead of cu130"]
    assert torch_differences(c, {"version": "2.11.0", "cuda": None}) == ["torch variant cpu instead of cu130"]


def _nightly_cpu_python() -> str:
    """The Python the nightly workflow's CPU job sets up (the `cpu:` job's setup-python)."""
    text = (ROOT / ".github" / "workflows" / "nightly.yml").read_text()
    job = text.split("\n  cpu:\n", 1)[1].split("\n  aggregate:\n", 1)[0]
    return job.split('python-version: "', 1)[1].split('"', 1)[0]


def test_the_torch_axis_has_one_cpu_combination_per_torch_minor():
    """cpu-torch2.8 .. cpu-torch2.15: one per minor, each its newest patch as of writing; Python ranges where
    that torch has wheels (2.8 none for 3.14, 2.15 none for 3.10); each accepts the nightly CPU job's Python."""
    cpu = {c.torch.release[:2]: c for c in load_combinations(ROOT / "constraints") if not c.gpu}
    assert sorted(cpu) == [(2, minor) for minor in range(8, 16)]
    assert len([c for c in load_combinations(ROOT / "constraints") if not c.gpu]) == len(cpu), "one per minor"
    assert {k: str(c.torch) for k, c in cpu.items() if c.torch.micro} == {(2, 9): "2.9.1", (2, 12): "2.12.1",
                                                                         (2, 14): "2.14.1"}
    assert all(c.id == f"cpu-torch{c.torch.major}.{c.torch.minor}" and c.nightly for c in cpu.values())
    assert [c.id for c in cpu.values() if c.default_for] == ["cpu-torch2.13"] and cpu[(2, 13)].default_for == ("cpu",)
    assert "3.13.1" in cpu[(2, 8)].python and "3.14.0" not in cpu[(2, 8)].python
    assert "3.10.12" not in cpu[(2, 15)].python and "3.14.0" in cpu[(2, 15)].python
    python = _nightly_cpu_python() + ".0"
    assert all(python in c.python for c in cpu.values()), python


def test_the_supported_torch_floor_is_the_oldest_torch_the_axis_runs():
    """pyproject's `torch>=X` is a claim; the torch axis is what checks it, so its floor is the axis' oldest minor."""
    floor = re.search(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    oldest = min(c.torch for c in load_combinations(ROOT / "constraints") if not c.gpu)
    assert floor == f"{oldest.major}.{oldest.minor}", (floor, str(oldest))


def test_tags_must_be_plain_and_not_the_noxfiles_own(tmp_path):
    body = ('# t\n[combination]\ncuda = "13"\ntorch_variant = "cu130"\narchs = ["sm90"]\npython = ">=3.10"\n'
            'tags = {tags}\n[pins]\ntorch = "2.11.0"\nflashinfer-python = "0.6.9"\n')
    good = tmp_path / "cu130-a.toml"
    good.write_text(body.format(tags='["release-axis"]'))
    assert load_combination(good).tags == ("release-axis",)
    for tags, message in (('["nightly"]', "noxfile's own"), ('["Release Axis"]', "lower-case"), ('"x"', "list")):
        bad = tmp_path / "cu130-b.toml"
        bad.write_text(body.format(tags=tags))
        with pytest.raises(CombinationError, match=f"combination.tags.*{message}"):
            load_combination(bad)
