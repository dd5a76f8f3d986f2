"""A combination file for one release, its pins read from the release's own metadata:
`flashinfer-trace combination new --flashinfer 0.6.9 --torch 2.11.0 --cuda 13 [--sglang V] [--arch sm90]`.

A hand-written pin is a guess about what a release needs; the release's wheel says it exactly (its
METADATA's Requires-Dist). So the release's metadata is read from the index pip is configured with (`pip
install --dry-run --no-deps --report`: the index's PEP 658 metadata where it has it, nothing installed), for
the target's Python and platform, with the CUDA extra (`cu13`) where the release offers one. Each runtime
dependency the kernels need (KERNEL_DEPS) that the release requires is pinned to the newest final release on
the index that satisfies the release's specifier (a pre-release only where no final one does); the CUDA
bindings (CUDA_BOUND) also stay within the torch wheel's CUDA major.minor, and a GPU combination gets the
benchmarks' CUPTI timer the same way. The exact-version requirements of what is pinned (nvidia-cutlass-dsl's
`-libs-*` wheels: the metapackage alone brings no kernels) are pinned too, because an offline session installs
the pins with `--no-deps`. Each pin's comment records the specifier it satisfies.

A release whose metadata rules out the torch pin, the CUDA major (CUDA extras without this one) or the
target's Python cannot run here: `plan` raises ReleaseConflict, and with `uninstallable=True` the file is
written with `status = "uninstallable"` and the reason, so the matrix shows the release. A release with no
wheel for the target is refused outright (there is nothing to record).

    plan(config, pip)        -> Plan (the pins with their reasons, or the conflict)
    render(config, plan)     -> the TOML text
    write(config, pip)       -> the written file's path (validated by combos.load_combination)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import InvalidMarker, UndefinedComparison
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .combos import ARCHS, ID_PATTERN, TAG_PATTERN, CombinationError, load_combination
from .wheelhouse import WheelhouseError, platform_tags

# what the kernels import at run time, pinned where the release requires it (the rest its resolver finds)
KERNEL_DEPS = ("apache-tvm-ffi", "nvidia-cudnn-frontend", "nvidia-cutlass-dsl", "cuda-python", "cuda-bindings")
# CUDA runtime bindings: their major.minor follows the torch wheel's CUDA (cu130 -> 13.0.*)
CUDA_BOUND = ("cuda-python", "cuda-bindings", "cupti-python")
# what sglang pins exactly and its kernels import (the rest of its exact pins: its serving stack, not installed)
SGLANG_DEPS = ("sglang-kernel", "flashinfer-cubin", "transformers", "openai", *KERNEL_DEPS)
TIMER = "cupti-python"  # the benchmarks' CUPTI timer (bench.py): every GPU combination
MAX_STEP_DOWN = 12  # older versions of a pin tried where the newer ones' own requirements rule out a pin
VARIANTS = {"12": "cu128", "13": "cu130"}  # the torch wheel variant a CUDA major gets unless told
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"

# runs `python -m pip ARGS`, returns (exit code, stdout, stderr)
Pip = Callable[[list[str]], tuple[int, str, str]]


class NewCombinationError(ValueError):
    """A bad input or a release that cannot be written as a combination (no wheel, no satisfying version)."""


class ReleaseConflict(NewCombinationError):
    """The release's metadata rules out this torch, CUDA or Python: uninstallable here."""


