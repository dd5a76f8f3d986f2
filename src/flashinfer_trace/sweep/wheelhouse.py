"""A combination's wheels for a machine without an index: `flashinfer-trace wheelhouse build / verify`.

An offline GPU node installs from a folder of wheels (`--wheelhouse DIR`, install.py). The folder is
built on a connected machine for the node's Python and platform, which need not be the builder's:
pip resolves the combination's pins for that target (`--python-version`, `--platform`,
`--implementation cp`, wheels only), with the project's own requirements that the offline install
resolves from the same folder (combos.PROJECT_REQUIREMENTS) and whatever `--add` names (nox, to run the
sessions there), and the closure it resolves is downloaded. `wheelhouse.json`
records the build (the combination and its file's sha256, the target, each wheel's size and sha256),
so the node refuses a wheel damaged or swapped on the way instead of installing it.

Two pip calls, not one `pip download`: pip cannot leave a package out of a resolution, and a node
whose torch is preinstalled needs neither torch nor the gigabytes of CUDA libraries that only torch
pulls in. So pip first resolves the whole closure (`pip install --dry-run --report`: nothing is
installed), `--exclude` drops the named packages and whatever only they require, and the rest is
downloaded at exactly the resolved versions (`pip download --no-deps`). pip evaluates dependency
markers for the interpreter that runs it, not for `--python-version` / `--platform`; a difference
between the two is a note in the manifest (run pip with the target's Python for an exact closure).

Before pip runs, each index it is to use (the main one, the torch index, the combination's own) gets one GET of
its page for one project with a short timeout. pip retries an index that does not answer for many minutes
before it says anything; an unreachable one stops the build at once, naming it and the flag that does without it.

    build(combo, dest, ...)            -> the manifest written to dest/wheelhouse.json
    check_indexes(indexes)             -> None; WheelhouseError naming every index that does not answer
    verify(folder, combination=None)   -> its manifest (None without one); WheelhouseError on a mismatch

Standard library and `packaging` only: install.py, which the noxfile imports, calls `verify`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .combos import Combination

MANIFEST = "wheelhouse.json"
FORMAT = 1
DEFAULT_PLATFORMS = ("manylinux_2_28_x86_64",)
DEFAULT_TORCH_INDEX = "https://download.pytorch.org/whl/{variant}"  # as install.py's fresh mode
DEFAULT_INDEX = "https://pypi.org/simple"  # pip's own default
INDEX_TIMEOUT = 10.0  # seconds for an index's first answer; a reachable one answers in far less
# the glibc each legacy manylinux tag stands for (PEP 600)
LEGACY_MANYLINUX = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}
PLATFORM = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
PYTHON_VERSION = re.compile(r"3\.(\d{1,2})")
MACHINES = ("x86_64", "aarch64", "i686", "ppc64le", "s390x", "armv7l")

Pip = Callable[[list[str]], None]  # runs `pip ARGS...`; raises WheelhouseError on a failure
Probe = Callable[[str, str], "str | None"]  # (index URL, project) -> why it cannot serve pip, None if it answers


class WheelhouseError(ValueError):
    pass


def pip_runner(python: str = sys.executable) -> Pip:
    """pip of `python`, its output shown as it goes (a download of gigabytes takes a while)."""

    def run(args: list[str]) -> None:
        try:
            proc = subprocess.run([python, "-m", "pip", *args], stderr=subprocess.PIPE, text=True)
        except OSError as e:
            raise WheelhouseError(f"cannot run pip of {python}: {e}") from None
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-12:])
            raise WheelhouseError(f"pip {args[0]} failed (exit {proc.returncode}):\n{tail}")

    return run


def interpreter_version(python: str = sys.executable) -> str:
    """3.X of `python`: a build resolved by another interpreter targets that one's Python unless told otherwise
    (else its wheels would be this interpreter's: cp311 wheels for a 3.12 node)."""
    if python == sys.executable:
        return "{}.{}".format(*sys.version_info[:2])
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise WheelhouseError(f"cannot run {python} to learn its Python version: {e}") from None
    version = out.stdout.strip()
    if out.returncode != 0 or not re.fullmatch(r"3\.\d+", version):
        raise WheelhouseError(f"cannot learn the Python version of {python} (exit {out.returncode}): "
                              "give --python-version 3.X")
    return version


def configured_index(python: str = sys.executable) -> str | None:
    """The main index the pip of `python` is configured with (PIP_INDEX_URL, else pip.conf's download, install
    or global `index-url`); None where it has none and uses PyPI."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    try:
        listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                                timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = dict(re.findall(r"^([:\w.-]+)\.index-url='(.*)'$", listed, re.MULTILINE))
    return next((found[k] for k in (":env:", "download", "install", "global") if found.get(k)), None)


@dataclass(frozen=True)
class Index:
    """An index pip is to use, and what to do without it."""

    url: str
    role: str  # "the main index", ...
    instead: str  # the flag (or the edit) that does without it
    project: str  # whose page is fetched


def probe_index(url: str, project: str, timeout: float = INDEX_TIMEOUT) -> str | None:
    """Why `url` cannot serve pip, or None when it answers: one GET of its simple page for `project`, no retries.
    Any HTTP answer below 500 counts (a 404: the index is there without that project), and so does a certificate
    pip may have its own settings for; no answer within `timeout`, a refused connection or a 5xx does not."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
        return None if path.exists() else f"{path} does not exist"
    page = f"{url.rstrip('/')}/{canonicalize_name(project)}/"
    try:
        with urllib.request.urlopen(urllib.request.Request(page, headers={"Accept": "text/html"}),
                                    timeout=timeout) as answer:
            answer.read(1)
    except urllib.error.HTTPError as e:
        return None if e.code < 500 else f"HTTP {e.code} for {page}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, ssl.SSLCertVerificationError):
            return None
        if isinstance(reason, TimeoutError):
            return f"no answer within {timeout:g} s"
        return f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    return None


def check_indexes(indexes: Sequence[Index], probe: Probe | None = None, timeout: float = INDEX_TIMEOUT) -> None:
    """Every index probed at once; WheelhouseError naming each that does not answer within `timeout` (name
    resolution included, which no socket timeout bounds), and how to do without it."""
    probe = probe or (lambda url, project: probe_index(url, project, timeout))
    why: list[str | None] = [f"no answer within {timeout:g} s"] * len(indexes)

    def one(k: int, index: Index) -> None:
        try:
            why[k] = probe(index.url, index.project)
        except Exception as e:  # noqa: BLE001 - a probe that fails says why the index cannot serve
            why[k] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=one, args=(k, i), daemon=True) for k, i in enumerate(indexes)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 1
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    down = [f"{i.role} {i.url} is unreachable ({reason}); pip would retry it for minutes: {i.instead}"
            for i, reason in zip(indexes, list(why), strict=True) if reason is not None]
    if down:
        raise WheelhouseError("\n".join(down))


