"""`flashinfer-trace combination new` (sweep/newcombo.py) against a stand-in index: a folder of tiny wheels whose
METADATA the test writes, read by the real pip with --isolated --no-index --find-links (never the network)."""

import zipfile
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from flashinfer_trace.cli import main as cli_main
from flashinfer_trace.sweep import newcombo
from flashinfer_trace.sweep.combos import load_combination


def wheel(folder: Path, name: str, version: str, requires=(), extras=(), requires_python=None):
    """A py3-none-any wheel holding only its dist-info: what pip reads of a release."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Python: {requires_python}"] if requires_python else []
    meta += [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", "\n".join(meta) + "\n")
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                              "Tag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")


@pytest.fixture
def index(tmp_path):
    d = tmp_path / "index"
    d.mkdir()
    wheel(d, "flashinfer-python", "0.6.9", ["apache-tvm-ffi!=0.1.8,<0.2,>=0.1.6", "nvidia-cutlass-dsl>=4.4.2", "torch",
                                           "einops", 'nvidia-cutlass-dsl[cu13]>=4.4.2; extra == "cu13"',
                                           'cuda-python>=13.0; extra == "nvep"'], ["cu12", "cu13", "nvep"], ">=3.10")
    wheel(d, "flashinfer-python", "0.9.0", ["torch>=2.12", "apache-tvm-ffi"])  # rules torch 2.11 out
    wheel(d, "flashinfer-python", "0.9.1", ["apache-tvm-ffi"], ["cu12"])  # CUDA 12 only
    for v in ("0.1.6", "0.1.7", "0.1.8", "0.2.0"):
        wheel(d, "apache-tvm-ffi", v)
    for v in ("4.4.2", "4.5.0", "4.6.0rc1"):
        wheel(d, "nvidia-cutlass-dsl", v, [f"nvidia-cutlass-dsl-libs-base=={v}", f'nvidia-cutlass-dsl-libs-cu13=={v}; '
                                              'extra == "cu13"'], ["cu13"])
        wheel(d, "nvidia-cutlass-dsl-libs-base", v, ["cuda-bindings>=12.8", "typing-extensions"])
        wheel(d, "nvidia-cutlass-dsl-libs-cu13", v)
    for v in ("13.0.1", "13.1.0"):
        wheel(d, "cupti-python", v, ["cuda-bindings~=13.0"])
    for v in ("12.9.0", "13.0.2", "13.0.3", "13.1.1"):
        wheel(d, "cuda-bindings", v)
    wheel(d, "sglang", "0.5.17", ["torch==2.11.0", "flashinfer-python==0.6.9", "sglang-kernel==0.4.5",
                                  "apache-tvm-ffi==0.1.6", "helion==1.4", "uvicorn"])
    wheel(d, "sglang-kernel", "0.4.5")
    return d


def config(tmp_path, **kw):
    return newcombo.NewCombinationConfig(**{"flashinfer": "0.6.9", "torch": "2.11.0", "cuda": "13",
                                            "out": tmp_path / "constraints", "tags": ("release-axis",), **kw})


def pip(index):
    return newcombo.pip_runner(isolated=True, find_links=(str(index),))


def test_newest_takes_the_newest_final_release_in_the_specifier():
    vs = [Version(v) for v in ("4.4.2", "4.5.0", "4.6.0rc1")]
    assert newcombo.newest(SpecifierSet(">=4.4.2"), vs) == Version("4.5.0")
    assert newcombo.newest(SpecifierSet(">=4.6.0a0"), vs) == Version("4.6.0rc1")  # no final one: the pre-release
    assert newcombo.newest(SpecifierSet(">=5"), vs) is None


def test_a_release_is_pinned_from_its_own_metadata(tmp_path, index):
    path, plan = newcombo.write(config(tmp_path), pip(index), "flashinfer-trace combination new ...")
    assert path == tmp_path / "constraints" / "cu130-torch2.11-fi0.6.9.toml"
    c = load_combination(path)
    pins = {k: str(v) for k, v in c.pins.items()}
    assert pins == {"torch": "2.11.0", "flashinfer-python": "0.6.9",
                    "apache-tvm-ffi": "0.1.7",  # != 0.1.8, < 0.2: the newest satisfying
                    "nvidia-cutlass-dsl": "4.5.0",  # not the 4.6.0rc1 pre-release
                    "nvidia-cutlass-dsl-libs-base": "4.5.0", "nvidia-cutlass-dsl-libs-cu13": "4.5.0",  # cu13 extra
                    "cuda-bindings": "13.0.3",  # within CUDA 13.0 like the cu130 torch wheel, not 13.1.1
                    "cupti-python": "13.0.1"}  # the bench timer, CUDA 13.0
    assert c.tags == ("release-axis",) and not c.nightly and c.archs == ("sm90",) and c.installable
    text = path.read_text()
    assert "# `flashinfer-trace combination new ...`" in text
    line = next(x for x in text.splitlines() if x.startswith("apache-tvm-ffi"))
    assert "flashinfer-python 0.6.9 requires !=0.1.8,<0.2,>=0.1.6" in line
    assert "einops" not in text  # a requirement the kernels do not need is left to the resolver
    with pytest.raises(newcombo.NewCombinationError, match="exists"):
        newcombo.write(config(tmp_path), pip(index), "x")


def test_a_release_that_rules_out_the_torch_pin_is_refused_or_written_uninstallable(tmp_path, index):
    with pytest.raises(newcombo.ReleaseConflict, match=r"requires torch>=2.12, the pin is 2.11.0"):
        newcombo.write(config(tmp_path, flashinfer="0.9.0"), pip(index), "x")
    assert not (tmp_path / "constraints" / "cu130-torch2.11-fi0.9.0.toml").exists()
    path, plan = newcombo.write(config(tmp_path, flashinfer="0.9.0", uninstallable=True), pip(index), "x")
    c = load_combination(path)
    assert not c.installable and "torch>=2.12" in c.reason and set(c.pins) == {"torch", "flashinfer-python"}
    with pytest.raises(newcombo.ReleaseConflict, match="CUDA extras cu12, not cu13"):
        newcombo.plan(config(tmp_path, flashinfer="0.9.1"), pip(index))


def test_a_release_without_a_wheel_and_bad_inputs_are_named(tmp_path, index):
    with pytest.raises(newcombo.NewCombinationError, match="no wheel of flashinfer-python==0.6.99"):
        newcombo.plan(config(tmp_path, flashinfer="0.6.99"), pip(index))
    for kw, flag in (({"cuda": "11"}, "--cuda"), ({"archs": ("sm70",)}, "--arch sm70"),
                     ({"flashinfer": "latest"}, "--flashinfer"), ({"python_version": "3.9"}, "--python-version"),
                     ({"tags": ("Release Axis",)}, "--tag"), ({"platform": "Linux x86"}, "--platform")):
        with pytest.raises(newcombo.NewCombinationError, match=flag):
            newcombo.check_config(config(tmp_path, **kw))


def test_sglang_pins_what_its_kernels_import_and_refuses_another_torch(tmp_path, index):
    plan = newcombo.plan(config(tmp_path, sglang="0.5.17"), pip(index))
    pins = {p.name: p.version for p in plan.pins}
    assert pins["sglang"] == "0.5.17" and pins["sglang-kernel"] == "0.4.5"
    assert pins["apache-tvm-ffi"] == "0.1.6"  # sglang's exact pin, inside the release's specifier
    assert "helion" not in pins and "uvicorn" not in pins  # its serving stack is not the kernels'
    with pytest.raises(newcombo.ReleaseConflict, match="sglang 0.5.17 requires torch==2.11.0, the pin is 2.12.0"):
        newcombo.plan(config(tmp_path, sglang="0.5.17", torch="2.12.0"), pip(index))


def test_the_command_writes_the_file(tmp_path, index, capsys):
    out = tmp_path / "c"
    argv = ["combination", "new", "--flashinfer", "0.6.9", "--torch", "2.11.0", "--cuda", "13", "--tag",
            "release-axis", "--out", str(out), "--isolated", "--find-links", str(index)]
    assert cli_main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    text = (out / "cu130-torch2.11-fi0.6.9.toml").read_text()
    assert "combination new --flashinfer 0.6.9 --torch 2.11.0 --cuda 13 --arch sm90 --tag release-axis" in text
    assert cli_main(argv) == 2 and "--force" in capsys.readouterr().err
    assert cli_main([*argv, "--force", "--flashinfer", "0.9.0"]) == 2
    assert "requires torch>=2.12" in capsys.readouterr().err


@pytest.fixture
def frontend_index(tmp_path):
    """nvidia-cudnn-frontend from 1.29 on requires nvidia-cutlass-dsl[cu13]>=4.5.0 here (>=4.6.2 on PyPI), while an
    sglang release pins nvidia-cutlass-dsl exactly to an older one (sglang 0.5.16: 4.6.0)."""
    d = tmp_path / "frontend-index"
    d.mkdir()
    wheel(d, "flashinfer-python", "0.6.9", ["nvidia-cudnn-frontend>=1.13.0", "nvidia-cutlass-dsl>=4.4.2", "torch"])
    wheel(d, "flashinfer-python", "0.6.8", ["nvidia-cudnn-frontend>=1.13.0", "nvidia-cutlass-dsl<4.5", "torch"])
    for v in ("4.4.2", "4.5.0"):
        wheel(d, "nvidia-cutlass-dsl", v, [f'nvidia-cutlass-dsl-libs-cu13=={v}; extra == "cu13"'], ["cu13"])
        wheel(d, "nvidia-cutlass-dsl-libs-cu13", v)
    wheel(d, "nvidia-cudnn-frontend", "1.20.0")
    for v in ("1.29.0", "1.30.0"):
        wheel(d, "nvidia-cudnn-frontend", v, ["nvidia-cutlass-dsl[cu13]>=4.5.0"])
    wheel(d, "cupti-python", "13.0.1")
    wheel(d, "sglang", "0.5.17", ["torch==2.11.0", "flashinfer-python==0.6.9", "nvidia-cutlass-dsl==4.4.2"])
    wheel(d, "flashinfer-python", "0.6.7", ["nvidia-cudnn-frontend>=1.29.0", "nvidia-cutlass-dsl>=4.4.2", "torch"])
    wheel(d, "sglang", "0.5.18", ["torch==2.11.0", "flashinfer-python==0.6.7", "nvidia-cutlass-dsl==4.4.2"])
    return d


def test_a_pin_whose_own_requirements_rule_out_another_pin_steps_down(tmp_path, frontend_index):
    # sglang's exact nvidia-cutlass-dsl: the newest nvidia-cudnn-frontend would make the pins uninstallable
    plan = newcombo.plan(config(tmp_path, sglang="0.5.17"), pip(frontend_index))
    pins = {p.name: p for p in plan.pins}
    assert pins["nvidia-cutlass-dsl"].version == "4.4.2" and pins["nvidia-cudnn-frontend"].version == "1.20.0"
    assert "not 1.30.0, 1.29.0: nvidia-cutlass-dsl[cu13]>=4.5.0, the pin is 4.4.2" in pins["nvidia-cudnn-frontend"].why
    # without sglang the newest frontend stays, and nvidia-cutlass-dsl is chosen to hold its requirement too
    plan = newcombo.plan(config(tmp_path), pip(frontend_index))
    pins = {p.name: p for p in plan.pins}
    assert pins["nvidia-cudnn-frontend"].version == "1.30.0" and pins["nvidia-cutlass-dsl"].version == "4.5.0"
    assert "flashinfer-python 0.6.9 and nvidia-cudnn-frontend 1.30.0 require" in pins["nvidia-cutlass-dsl"].why
    assert pins["nvidia-cutlass-dsl-libs-cu13"].version == "4.5.0"  # the [cu13] extra the frontend asks for


def test_pins_that_cannot_hold_each_other_are_refused_naming_the_requirement(tmp_path, frontend_index):
    with pytest.raises(newcombo.NewCombinationError, match=r"nvidia-cudnn-frontend: each of the newest 2 version\(s\)"
                                                           r".*1.30.0 requires nvidia-cutlass-dsl\[cu13\]>=4.5.0, the "
                                                           r"pin is 4.4.2"):
        newcombo.plan(config(tmp_path, flashinfer="0.6.7", sglang="0.5.18"), pip(frontend_index))
    with pytest.raises(newcombo.NewCombinationError, match=r"nvidia-cutlass-dsl: no version on the index satisfies "
                                                           r"<4.5,>=4.5.0 \(flashinfer-python 0.6.8 and "
                                                           r"nvidia-cudnn-frontend 1.30.0\)"):
        newcombo.plan(config(tmp_path, flashinfer="0.6.8"), pip(frontend_index))


def test_a_pin_made_later_that_rules_out_an_earlier_ones_requirement_is_refused(tmp_path):
    # the frontend's protobuf>=5 is no kernel dependency, so it is not pinned when the frontend is; the DSL's exact
    # protobuf==4.0 is, later: the two cannot be installed together
    d = tmp_path / "index"
    d.mkdir()
    wheel(d, "flashinfer-python", "0.6.9", ["nvidia-cudnn-frontend>=1.0", "nvidia-cutlass-dsl>=1.0", "torch"])
    wheel(d, "nvidia-cudnn-frontend", "1.0", ["protobuf>=5"])
    wheel(d, "nvidia-cutlass-dsl", "1.0", ["protobuf==4.0"])
    wheel(d, "protobuf", "4.0")
    wheel(d, "cupti-python", "13.0.1")
    with pytest.raises(newcombo.NewCombinationError, match=r"the pins conflict: nvidia-cudnn-frontend 1.0 requires "
                                                           r"protobuf>=5, the pin is 4.0"):
        newcombo.plan(config(tmp_path), pip(d))