@dataclass(frozen=True)
class NewCombinationConfig:
    flashinfer: str
    torch: str
    cuda: str  # "12" or "13"
    sglang: str | None = None
    torch_variant: str | None = None  # default VARIANTS[cuda]
    archs: tuple[str, ...] = ("sm90",)
    python: str = ">=3.10,<3.14"  # the combination's Python range
    python_version: str = "3.12"  # the target interpreter whose wheels and markers count
    platform: str = DEFAULT_PLATFORM
    tags: tuple[str, ...] = ()
    nightly: bool = False
    uninstallable: bool = False  # a conflict writes an uninstallable combination instead of failing
    out: Path = Path("constraints")
    combination_id: str | None = None  # default cu130-torch2.11-fi0.6.9[-sglangV]
    force: bool = False  # replace an existing file

    @property
    def variant(self) -> str:
        return self.torch_variant or VARIANTS.get(self.cuda, "")

    @property
    def cuda_minor(self) -> str:
        """'13.0' from cu130."""
        digits = self.variant[2:]
        return f"{digits[:-1]}.{digits[-1]}"

    @property
    def id(self) -> str:
        if self.combination_id:
            return self.combination_id
        torch = Version(self.torch)
        torch_text = f"{torch.major}.{torch.minor}" + (f".{torch.micro}" if torch.micro else "")
        return (f"{self.variant}-torch{torch_text}-fi{self.flashinfer}"
                + (f"-sglang{self.sglang}" if self.sglang else ""))


def check_config(config: NewCombinationConfig) -> None:
    """Every input named in the error that rejects it."""
    for flag, value in (("--flashinfer", config.flashinfer), ("--torch", config.torch), ("--sglang", config.sglang)):
        if value is None:
            continue
        try:
            if str(Version(value)) != value:
                raise InvalidVersion
        except InvalidVersion:
            raise NewCombinationError(f"{flag} {value!r}: not an exact version as the index spells it") from None
    if config.cuda not in VARIANTS:
        raise NewCombinationError(f"--cuda {config.cuda!r}: one of {', '.join(VARIANTS)}")
    if not re.fullmatch(rf"cu{config.cuda}\d", config.variant):
        raise NewCombinationError(f"--torch-variant {config.variant!r}: not a CUDA {config.cuda} wheel variant "
                                  f"(e.g. {VARIANTS[config.cuda]})")
    bad = [a for a in config.archs if a not in ARCHS]
    if bad or not config.archs:
        raise NewCombinationError(f"--arch {', '.join(bad) or '(none)'}: one or more of {', '.join(ARCHS)}")
    try:
        if not SpecifierSet(config.python).contains(f"{config.python_version}.0"):
            raise NewCombinationError(f"--python-version {config.python_version}: outside --python {config.python}")
    except InvalidSpecifier:
        raise NewCombinationError(f"--python {config.python!r}: not a version specifier") from None
    try:
        platform_tags([config.platform])
    except WheelhouseError as e:
        raise NewCombinationError(str(e)) from None
    if not re.fullmatch(r"3\.\d{1,2}", config.python_version):
        raise NewCombinationError(f"--python-version {config.python_version!r}: expected 3.MINOR, e.g. 3.12")
    bad = [t for t in config.tags if not TAG_PATTERN.fullmatch(t)]
    if bad:
        raise NewCombinationError(f"--tag {bad[0]!r}: lower-case letters, digits and '-'")
    if not ID_PATTERN.match(config.id):
        raise NewCombinationError(f"--id {config.id!r}: not a valid combination id")