def indexes_of(combo: Combination, torch_index: str | None, index_url: str | None,
               project: str) -> list[Index]:
    """The indexes a build's pip calls use: the main one (`index_url`, else PyPI), the torch index and the
    combination's own."""
    found = [Index(index_url or DEFAULT_INDEX, "the main index" if index_url else "the main index (pip's default)",
                   "name a reachable one, e.g. a mirror, with --index-url URL", project)]
    if torch_index:
        found.append(Index(torch_index, "the torch index", 'do without it with --torch-index "" (torch then comes '
                           "from the main index) or name another with --torch-index URL", "torch"))
    found += [Index(url, f"{combo.id}'s own index", f"it is the `indexes` of {combo.path.name}", project)
              for url in combo.indexes]
    return found


def python_version(text: str, combo: Combination) -> str:
    """'3.12' checked against the combination's Python specifier."""
    if not PYTHON_VERSION.fullmatch(text or ""):
        raise WheelhouseError(f"--python-version {text!r}: expected 3.MINOR, e.g. 3.12")
    if not combo.python.contains(f"{text}.0"):
        raise WheelhouseError(f"--python-version {text}: {combo.id} needs Python {combo.python}")
    return text


def platform_tags(platforms: Sequence[str]) -> list[str]:
    """The tags pip is to accept for each platform. A glibc 2.28 system runs every manylinux wheel
    up to glibc 2.28, but pip takes `--platform manylinux_2_28_x86_64` literally (it widens only the
    legacy manylinux2014 / 2010 names), and most wheels say manylinux_2_17 or manylinux2014: so each
    manylinux tag brings the older ones of its architecture along."""
    if not platforms:
        raise WheelhouseError("--platform: at least one platform tag is needed, e.g. manylinux_2_28_x86_64")
    tags: list[str] = []
    for p in platforms:
        if not PLATFORM.fullmatch(p):
            raise WheelhouseError(f"--platform {p!r}: not a wheel platform tag (e.g. manylinux_2_28_x86_64)")
        legacy, _, legacy_arch = p.partition("_")
        glibc = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", p)
        if glibc:
            major, minor, arch = int(glibc[1]), int(glibc[2]), glibc[3]
        elif legacy in LEGACY_MANYLINUX and legacy_arch:
            (major, minor), arch = LEGACY_MANYLINUX[legacy], legacy_arch
        else:
            tags.append(p)
            continue
        tags.extend(f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4 if major == 2 else -1, -1))
        if major == 2:  # manylinux2010 and manylinux1 were x86 only
            tags.extend(f"{name}_{arch}" for name, (_, m) in LEGACY_MANYLINUX.items()
                        if m <= minor and (name == "manylinux2014" or arch in ("x86_64", "i686")))
    return list(dict.fromkeys(tags))


