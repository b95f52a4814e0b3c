"""Lock the Python closure of our vLLM per target platform: ``sparkseal lock python``.

Inputs: vLLM's own pins (``requirements/cuda.txt``, which includes ``common.txt``, read from the locked
sdist named in ``third_party/vllm/vllm.lock.json``) and ours (``third_party/python/requirements.in``).
uv resolves them for each target (CPython 3.11, manylinux glibc <= 2.36 on aarch64 or x86_64) from the
index pip is configured with; vLLM itself is left out, since the build supplies its own wheel. Then every
pin must have a wheel on the index that installs on the target, or the lock fails naming each pin without
one. Written per platform, under ``third_party/python/``:

- ``requirements_<platform>.txt``: pip's ``--hash`` requirements format, one hash per pin: the wheel the
  target installs (pip's own preference among the compatible ones);
- ``requirements_<platform>.files.json``: that wheel's exact filename and sha256 per pin, for the
  ``python_lock`` repository rule.

The build tools (``tools.in``: the ``installer`` library) are locked the same way as pure-Python wheels
(``tools.txt``, ``tools.files.json``). uv itself is pinned by ``UV_VERSION`` and locked by hash in
``uv.txt``; it is installed from there into a private virtual environment under the cache directory.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sparkseal.core import locks, platforms
from sparkseal.core.archives import ArchiveError, open_tar
from sparkseal.core.files import write_atomically
from sparkseal.core.wheels import (
    GLIBC,
    PYTHON_VERSION,
    WheelError,
    describe_target,
    parse_wheel_filename,
    tag_rank,
)
from sparkseal.fetch.download import download, sha256_of
from sparkseal.fetch.index import (
    FetchError,
    IndexFile,
    ProjectPage,
    index_url,
    list_files,
    lookup,
    normalize_name,
)

PLATFORMS = tuple(platforms.PLATFORMS)
TOOLS = "any"
UV_VERSION = "0.13.9"
# The build hosts uv.txt provides uv for (the machines that run `sparkseal lock python`).
UV_HOSTS = tuple(platforms.PLATFORMS)

DEFAULT_DIR = Path("third_party/python")
DEFAULT_VLLM_LOCK = Path("third_party/vllm/vllm.lock.json")
OURS = "requirements.in"
TOOLS_IN = "tools.in"
# vLLM's requirement files inside its sdist; cuda.txt pulls in common.txt with `-r`.
VLLM_REQUIREMENTS_DIR = "requirements"
VLLM_ROOT_REQUIREMENTS = "cuda.txt"
EXCLUDED = ("vllm",)
# Project pages fetched at once while checking a resolution.
PAGE_FETCHES = 8

Lister = Callable[[str], ProjectPage]

_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)$")
_HASH = "--hash=sha256:"


class LockError(Exception):
    """The resolution, the index or an existing lock does not allow writing the lock."""


@dataclass(frozen=True)
class Pin:
    """One ``name==version`` of a ``--hash`` requirements file, with its hashes and comment lines."""

    name: str
    version: str
    hashes: tuple[str, ...]
    comments: tuple[str, ...] = ()


@dataclass(frozen=True)
class LockedWheel:
    """A pin and the one wheel of it that the target installs."""

    pin: Pin
    filename: str
    sha256: str


def lock_paths(directory: Path, platform: str) -> tuple[Path, Path]:
    """The requirements file and its filename sidecar for ``platform`` (``any``: the build tools)."""
    stem = "tools" if platform == TOOLS else f"requirements_{platform}"
    return directory / f"{stem}.txt", directory / f"{stem}.files.json"


def parse_requirements(text: str, source: str) -> list[Pin]:
    """Parse a ``--hash`` requirements file in which every requirement is an exact ``==`` pin.

    Comment lines after a requirement (uv's ``# via`` annotations) stay with it.
    """
    pins: list[Pin] = []
    current: dict | None = None

    def close() -> None:
        if current is not None:
            pins.append(
                Pin(current["name"], current["version"], tuple(current["hashes"]), tuple(current["comments"]))
            )

    lines = text.splitlines()
    number = 0
    while number < len(lines):
        start = number
        line = lines[number]
        while line.endswith("\\") and number + 1 < len(lines):
            number += 1
            line = line[:-1] + " " + lines[number]
        number += 1
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if current is not None and line.startswith("    #"):
                current["comments"].append(stripped)
            continue
        tokens = stripped.split()
        match = _PIN.match(tokens[0])
        if not match:
            raise LockError(f"{source}:{start + 1}: expected NAME==VERSION, found {tokens[0]!r}")
        close()
        current = {
            "name": normalize_name(match["name"]),
            "version": match["version"],
            "hashes": [],
            "comments": [],
        }
        for token in tokens[1:]:
            hashed = token.removeprefix(_HASH)
            if not token.startswith(_HASH) or not locks.is_sha256(hashed):
                raise LockError(
                    f"{source}:{start + 1}: expected --hash=sha256:<64 hex digits>, found {token!r}"
                )
            current["hashes"].append(hashed)
        if not current["hashes"]:
            raise LockError(f"{source}:{start + 1}: {tokens[0]} has no --hash")
    close()
    names = [p.name for p in pins]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise LockError(f"{source}: expected one pin per project, found several for {', '.join(twice)}")
    return pins


def select_wheel(pin: Pin, platform: str, page: ProjectPage) -> LockedWheel | str:
    """The wheel of ``pin`` that ``platform`` installs (pip's preference), or why there is none."""
    same = []
    for file in page.files:
        try:
            name = parse_wheel_filename(file.filename)
        except WheelError:  # an sdist, or a file name that no installer would take
            continue
        if name.project == pin.name and name.version.lower() == pin.version.lower():
            same.append(file)
    ranked = sorted(
        (rank, file.filename, file)
        for file in same
        if (rank := tag_rank(file.filename, platform)) is not None
    )
    if not ranked:
        listed = ", ".join(sorted(f.filename for f in same)) or "no wheel at all"
        return f"{pin.name}=={pin.version}: {page.url} lists {listed}"
    best: IndexFile = ranked[0][2]
    if best.sha256 is None:
        return f"{pin.name}=={pin.version}: {page.url} lists no sha256 for {best.filename}"
    if best.sha256 not in pin.hashes:
        return (
            f"{pin.name}=={pin.version}: {best.filename} has sha256 {best.sha256} on {page.url}, "
            f"which is not among the {len(pin.hashes)} hashes the resolver locked"
        )
    return LockedWheel(pin, best.filename, best.sha256)


def select_wheels(pins: Sequence[Pin], platform: str, lister: Lister, source: str) -> list[LockedWheel]:
    """Pick the wheel of every pin for ``platform``; fail naming every pin without one."""
    excluded = [pin.name for pin in pins if pin.name in EXCLUDED]
    if excluded:
        raise LockError(
            f"{source}: {', '.join(excluded)} must not be locked (the build supplies its own wheel)"
        )
    # Project pages are independent: fetch a few at a time.
    with ThreadPoolExecutor(max_workers=PAGE_FETCHES) as pool:
        pages = list(pool.map(lister, [pin.name for pin in pins]))
    locked, missing = [], []
    for pin, page in zip(pins, pages, strict=True):
        chosen = select_wheel(pin, platform, page)
        if isinstance(chosen, str):
            missing.append(chosen)
        else:
            locked.append(chosen)
    if missing:
        raise LockError(
            f"{source}: {len(missing)} of {len(pins)} pins have no wheel for {describe_target(platform)}:\n  "
            + "\n  ".join(missing)
        )
    return locked


def render_requirements(locked: Sequence[LockedWheel], header: Sequence[str]) -> str:
    """The ``--hash`` requirements file: the header comment, then each pin with its one hash."""
    lines = [f"# {line}".rstrip() for line in header]
    for wheel in locked:
        lines.append(f"{wheel.pin.name}=={wheel.pin.version} \\")
        lines.append(f"    --hash=sha256:{wheel.sha256}")
        lines.extend(f"    {comment}" for comment in wheel.pin.comments)
    return "\n".join(lines) + "\n"


def render_files(locked: Sequence[LockedWheel], platform: str, requirements: str) -> str:
    """The sidecar JSON (a ``python`` lock of sparkseal.core.locks): per project its version, wheel
    filename and sha256."""
    document = {
        "comment": f"Generated by `sparkseal lock python` together with {requirements}; do not edit.",
        "platform": platform,
        "requirements": requirements,
        "wheels": {
            w.pin.name: {"filename": w.filename, "sha256": w.sha256, "version": w.pin.version} for w in locked
        },
    }
    try:
        return locks.render_lock("python", document, f"{requirements.removesuffix('.txt')}.files.json")
    except locks.LockError as exc:
        raise LockError(str(exc)) from None


def lock_exact(project: str, version: str, platforms: Sequence[str], lister: Lister) -> Pin:
    """Pin ``project==version`` with the hash of its preferred wheel for each of ``platforms``."""
    page = lister(project)
    # Any hash the index lists is acceptable here: the pin is exact and has no requirements to resolve.
    listed = Pin(normalize_name(project), version, tuple(f.sha256 for f in page.files if f.sha256))
    hashes, missing = [], []
    for platform in platforms:
        chosen = select_wheel(listed, platform, page)
        if isinstance(chosen, str):
            missing.append(f"{platform}: {chosen}")
        elif chosen.sha256 not in hashes:
            hashes.append(chosen.sha256)
    if missing:
        raise LockError(f"cannot pin {project}=={version}:\n  " + "\n  ".join(missing))
    return Pin(listed.name, version, tuple(hashes))


def render_uv_lock(pin: Pin) -> str:
    """``uv.txt``: uv for the build hosts, by hash."""
    lines = [
        "# Generated by `sparkseal lock python` from UV_VERSION (sparkseal/fetch/lock_python.py).",
        f"# The resolver that writes the locks, for build hosts {', '.join(UV_HOSTS)}; not a build input.",
        f"{pin.name}=={pin.version} \\",
        *(f"    --hash=sha256:{h} \\" for h in pin.hashes),
    ]
    lines[-1] = lines[-1].removesuffix(" \\")
    return "\n".join(lines) + "\n"


def locked_sdist(vllm_lock: Path, download_dir: Path, index: str | None) -> tuple[Path, str, str]:
    """Return the locked vLLM sdist (downloaded or reused), its version and its sha256."""
    try:
        lock = locks.read_vllm_lock(vllm_lock)
        filename, sha256 = lock.sdist.filename, lock.sdist.sha256
        path = download_dir / filename
        if not (path.is_file() and sha256_of(path) == sha256):
            path, _, _ = download(lookup(filename, index), download_dir, index)
        locks.check_file(path, sha256, f"locked in {vllm_lock}")
    except locks.LockError as exc:
        raise LockError(str(exc)) from None
    return path, lock.version, sha256


def extract_vllm_requirements(sdist: Path, version: str, directory: Path) -> Path:
    """Copy ``requirements/*.txt`` of the sdist to ``directory/vllm-<version>/requirements/``.

    Returns the root requirements file. They lie outside the ``vllm/`` package of the sdist.
    """
    prefix = f"vllm-{version}/{VLLM_REQUIREMENTS_DIR}/"
    found = []
    try:
        with open_tar(str(sdist), path=sdist, mode="r:*") as tar:
            for member in tar.getmembers():
                rest = member.name.removeprefix(prefix)
                if (
                    member.name.startswith(prefix)
                    and member.isfile()
                    and "/" not in rest
                    and rest.endswith(".txt")
                ):
                    source = tar.extractfile(member)
                    if source is None:
                        raise LockError(f"{sdist}: {member.name} cannot be read")
                    target = directory / member.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(source.read())
                    found.append(rest)
    except (tarfile.TarError, ArchiveError) as exc:
        raise LockError(f"{sdist}: cannot read {prefix}*.txt: {exc}") from exc
    if VLLM_ROOT_REQUIREMENTS not in found:
        raise LockError(f"{sdist}: {prefix}{VLLM_ROOT_REQUIREMENTS} is missing (found {sorted(found)})")
    return Path(prefix) / VLLM_ROOT_REQUIREMENTS


def uv_environment() -> dict[str, str]:
    """The environment uv runs in: the caller's without uv's own settings, and no Python downloads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def ensure_uv(uv_lock: Path, venv: Path, index: str) -> Path:
    """Return the ``uv`` of ``venv``, installing it from ``uv_lock`` (hash-checked) when missing."""
    uv = venv / "bin" / "uv"
    expected = f"uv {UV_VERSION}"
    if uv.is_file():
        probe = subprocess.run([uv, "--version"], capture_output=True, text=True, check=False)
        if probe.stdout.split(" (")[0].strip() == expected:
            return uv
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    install = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps"]
    install += ["--only-binary", ":all:", "-r", uv_lock]
    # The index goes in the environment, not the command line: its URL may carry credentials.
    env = {**os.environ, "PIP_INDEX_URL": index}
    result = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise LockError(f"installing uv from {uv_lock} failed: {result.stderr.strip()[-2000:]}")
    probe = subprocess.run([uv, "--version"], capture_output=True, text=True, check=False)
    if probe.stdout.split(" (")[0].strip() != expected:
        raise LockError(f"{uv}: reports {probe.stdout.strip()!r}, expected {expected!r}")
    return uv


def uv_platform(platform: str) -> str:
    """uv's ``--python-platform`` for a lock platform (``any`` resolves as linux_x86_64)."""
    arch = "x86_64" if platform == TOOLS else platform.removeprefix("linux_")
    return f"{arch}-manylinux_{GLIBC[0]}_{GLIBC[1]}"


def uv_compile(
    uv: Path, workdir: Path, inputs: Sequence[Path], platform: str, index: str, previous: Path | None
) -> str:
    """Run ``uv pip compile`` in ``workdir`` on ``inputs`` (relative paths) and return its output.

    ``previous`` (an existing lock) seeds the output file so that uv keeps its versions where it can.
    """
    output = workdir / "uv-output.txt"
    if previous is not None and previous.is_file():
        shutil.copyfile(previous, output)
    else:
        output.unlink(missing_ok=True)
    command = [
        str(uv), "pip", "compile", "--no-config", "--quiet", "--no-header",
        "--python-platform", uv_platform(platform),
        "--python-version", f"{PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}",
        "--generate-hashes", "--only-binary", ":all:",
        "--no-emit-index-url", "--no-emit-find-links",
        *(arg for name in EXCLUDED for arg in ("--no-emit-package", name)),
        "--output-file", output.name,
        *(str(p) for p in inputs),
    ]  # fmt: skip
    result = subprocess.run(
        # The index goes in the environment, not the command line: its URL may carry credentials.
        command,
        cwd=workdir,
        env={**uv_environment(), "UV_DEFAULT_INDEX": index},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise LockError(f"uv could not resolve for {platform}:\n{result.stderr.strip()}")
    return output.read_text(encoding="utf-8")


def lock_one(platform: str, uv_output: str, lister: Lister, directory: Path, header: Sequence[str]) -> int:
    """Check uv's output for ``platform``, write the lock and its sidecar; return the number of pins."""
    requirements, files = lock_paths(directory, platform)
    pins = parse_requirements(uv_output, f"uv's output for {platform}")
    locked = select_wheels(pins, platform, lister, requirements.name)
    write_atomically(requirements, render_requirements(locked, header))
    write_atomically(files, render_files(locked, platform, requirements.name))
    return len(locked)


def _header(platform: str, sources: Sequence[str], requirements: str) -> list[str]:
    return [
        "Generated by `sparkseal lock python`; do not edit.",
        f"Target: {describe_target(platform)}; resolved by uv {UV_VERSION} from:",
        *(f"  {s}" for s in sources),
        "One hash per pin: the wheel the target installs, named (with its filename) in",
        f"  {requirements.removesuffix('.txt')}.files.json.",
        *(["vllm is left out: the build supplies its own wheel."] if platform != TOOLS else []),
    ]


def lock_platforms(
    uv: Path,
    platforms: Sequence[str],
    directory: Path,
    vllm_lock: Path,
    download_dir: Path,
    index: str,
    lister: Lister,
    upgrade: bool = False,
) -> list[tuple[str, int]]:
    """Resolve and write the tool lock and the lock of each of ``platforms``; return (platform, pins) each."""
    sdist, version, sdist_sha256 = locked_sdist(vllm_lock, download_dir, index)
    written = []
    with tempfile.TemporaryDirectory(prefix="sparkseal-lock-python-") as scratch:
        work = Path(scratch)
        vllm_root = extract_vllm_requirements(sdist, version, work)
        # uv runs in the scratch directory on relative paths, so its `# via -r` notes name them as here.
        for name in (OURS, TOOLS_IN):
            (work / directory).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(directory / name, work / directory / name)
        jobs = [(TOOLS, [directory / TOOLS_IN], [str(directory / TOOLS_IN)])]
        sources = [f"{vllm_root} of {sdist.name} (sha256 {sdist_sha256})", str(directory / OURS)]
        jobs += [(platform, [vllm_root, directory / OURS], sources) for platform in platforms]
        for platform, inputs, described in jobs:
            requirements = lock_paths(directory, platform)[0]
            output = uv_compile(uv, work, inputs, platform, index, None if upgrade else requirements)
            count = lock_one(
                platform, output, lister, directory, _header(platform, described, requirements.name)
            )
            written.append((platform, count))
    return written


def lock_python(
    platforms: Sequence[str],
    directory: Path = DEFAULT_DIR,
    vllm_lock: Path = DEFAULT_VLLM_LOCK,
    download_dir: Path | None = None,
    index: str | None = None,
    upgrade: bool = False,
) -> int:
    """Write ``uv.txt``, install uv, then lock the build tools and ``platforms``; return the exit status."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkseal"
    try:
        index = index or index_url()
        lister = functools.cache(lambda project: list_files(project, index))
        uv_lock = directory / "uv.txt"
        write_atomically(uv_lock, render_uv_lock(lock_exact("uv", UV_VERSION, UV_HOSTS, lister)))
        print(f"wrote {uv_lock}")
        uv = ensure_uv(uv_lock, cache / f"uv-{UV_VERSION}", index)
        results = lock_platforms(
            uv, platforms, directory, vllm_lock, download_dir or cache / "downloads", index, lister, upgrade
        )
    except (FetchError, LockError, OSError, subprocess.CalledProcessError) as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    for platform, count in results:
        requirements, files = lock_paths(directory, platform)
        print(f"wrote {requirements} and {files.name}: {count} pins for {platform}")
    return 0