def pip_runner(python: str = sys.executable, *, isolated: bool = False, index_url: str | None = None,
               find_links: tuple[str, ...] = ()) -> Pip:
    """pip of `python`. `isolated`: no pip configuration file or PIP_* variable applies, only `index_url`
    (none: no index) and `find_links`, so a stand-in index is all pip sees."""
    env = dict(os.environ)
    source: list[str] = []
    if isolated:
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
        source = ["--isolated", *(["--index-url", index_url] if index_url else ["--no-index"])]
    elif index_url:
        source = ["--index-url", index_url]
    source += [a for link in find_links for a in ("--find-links", link)]

    def run(args: list[str]) -> tuple[int, str, str]:
        try:
            proc = subprocess.run([python, "-m", "pip", *args, *source, "--disable-pip-version-check"],
                                  capture_output=True, text=True, env=env, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NewCombinationError(f"cannot run pip of {python}: {e}") from None
        return proc.returncode, proc.stdout, proc.stderr

    return run


def _target(config: NewCombinationConfig) -> list[str]:
    # a manylinux tag brings the older ones of its architecture along, as the target's pip accepts them
    platforms = [a for tag in platform_tags([config.platform]) for a in ("--platform", tag)]
    return ["--python-version", config.python_version, *platforms, "--implementation", "cp", "--only-binary=:all:"]


@dataclass
class Metadata:
    name: str
    version: str
    wheel: str
    requires_dist: list[str]
    provides_extra: list[str]
    requires_python: str | None


def metadata(requirements: list[str], config: NewCombinationConfig, pip: Pip) -> dict[str, Metadata]:
    """The wheels pip picks for `requirements` (exact pins) and their metadata, by canonical name; nothing is
    downloaded where the index serves the metadata alone (PEP 658)."""
    with tempfile.TemporaryDirectory(prefix="fi-trace-newcombo-") as tmp:
        report = Path(tmp) / "report.json"
        code, _out, err = pip(["install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet", *_target(config),
                               "--target", str(Path(tmp) / "target"), "--report", str(report), *requirements])
        if code != 0 or not report.is_file():
            tail = " ".join(line for line in err.splitlines() if line.startswith("ERROR"))[-400:]
            raise NewCombinationError(f"no wheel of {' '.join(requirements)} for Python {config.python_version} on "
                                      f"{config.platform} on the index: {tail or err.strip()[-400:] or 'pip failed'}")
        data = json.loads(report.read_text())
    out = {}
    for item in data.get("install", []):
        m = item.get("metadata") or {}
        name = canonicalize_name(m.get("name", ""))
        out[name] = Metadata(name, m.get("version", ""), (item.get("download_info") or {}).get("url", "").rsplit(
            "/", 1)[-1], list(m.get("requires_dist") or []), list(m.get("provides_extra") or []),
            m.get("requires_python"))
    return out


def parse_versions(text: str) -> list[Version]:
    """The versions `pip index versions` printed ("Available versions: 0.7.2, 0.7.1, ...")."""
    for line in text.splitlines():
        head, colon, rest = line.partition(":")
        if colon and head.strip().lower() == "available versions":
            found = []
            for item in rest.split(","):
                try:
                    found.append(Version(item.strip()))
                except InvalidVersion:
                    continue
            return sorted(found)
    return []


def available(name: str, config: NewCombinationConfig, pip: Pip) -> list[Version]:
    code, out, err = pip(["index", "versions", name, "--pre", *_target(config)])
    found = parse_versions(out)
    if code != 0 or not found:
        raise NewCombinationError(f"{name}: no versions on the index for Python {config.python_version} on "
                                  f"{config.platform}: {' '.join(err.split())[-300:] or 'none listed'}")
    return found


def ranked(spec: SpecifierSet, versions: list[Version]) -> list[Version]:
    """The final releases in `spec`, newest first; the pre-releases only where no final one is."""
    finals = [v for v in versions if not v.is_prerelease and spec.contains(v, prereleases=False)]
    return sorted(finals or [v for v in versions if spec.contains(v, prereleases=True)], reverse=True)


def newest(spec: SpecifierSet, versions: list[Version]) -> Version | None:
    """The newest final release in `spec`; a pre-release only where no final one is."""
    found = ranked(spec, versions)
    return found[0] if found else None


def clash(meta: Metadata, extras: set[str], fixed: dict[str, str], config: NewCombinationConfig) -> str | None:
    """The first requirement of `meta` that a version already fixed rules out ("nvidia-cutlass-dsl[cu13]>=4.8.0,
    the pin is 4.6.0"), None where it holds them all."""
    for r in active(meta.requires_dist, extras, config, f"{meta.name} {meta.version}"):
        have = fixed.get(canonicalize_name(r.name))
        if have is not None and not r.specifier.contains(have, prereleases=True):
            extras_text = f"[{','.join(sorted(r.extras))}]" if r.extras else ""
            return f"{r.name}{extras_text}{r.specifier}, the pin is {have}"
    return None


def active(requires_dist: list[str], extras: set[str], config: NewCombinationConfig, where: str
           ) -> list[Requirement]:
    """The requirements that apply on the target (Linux x86_64, its Python) with `extras` chosen."""
    env = {"python_version": config.python_version, "python_full_version": f"{config.python_version}.0",
           "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
           "platform_machine": next((m for m in ("x86_64", "aarch64") if config.platform.endswith(m)), "x86_64"),
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    out = []
    for text in requires_dist:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            raise NewCombinationError(f"{where}: Requires-Dist {text!r} is not a requirement") from None
        try:
            applies = req.marker is None or any(req.marker.evaluate(env | {"extra": e}) for e in ("", *extras))
        except (InvalidMarker, UndefinedComparison):
            applies = False
        if applies:
            out.append(req)
    return out


@dataclass
class Pin:
    name: str
    version: str
    why: str  # the comment: the specifier it satisfies and who asked


@dataclass
class Plan:
    release: Metadata
    pins: list[Pin] = field(default_factory=list)
    conflict: str | None = None  # set: uninstallable here, for this reason
    sglang: Metadata | None = None


def _spec(reqs: list[Requirement], name: str) -> tuple[SpecifierSet, set[str]]:
    spec, extras = SpecifierSet(), set()
    for r in reqs:
        if canonicalize_name(r.name) == name:
            spec &= r.specifier
            extras |= r.extras
    return spec, extras


def _shown(spec: SpecifierSet) -> str:
    return str(spec) or "(any version)"


def plan(config: NewCombinationConfig, pip: Pip) -> Plan:
    """The release's pins with the reason for each; ReleaseConflict where its metadata rules this combination out."""
    check_config(config)
    release = metadata([f"flashinfer-python=={config.flashinfer}"], config, pip).get("flashinfer-python")
    if release is None:
        raise NewCombinationError(f"flashinfer-python {config.flashinfer}: the index returned no metadata")
    result = Plan(release)
    who = f"flashinfer-python {config.flashinfer}"
    cuda_extras = {e for e in release.provides_extra if re.fullmatch(r"cu\d+", e)}
    extra = f"cu{config.cuda}"
    if cuda_extras and extra not in cuda_extras:
        raise ReleaseConflict(f"{who} offers CUDA extras {', '.join(sorted(cuda_extras))}, not {extra}")
    if release.requires_python and not SpecifierSet(release.requires_python).contains(f"{config.python_version}.0"):
        raise ReleaseConflict(f"{who} requires Python {release.requires_python}, the target is "
                              f"{config.python_version}")
    reqs = active(release.requires_dist, cuda_extras & {extra}, config, who)
    torch_spec, _ = _spec(reqs, "torch")
    if not torch_spec.contains(config.torch, prereleases=True):
        raise ReleaseConflict(f"{who} requires torch{torch_spec}, the pin is {config.torch}")
    pins = {"torch": Pin("torch", config.torch, f"the torch pin ({config.variant}); {who} requires torch "
                                                  f"{_shown(torch_spec)}"),
            "flashinfer-python": Pin("flashinfer-python", config.flashinfer,
                                     f"the release ({release.wheel}; extra {extra})" if extra in cuda_extras
                                     else f"the release ({release.wheel})")}
    asked: dict[str, tuple[SpecifierSet, set[str], str]] = {}
    if config.sglang:  # sglang's exact pins first: the release's specifiers must hold them
        result.sglang = _sglang(config, pip, pins, asked)
    for name in KERNEL_DEPS:
        spec, extras = _spec(reqs, name)
        if name in asked and not spec.contains(next(iter(asked[name][0])).version, prereleases=True):
            raise ReleaseConflict(f"{asked[name][2]} pins {name}{asked[name][0]}, {who} requires {name}{spec}")
        if name not in asked and any(canonicalize_name(r.name) == name for r in reqs):
            asked[name] = (spec, extras, who)
    asked.setdefault(TIMER, (SpecifierSet(), set(), "the benchmarks' CUPTI timer (bench.py)"))
    queue = list(asked)
    read: dict[str, tuple[Metadata, set[str]]] = {}  # each pin's metadata and the extras it is pinned with
    while queue:
        name = queue.pop(0)
        spec, extras, by = asked[name]
        if name in pins:
            continue
        bound = SpecifierSet(f"=={config.cuda_minor}.*") if name in CUDA_BOUND else SpecifierSet()
        candidates = ranked(spec & bound, available(name, config, pip))
        if not candidates:
            raise NewCombinationError(f"{name}: no version on the index satisfies {spec & bound} ({by})")
        # the newest whose own requirements hold what is fixed already (sglang's exact nvidia-cutlass-dsl against
        # nvidia-cudnn-frontend 1.29+'s nvidia-cutlass-dsl[cu13]>=4.6.2): pip could not install the pins otherwise
        fixed = {n: p.version for n, p in pins.items()} | {
            n: s.version for n, (sp, _, _) in asked.items() for s in sp if s.operator == "==" and "*" not in s.version}
        skipped: list[tuple[Version, str]] = []
        for version in candidates[:MAX_STEP_DOWN]:
            meta = metadata([f"{name}=={version}"], config, pip).get(name)
            found = clash(meta, extras | ({extra} & set(meta.provides_extra)), fixed, config) if meta else None
            if found is None:
                break
            skipped.append((version, found))
        else:
            raise NewCombinationError(f"{name}: each of the newest {len(skipped)} version(s) in {spec & bound} ({by}) "
                                      f"rules out a pin: " + "; ".join(f"{v} requires {c}" for v, c in skipped))
        why = f"{by} {'require' if ' and ' in by else 'requires'} {_shown(spec)}" if spec or by == who else by
        why += f"; CUDA {config.cuda_minor} like the torch wheel" if bound else ""
        why += f"; extras [{','.join(sorted(extras))}] pinned below" if extras else ""
        exact = spec and all(x.operator == "==" and "*" not in x.version for x in spec)
        why += " (the pins of an offline install go in with --no-deps)" if exact else "; the newest satisfying it"
        if skipped:  # the last one skipped asks the least
            why += (f" whose own requirements hold the pins (not {', '.join(str(v) for v, _ in skipped)}: "
                    f"{skipped[-1][1]})")
        pins[name] = Pin(name, str(version), why)
        # what the pin itself requires exactly (a metapackage's libraries), and the kernel deps it requires
        if meta and extra in meta.provides_extra:  # the CUDA extra of what is pinned: its cu13 libraries
            extras = extras | {extra}
        if meta:
            read[name] = (meta, extras)
        for r in active(meta.requires_dist if meta else [], extras, config, f"{name} {version}"):
            dep = canonicalize_name(r.name)
            exact = [s.version for s in r.specifier if s.operator in ("==", "===") and "*" not in s.version]
            if dep in asked and dep not in pins:  # asked, not yet pinned: its version must hold this one's too
                dep_spec, dep_extras, dep_by = asked[dep]
                merged = dep_spec & r.specifier
                if merged != dep_spec or not set(r.extras) <= dep_extras:
                    by_all = f"{dep_by.replace(' and ', ', ')} and {name} {version}"
                    asked[dep] = (merged, dep_extras | set(r.extras), by_all)
                continue
            if dep in pins or dep in asked:
                continue
            if exact:  # its own requirements are read in turn (the libraries' -core wheel)
                asked[dep] = (r.specifier, set(r.extras), f"{name} {version}")
                queue.append(dep)
            elif dep in KERNEL_DEPS:
                asked[dep] = (r.specifier, set(r.extras), f"{name} {version}")
                queue.append(dep)
    final = {n: p.version for n, p in pins.items()}
    for name, (meta, extras) in read.items():  # a pin made later can still rule out an earlier one's requirement
        found = clash(meta, extras, final, config)
        if found:
            raise NewCombinationError(f"the pins conflict: {name} {pins[name].version} requires {found}")
    result.pins = list(pins.values())
    return result


def _sglang(config: NewCombinationConfig, pip: Pip, pins: dict[str, Pin],
            asked: dict[str, tuple[SpecifierSet, set[str], str]]) -> Metadata:
    """sglang's own exact pins of what its kernels import (SGLANG_DEPS) go into `asked`; a --torch or
    --flashinfer other than sglang's is refused."""
    meta = metadata([f"sglang=={config.sglang}"], config, pip).get("sglang")
    if meta is None:
        raise NewCombinationError(f"sglang {config.sglang}: the index returned no metadata")
    who = f"sglang {config.sglang}"
    pins["sglang"] = Pin("sglang", config.sglang, f"the release ({meta.wheel})")
    for r in active(meta.requires_dist, set(), config, who):
        name = canonicalize_name(r.name)
        exact = [s.version for s in r.specifier if s.operator == "==" and "*" not in s.version]
        if name in ("torch", "flashinfer-python"):
            wanted = config.torch if name == "torch" else config.flashinfer
            if r.specifier and not r.specifier.contains(wanted, prereleases=True):
                raise ReleaseConflict(f"{who} requires {name}{r.specifier}, the pin is {wanted}")
        elif exact and name in SGLANG_DEPS:
            asked[name] = (SpecifierSet(f"=={exact[0]}"), set(r.extras), who)
    return meta


def render(config: NewCombinationConfig, result: Plan, command: str) -> str:
    """The combination file: a comment saying where each pin came from, then the tables."""
    release = result.release
    head = [f"# CUDA {config.cuda}: torch {config.torch} ({config.variant}) with FlashInfer {config.flashinfer}"
            + (f" and sglang {config.sglang}" if config.sglang else "") + ", written by",
            f"# `{command}`",
            f"# from the wheel's metadata ({release.wheel}): each pin is the newest version on the index that",
            "# satisfies what the release requires (its comment says what); its other requirements are the "
            "resolver's."]
    lines = [*head, "[combination]", f'cuda = "{config.cuda}"', f'torch_variant = "{config.variant}"',
             "archs = [" + ", ".join(f'"{a}"' for a in config.archs) + "]", f'python = "{config.python}"']
    pins = result.pins
    if result.conflict:
        reason = result.conflict.replace("\\", "\\\\").replace('"', '\\"')
        lines += ['status = "uninstallable"', f'reason = "{reason}"']
        pins = [p for p in pins if p.name in ("torch", "flashinfer-python", "sglang")]
    lines.append(f"nightly = {'true' if config.nightly else 'false'}")
    if config.tags:
        lines.append("tags = [" + ", ".join(f'"{t}"' for t in config.tags) + "]")
    lines += ["", "[pins]"]
    width = max(len(p.name) + len(p.version) for p in pins) + 5
    for p in pins:
        lines.append(f'{p.name} = "{p.version}"'.ljust(width) + f"  # {' '.join(p.why.split())}")
    return "\n".join(lines) + "\n"


def write(config: NewCombinationConfig, pip: Pip, command: str) -> tuple[Path, Plan]:
    """Plan, render, validate with combos.load_combination, then write `<out>/<id>.toml` (never over an existing
    file without `force`)."""
    check_config(config)
    path = Path(config.out) / f"{config.id}.toml"
    if path.exists() and not config.force:
        raise NewCombinationError(f"{path} exists (--force replaces it)")
    try:
        result = plan(config, pip)
    except ReleaseConflict as e:
        if not config.uninstallable:
            raise
        release = metadata([f"flashinfer-python=={config.flashinfer}"], config, pip)["flashinfer-python"]
        result = Plan(release, [Pin("torch", config.torch, "the torch pin"),
                                Pin("flashinfer-python", config.flashinfer, f"the release ({release.wheel})")],
                      conflict=str(e))
        if config.sglang:
            result.pins.append(Pin("sglang", config.sglang, "the release"))
    text = render(config, result, command)
    Path(config.out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fi-trace-newcombo-") as tmp:
        trial = Path(tmp) / path.name
        trial.write_text(text)
        try:
            load_combination(trial)
        except CombinationError as e:
            raise NewCombinationError(f"the written combination does not validate: {e}") from None
    path.write_text(text)
    return path, result