def target_notes(environment: dict, version: str, tags: Sequence[str]) -> list[str]:
    """Where the markers pip evaluated (its own interpreter's) differ from the target's."""
    notes = []
    pip_version = environment.get("python_version")
    if pip_version and pip_version != version:
        notes.append(f"pip ran on Python {pip_version} and evaluated dependency markers for it, not for {version}: "
                     f"for an exact closure build with --python python{version}")
    linux = [t for t in tags if t.startswith(("manylinux", "musllinux", "linux"))]
    machines = {m for t in linux for m in MACHINES if t.endswith(f"_{m}")}
    system, machine = environment.get("sys_platform"), environment.get("platform_machine")
    if linux and system and system != "linux":
        notes.append(f"pip ran on {system}, the target is Linux: markers such as torch's "
                     "`platform_system == 'Linux'` were evaluated for the builder")
    elif machines and machine and machine not in machines:
        notes.append(f"pip ran on {machine}, the target is {', '.join(sorted(machines))}: markers on "
                     "platform_machine were evaluated for the builder")
    return notes


def _report_items(report: dict) -> dict[str, dict]:
    items = {}
    for item in report.get("install") or ():
        meta = item.get("metadata") or {}
        if not meta.get("name") or not meta.get("version"):
            raise WheelhouseError(f"pip's resolution report has an entry without name or version: {item!r:.200}")
        items[canonicalize_name(meta["name"])] = item
    if not items:
        raise WheelhouseError("pip resolved nothing (an empty resolution report)")
    return items


def keep(report: dict, exclude: Iterable[str]) -> tuple[dict[str, dict], dict[str, dict]]:
    """(kept, left out) of the resolution: without exclusions all of it; otherwise what the requested
    packages require without passing through an excluded one, markers and extras evaluated as pip did."""
    items, exclude = _report_items(report), {canonicalize_name(n) for n in exclude}
    unknown = sorted(exclude - set(items))
    if unknown:
        raise WheelhouseError(f"--exclude {', '.join(unknown)}: not in the closure pip resolved "
                              f"({', '.join(sorted(items))})")
    if not exclude:
        return items, {}
    environment = report.get("environment") or {}
    extras_of: dict[str, set[str]] = {}
    todo = [(n, set(i.get("requested_extras") or ())) for n, i in items.items() if i.get("requested")]
    while todo:
        name, extras = todo.pop()
        if name in exclude or name not in items:
            continue  # excluded, or a requirement pip found no need for (its marker is false)
        if name in extras_of and extras <= extras_of[name]:
            continue
        active = extras_of.setdefault(name, set())
        active |= extras
        for text in items[name]["metadata"].get("requires_dist") or ():
            try:
                req = Requirement(text)
            except InvalidRequirement:
                raise WheelhouseError(f"{name}: unreadable requirement {text!r} in its metadata") from None
            if req.marker is None or any(req.marker.evaluate({**environment, "extra": e}) for e in ("", *active)):
                todo.append((canonicalize_name(req.name), set(req.extras)))
    kept = {n: i for n, i in items.items() if n in extras_of}
    return kept, {n: i for n, i in items.items() if n not in kept}


def _reported_sha256(item: dict) -> str | None:
    info = (item.get("download_info") or {}).get("archive_info") or {}
    digest = (info.get("hashes") or {}).get("sha256")
    if not digest and str(info.get("hash", "")).startswith("sha256="):
        digest = info["hash"].split("=", 1)[1]
    return digest


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _wheels(folder: Path) -> dict[tuple[str, Version], Path]:
    found = {}
    for p in sorted(folder.glob("*.whl")):
        try:
            name, version, _, _ = parse_wheel_filename(p.name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        found[(canonicalize_name(name), version)] = p
    return found


def _earlier(dest: Path) -> dict | None:
    """An earlier build's manifest in `dest`; a folder with other contents is refused."""
    if not dest.exists():
        return None
    if not dest.is_dir():
        raise WheelhouseError(f"--out {dest}: not a folder")
    if (dest / MANIFEST).is_file():
        return load_manifest(dest)
    if any(dest.iterdir()):
        raise WheelhouseError(f"--out {dest}: not empty and holds no {MANIFEST}: pick an empty folder (whatever "
                              "else is there would be offered to the offline install unverified)")
    return None


def requirements(combo: Combination, add: Sequence[str] = (), project: bool = True) -> list[str]:
    """The combination's pins, the project's requirements (unless `project` is false) and `add`."""
    from .combos import PROJECT_REQUIREMENTS

    for text in add:
        try:
            Requirement(text)
        except InvalidRequirement as e:
            raise WheelhouseError(f"--add {text!r}: not a requirement ({e})") from None
    return [*combo.requirements(), *(PROJECT_REQUIREMENTS if project else ()), *add]


def build(combo: Combination, dest: str | Path, *, version: str, platforms: Sequence[str] = DEFAULT_PLATFORMS,
          exclude: Sequence[str] = (), add: Sequence[str] = (), project: bool = True, torch_index: str | None = None,
          index_url: str | None = None, pip: Pip | None = None, probe: Probe | None = None) -> dict:
    """Resolve `combo` (with the project's requirements and `add`) for the target, download the
    closure into `dest`, write and return its manifest. `torch_index` None is the variant's default, "" none;
    `index_url` None is pip's default. Each index is probed first (`probe`, default probe_index)."""
    if not combo.installable:
        raise WheelhouseError(f"{combo.id} is marked uninstallable ({combo.reason}): there is nothing to download")
    wanted_requirements = requirements(combo, add, project)
    version = python_version(version, combo)
    tags = platform_tags(platforms)
    dest = Path(dest)
    earlier = _earlier(dest)
    pip = pip or pip_runner()
    if torch_index is None and combo.torch_variant != "cpu":
        torch_index = DEFAULT_TORCH_INDEX.format(variant=combo.torch_variant)
    index_urls = ([torch_index] if torch_index else []) + list(combo.indexes)  # the combination's own: FlashInfer's
    first = Requirement(wanted_requirements[0]).name if wanted_requirements else "pip"  # whose page is asked for
    check_indexes(indexes_of(combo, torch_index, index_url, first), probe)
    indexes = [*(["--index-url", index_url] if index_url else []),
               *(a for i in index_urls for a in ("--extra-index-url", i))]
    target = ["--only-binary=:all:", "--python-version", version, "--implementation", "cp",
              *(a for t in tags for a in ("--platform", t)), *indexes, "--disable-pip-version-check"]
    with tempfile.TemporaryDirectory(prefix="flashinfer-trace-wheelhouse-") as tmp:
        report_file = Path(tmp) / "report.json"
        pip(["install", "--dry-run", "--ignore-installed", "--target", str(Path(tmp) / "target"),
             "--report", str(report_file), *target, *wanted_requirements])
        try:
            report = json.loads(report_file.read_text())
        except (OSError, ValueError) as e:
            raise WheelhouseError(f"pip wrote no readable resolution report: {e}") from None
    kept, left_out = keep(report, exclude)
    wanted = {n: Version(i["metadata"]["version"]) for n, i in kept.items()}
    dest.mkdir(parents=True, exist_ok=True)
    # ===: exactly the resolved version; `torch==2.13.0` would also take a 2.13.0+cpu wheel found beside it
    pip(["download", "--no-deps", "--dest", str(dest), *target, *(f"{n}==={v}" for n, v in sorted(wanted.items()))])
    found = _wheels(dest)
    wheels, problems = [], []
    for name, v in sorted(wanted.items()):
        path = found.get((name, v))
        if path is None:
            problems.append(f"{name}=={v}: pip download left no wheel of it in {dest}")
            continue
        digest, reported = sha256_of(path), _reported_sha256(kept[name])
        if reported and reported != digest:
            problems.append(f"{path.name}: sha256 {digest}, but the resolution chose a file with {reported}")
        wheels.append({"file": path.name, "name": name, "version": str(v), "size": path.stat().st_size,
                       "sha256": digest, "pinned": combo.pin(name) is not None})
    if problems:
        raise WheelhouseError("the downloaded wheels are not the resolved ones:\n  " + "\n  ".join(problems))
    listed = {w["file"] for w in wheels}
    for old in (earlier or {}).get("wheels", ()):  # an earlier build's wheels this one no longer has
        if old.get("file") not in listed and (dest / old["file"]).is_file():
            (dest / old["file"]).unlink()
    manifest = {"format": FORMAT, "combination": combo.id, "constraints_file": combo.path.name,
                "constraints_sha256": combo.sha256, "python_version": version, "implementation": "cp",
                "platforms": list(platforms), "platform_tags": tags, "indexes": index_urls,
                "requirements": wanted_requirements,
                "excluded": sorted({canonicalize_name(n) for n in exclude}),
                "left_out": [{"name": n, "version": i["metadata"]["version"]} for n, i in sorted(left_out.items())],
                "notes": target_notes(report.get("environment") or {}, version, tags),
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wheels": wheels}
    tmp = dest / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, dest / MANIFEST)
    return manifest


def load_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise WheelhouseError(f"{path}: unreadable ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WheelhouseError(f"{path}: not a wheelhouse manifest of format {FORMAT}")
    wheels = data.get("wheels")
    if not isinstance(wheels, list) or not all(
            isinstance(w, dict) and isinstance(w.get("file"), str) and isinstance(w.get("sha256"), str)
            and isinstance(w.get("size"), int) and Path(w["file"]).name == w["file"] for w in wheels):
        raise WheelhouseError(f"{path}: `wheels` must list {{file, size, sha256}} for each wheel, files by name")
    return data


def verify(folder: str | Path, combination: str | None = None) -> dict | None:
    """Every wheel of `folder` against its manifest: the same size and sha256, none missing, none
    added. None where the folder has no manifest (a wheelhouse put together by hand)."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return None
    manifest = load_manifest(folder)
    where = folder / MANIFEST
    if combination is not None and manifest.get("combination") != combination:
        raise WheelhouseError(f"{where}: built for {manifest.get('combination')}, not {combination}: build one "
                              f"with `flashinfer-trace wheelhouse build --combination {combination}`")
    problems = []
    listed = {w["file"]: w for w in manifest["wheels"]}
    for file, w in listed.items():
        path = folder / file
        if not path.is_file():
            problems.append(f"{file}: missing")
        elif path.stat().st_size != w["size"]:
            problems.append(f"{file}: {path.stat().st_size} bytes, the manifest says {w['size']}")
        elif (digest := sha256_of(path)) != w["sha256"]:
            problems.append(f"{file}: sha256 {digest}, the manifest says {w['sha256']}")
    problems += [f"{p.name}: not in the manifest (added after the build)" for p in sorted(folder.glob("*.whl"))
                 if p.name not in listed]
    if problems:
        raise WheelhouseError(f"{where}: {len(problems)} wheel(s) differ from the build: {'; '.join(problems)}; "
                              "nothing installed (damaged or replaced on the way: copy them again, or rebuild)")
    return manifest
