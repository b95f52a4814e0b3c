"""Lock the Debian packages of the image's base OS (and of the build's toolchains), and read such a lock.

``lock_debian`` asks apt for the dependency closure of ``ROOTS`` (Depends and Pre-Depends; apt picks
alternatives and providers of virtual packages as it would for ``apt-get install --no-install-recommends``
on an empty system) and writes ``third_party/debian/bookworm_<arch>.lock.json``. apt runs with a private
state directory (package lists, an empty dpkg status, the target architecture only): the machine's dpkg
state is never read or changed, and no ``dpkg --add-architecture`` is needed. The apt sources are the
machine's own, or those of a file named by ``--sources`` / ``$SPARKSEAL_APT_SOURCES`` (a snapshot of the
archive, say).

This is the one place apt runs. Each lock entry carries what a fetch needs on any host: the file's path
in its archive (Debian's ``Filename``, ``pool/main/...``), the archive's name (the ``Label`` of the
Release file that listed it, lower-cased: ``debian``, ``debian-security``) and a time stamp at which
Debian's snapshot archive holds the same file (``sparkseal.fetch.debian_snapshot``: found through its
API and checked by sha256 when the lock is written), never an archive host; the fetch
(``sparkseal.fetch.debian_archive`` and Bazel's downloader) joins the path to the base URL the build
machine configures for that archive, then to the snapshot archive's at that time stamp, with no apt, no
apt sources and no keyring.

The lock's schema is ``sparkseal.core.locks``' (kind ``debian``), which reads it for every Python
consumer and checks what this module writes (``render_lock``); ``rules/private/locks.bzl`` reads the same
schema in Starlark.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path, PurePosixPath
from typing import Any

from sparkseal.core.files import write_atomically
from sparkseal.core.locks import (
    ARCHITECTURES,
    ARCHIVE_NAME,
    DEBIAN_OLDER_FORMATS,
    FORMATS,
    DebianPackage,
    LockError,
    is_sha256,
    read_debian_lock,
    render_lock,
)
from sparkseal.fetch.debian_snapshot import SNAPSHOT_ENV, LockedFile, SnapshotError, first_seen

SUITE = "bookworm"
# The formats `--keep-versions` reads (it adds what the older ones lack without changing a version or sha256).
_KEPT_FORMATS = (FORMATS["debian"], *DEBIAN_OLDER_FORMATS)
SOURCES_ENV = "SPARKSEAL_APT_SOURCES"
GENERATOR = "sparkseal lock debian"

# The packages the image asks for; apt adds their Depends and Pre-Depends. Each is here for a reason.
ROOTS: dict[str, str] = {
    "base-files": "/etc/os-release (image scanners identify the OS by it) and the FHS skeleton (/tmp, /root)",
    "libc6": "the C library every binary in the image links",
    "libc-bin": "/sbin/ldconfig: Triton runs `ldconfig -p` to find libcuda.so.1, and the NVIDIA container "
    "runtime refreshes the loader cache with it after mounting the driver",
    "libstdc++6": "NEEDED by vLLM's extension modules, torch and Triton (manylinux wheels do not bundle it)",
    "libgcc-s1": "NEEDED by vLLM's extension modules, torch and Triton",
    "zlib1g": "NEEDED by Triton's libtriton.so",
    "python3.11": "the interpreter of the image (python3.11-minimal and libpython3.11-stdlib come with it)",
    "python3": "the /usr/bin/python3 link that entry points and `#!/usr/bin/python3` scripts use",
    "ca-certificates": "TLS trust roots for model downloads",
    "tzdata": "time zone data for Python's zoneinfo and /etc/localtime",
    "dash": "/bin/sh for subprocess(shell=True), os.system and os.popen (torch's collect_env uses them)",
    "gcc": "Triton compiles its CUDA driver and launcher stubs with gcc when a kernel first runs",
    "libc6-dev": "crt files and libc.so that gcc needs to link Triton's stubs (only a Recommends of gcc)",
    "libpython3.11-dev": "Python.h, which Triton's stubs include from sysconfig's include directory",
}

# The build toolchains, locked like the image's packages but unpacked on the build host by a repository
# rule (rules/private/toolchains.bzl) instead of going into the image: every action runs this interpreter,
# and the kernels action compiles its host code with this compiler, against this C library's headers.
PYTHON_ROOTS: dict[str, str] = {
    "python3.11-minimal": "the interpreter of every build action: the image's own CPython, so the "
    "bytecode an action writes is what the image runs",
    "libpython3.11-stdlib": "the rest of the standard library (zlib, lzma, bz2, hashlib, ssl, ctypes) "
    "and the shared libraries it loads; the locked zlib pins every compressor's bytes",
}
CC_ROOTS: dict[str, str] = {
    "g++-12": "the host compiler of nvcc and of the kernels' C++ (with binutils, libc6-dev and "
    "linux-libc-dev: the C library and kernel headers compiled against)",
}
# On an amd64 build host the linux_aarch64 kernels wheel is cross-compiled (no such cross tools on arm64).
CC_CROSS_ROOTS: dict[str, str] = {
    "g++-12-aarch64-linux-gnu": "the cross compiler of the linux_aarch64 kernels wheel on an amd64 host, "
    "with binutils-aarch64-linux-gnu and the arm64 cross C library, libstdc++ and kernel headers",
}
KINDS = ("image", "python", "cc")


def roots_of(kind: str, arch: str) -> dict[str, str]:
    """The root packages (name -> why) a lock of ``kind`` holds for ``arch``."""
    if kind == "image":
        return ROOTS
    if kind == "python":
        return PYTHON_ROOTS
    if kind == "cc":
        return {**CC_ROOTS, **(CC_CROSS_ROOTS if arch == "amd64" else {})}
    raise ValueError(f"unknown lock kind {kind!r}: expected one of {', '.join(KINDS)}")


_INST = re.compile(
    r"^Inst (?P<package>[^\s:]+)(?::\S+)? (?:\[[^\]]*\] )?\((?P<version>\S+) .*\[(?P<arch>[^\]]+)\]\)"
)
_URI_LINE = re.compile(r"^'(?P<url>[^']+)' (?P<local>\S+) (?P<size>\d+) (?P<hash>\S+)$")
# `apt-cache policy`: a package file's line (priority, base URI, distribution, ...) and its release line.
_POLICY_FILE = re.compile(r"^\s*-?\d+ (?P<uri>\S+) \S+.* Packages$")


class AptError(Exception):
    """apt failed, or what it reports does not allow writing (or honouring) a lock."""


def _request(deb: DebianPackage) -> str:
    """``package:arch=version``, the form apt takes for exactly this file."""
    return f"{deb.package}:{deb.architecture}={deb.version}"


def _located(deb: DebianPackage) -> LockedFile:
    """What the snapshot look-up needs of this package."""
    return LockedFile(deb.package, deb.version, deb.filename, deb.archive, deb.path, deb.size, deb.sha256)


def _private_config(arch: str, state: Path, sources: Path | None) -> str:
    lines = [
        # Only the target architecture, whatever the machine's dpkg or apt configuration lists.
        "#clear APT::Architectures;",
        # No hooks of the machine's configuration (cache cleaners, AppStream refresh) act on its state.
        "#clear APT::Update::Pre-Invoke;",
        "#clear APT::Update::Post-Invoke;",
        "#clear APT::Update::Post-Invoke-Success;",
        "#clear DPkg::Pre-Invoke;",
        "#clear DPkg::Post-Invoke;",
        f'APT::Architecture "{arch}";',
        f'APT::Architectures {{ "{arch}"; }};',
        f'Dir::State::Lists "{state / "lists"}";',
        f'Dir::State::status "{state / "status"}";',
        f'Dir::State::extended_states "{state / "extended_states"}";',
        f'Dir::Cache "{state / "cache"}";',
        'Debug::NoLocking "true";',
        'Acquire::Languages "none";',
        'APT::Install-Recommends "false";',
        'APT::Install-Suggests "false";',
    ]
    if os.geteuid() == 0:
        # The private lists directory belongs to root; apt's download sandbox user could not write it.
        lines.append('APT::Sandbox::User "root";')
    if sources is not None:
        lines += [f'Dir::Etc::SourceList "{sources}";', f'Dir::Etc::SourceParts "{state / "sources.d"}";']
    return "\n".join(lines) + "\n"


def _release_attrs(line: str) -> dict[str, str]:
    """The ``key=value`` attributes of an ``apt-cache policy`` ``release ...`` line."""
    return dict(part.split("=", 1) for part in line[len("release ") :].split(",") if "=" in part)


class PrivateApt:
    """apt for one target architecture with its own state under ``state`` (a scratch directory)."""

    def __init__(self, arch: str, state: Path, sources: Path | None = None) -> None:
        if arch not in ARCHITECTURES:
            raise AptError(f"architecture {arch!r} is not one of {', '.join(ARCHITECTURES)}")
        if sources is not None and not sources.is_file():
            raise AptError(f"apt sources file {sources} does not exist")
        self.arch = arch
        for sub in ("lists/partial", "cache/archives/partial", "sources.d"):
            (state / sub).mkdir(parents=True, exist_ok=True)
        (state / "status").write_text("")
        self.config = state / "apt.conf"
        self.config.write_text(_private_config(arch, state.resolve(), sources.resolve() if sources else None))

    def run(self, tool: str, *args: str) -> str:
        """Run ``tool -c <private config> args`` and return its stdout; raise ``AptError`` on failure."""
        command = [tool, "-c", str(self.config), *args]
        env = {**os.environ, "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
        try:
            proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        except FileNotFoundError as exc:
            raise AptError(f"{tool} is not installed: {exc}") from exc
        errors = [line for line in proc.stderr.splitlines() if line.startswith(("E:", "W: Failed to fetch"))]
        if proc.returncode != 0 or errors:
            unmet = [line.strip() for line in proc.stdout.splitlines() if "Depends:" in line]
            detail = "; ".join(errors + unmet) or proc.stderr.strip() or f"exit status {proc.returncode}"
            raise AptError(
                f"`{' '.join([tool, *args[:6]])}{' ...' if len(args) > 6 else ''}` failed: {detail}"
            )
        return proc.stdout

    def update(self) -> None:
        """Fetch the package lists of the configured sources for the target architecture."""
        self.run("apt-get", "-q", "update")

    def codenames(self) -> list[str]:
        """The release codenames (``n=`` of ``apt-cache policy``) of every configured source."""
        found = set()
        for line in self.run("apt-cache", "policy").splitlines():
            fields = line.strip()
            if not fields.startswith("release ") or fields == "release a=now":
                continue
            found.add(_release_attrs(fields).get("n", ""))
        return sorted(found)

    def labels(self) -> dict[str, set[str]]:
        """Base URI -> the Release ``Label`` of every configured package file under it (``l=`` of
        ``apt-cache policy``; an empty string for a Release file without one)."""
        found: dict[str, set[str]] = {}
        uri = None
        for line in self.run("apt-cache", "policy").splitlines():
            match = _POLICY_FILE.match(line)
            if match:
                uri = match["uri"].rstrip("/")
                found.setdefault(uri, set())
                continue
            fields = line.strip()
            if uri is not None and fields.startswith("release "):
                attrs = dict(
                    part.split("=", 1) for part in fields[len("release ") :].split(",") if "=" in part
                )
                found[uri].add(attrs.get("l", ""))
                uri = None
        return found

    def closure(self, roots: list[str]) -> list[tuple[str, str, str]]:
        """``(package, version, architecture)`` of everything apt would install for ``roots``."""
        out = self.run("apt-get", "install", "--simulate", "--no-install-recommends", *roots)
        found = [(m["package"], m["version"], m["arch"]) for m in map(_INST.match, out.splitlines()) if m]
        if not found:
            raise AptError(f"apt lists nothing to install for {' '.join(roots)}")
        return sorted(found)

    def records(self, requests: list[str]) -> list[dict[str, str]]:
        """The index records (``apt-cache show``) of ``package:arch=version`` requests."""
        return _paragraphs(self.run("apt-cache", "show", "--no-all-versions", *requests))

    def uris(self, requests: list[str]) -> dict[str, tuple[str, int, str]]:
        """Pool basename -> (URL, size, hash as apt prints it) for ``package:arch=version`` requests."""
        result = {}
        for line in self.run("apt-get", "download", "--print-uris", *requests).splitlines():
            match = _URI_LINE.match(line.strip())
            if match:
                url = match["url"]
                name = urllib.parse.unquote(PurePosixPath(urllib.parse.urlsplit(url).path).name)
                result[name] = (url, int(match["size"]), match["hash"])
        return result


def _paragraphs(text: str) -> list[dict[str, str]]:
    records = []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        if fields:
            records.append(fields)
    return records


def _locked_debs(apt: PrivateApt, closure: list[tuple[str, str, str]]) -> list[DebianPackage]:
    requests = {f"{p}:{apt.arch}={v}": (p, v, a) for p, v, a in closure}
    wanted = set(requests.values())
    debs = {}
    for record in apt.records(sorted(requests)):
        key = (record.get("Package", ""), record.get("Version", ""), record.get("Architecture", ""))
        if key not in wanted:
            continue
        sha256 = record.get("SHA256", "")
        if not is_sha256(sha256) or not record.get("Size", "").isdigit() or not record.get("Filename"):
            raise AptError(
                f"the apt index record of {key[0]}={key[1]} lacks Filename, Size or SHA256: {record}"
            )
        path = _pool_path(record["Filename"])
        if path is None:
            raise AptError(
                f"the apt index record of {key[0]}={key[1]}: expected a relative Filename of a .deb "
                f"without '..', actual {record['Filename']!r}"
            )
        # The archive is named once the URL apt downloads it from is known (_name_archives).
        deb = DebianPackage(
            key[0], key[1], key[2], PurePosixPath(path).name, sha256, int(record["Size"]), "", path
        )
        if debs.setdefault(key, deb) != deb:
            raise AptError(f"apt lists two different files for {_request(deb)}: {debs[key]} and {deb}")
    missing = sorted(r for r, key in requests.items() if key not in debs)
    if missing:
        raise AptError(f"apt-cache show returned no index record for {', '.join(missing)}")
    return sorted(debs.values(), key=lambda d: (d.package, d.architecture))


def _pool_path(filename: str) -> str | None:
    """The ``Filename`` of an index record as a clean relative path (``./x.deb`` of a flat repository
    gives ``x.deb``), or None when it is absolute, climbs with ``..`` or names no .deb."""
    parts = [part for part in filename.split("/") if part not in ("", ".")]
    if filename.startswith("/") or ".." in parts or not parts or not parts[-1].endswith(".deb"):
        return None
    return "/".join(parts)


def _archive_name(label: str) -> str:
    return label.strip().lower().replace(" ", "-")


def _name_archives(apt: PrivateApt, debs: list[DebianPackage]) -> list[DebianPackage]:
    """``debs`` with ``archive`` set: the Label of the Release file of the source apt downloads each from.

    apt names the URL of each file (its base URI + the locked path); the base URI's Release files give the
    label. Suites of one archive (bookworm, bookworm-updates) share base and label; another label under
    the same base, or none, cannot name an archive and is an error.
    """
    labels = apt.labels()
    uris = apt.uris([_request(deb) for deb in debs])
    named = []
    for deb in debs:
        if deb.filename not in uris:
            raise AptError(f"{_request(deb)}: apt printed no download URI for {deb.filename}")
        url = urllib.parse.unquote(uris[deb.filename][0])
        if not url.endswith("/" + deb.path):
            raise AptError(f"{_request(deb)}: expected apt's URL to end with /{deb.path}, actual {url}")
        base = url[: -len(deb.path) - 1].rstrip("/")
        found = sorted(labels.get(base, set()))
        names = sorted({_archive_name(label) for label in found})
        if len(names) != 1 or not ARCHIVE_NAME.fullmatch(names[0]):
            raise AptError(
                f"{_request(deb)}: expected the Release files under {base} to carry one Label that names "
                f"the archive (such as Debian or Debian-Security), actual {found or 'no package file'}"
            )
        named.append(dataclasses.replace(deb, archive=names[0]))
    return named


def lock_document(arch: str, roots: list[str], debs: list[DebianPackage]) -> dict[str, Any]:
    """The lock's JSON document."""
    return {
        "architecture": arch,
        "generator": GENERATOR,
        "packages": [dataclasses.asdict(deb) for deb in debs],
        "roots": sorted(roots),
        "suite": SUITE,
    }


def dump_lock(document: dict[str, Any], where: object) -> str:
    """The text of the lock to be written at ``where``, in the current format, checked by the reader."""
    return render_lock("debian", document, where)


def with_snapshots(
    debs: list[DebianPackage], snapshot: str | None, keep: list[DebianPackage] | None = None
) -> list[DebianPackage]:
    """``debs`` with ``snapshot`` set: a kept entry's own time stamp for the same file, else the snapshot
    archive's first import of the file (sparkseal.fetch.debian_snapshot.first_seen, checked by sha256)."""
    kept = {(d.package, d.architecture, d.sha256): d.snapshot for d in keep or [] if d.snapshot}
    result = []
    for deb in debs:
        timestamp = kept.get((deb.package, deb.architecture, deb.sha256))
        if timestamp is None:
            if snapshot is None:
                raise AptError(
                    f"{_request(deb)}: no base URL of the snapshot archive to find its time stamp at: set "
                    f"${SNAPSHOT_ENV} (or pass --snapshot), or name a snapshot URL in the apt sources"
                )
            try:
                timestamp = first_seen(snapshot, _located(deb))
            except SnapshotError as exc:
                raise AptError(str(exc)) from exc
        result.append(dataclasses.replace(deb, snapshot=timestamp))
    return result


def compute_lock(
    arch: str,
    roots: list[str],
    sources: Path | None = None,
    keep: list[DebianPackage] | None = None,
    snapshot: str | None = None,
) -> dict[str, Any]:
    """Ask apt for the closure of ``roots`` on ``arch`` and return the lock document.

    With ``keep`` (the packages of an existing lock), apt resolves nothing: the document holds exactly
    those versions, with the paths and archives apt lists for them now, and each sha256 and size must be
    the kept one (a lock written before locks carried paths or time stamps gains them without any other
    change). ``snapshot``: the snapshot archive's base URL, where each new file's time stamp is looked up.
    """
    with tempfile.TemporaryDirectory(prefix="sparkseal-apt-") as scratch:
        apt = PrivateApt(arch, Path(scratch), sources)
        apt.update()
        codenames = apt.codenames()
        foreign = [name for name in codenames if name.split("-", 1)[0] != SUITE]
        if not codenames or foreign:
            raise AptError(
                f"the apt sources must all be {SUITE} (or {SUITE}-updates, {SUITE}-security), "
                f"got release codenames {codenames or 'none'}"
            )
        if keep is None:
            closure = apt.closure(roots)
        else:
            closure = sorted((deb.package, deb.version, deb.architecture) for deb in keep)
        debs = _name_archives(apt, _locked_debs(apt, closure))
    for old in keep or []:
        new = next(deb for deb in debs if (deb.package, deb.architecture) == (old.package, old.architecture))
        if (new.sha256, new.size) != (old.sha256, old.size):
            raise AptError(
                f"{_request(old)}: sha256 mismatch: expected {old.sha256} ({old.size} bytes, locked), actual "
                f"{new.sha256} ({new.size} bytes, listed by the apt sources)"
            )
    return lock_document(arch, roots, with_snapshots(debs, snapshot, keep))


def lock_debian(
    arch: str,
    out: Path,
    roots: list[str] | None = None,
    sources: Path | None = None,
    keep_versions: bool = False,
    snapshot: str | None = None,
) -> int:
    """Write the lock of ``roots`` (default ``ROOTS``) for ``arch`` to ``out``; return the exit status.

    ``keep_versions``: re-write the lock at ``out`` with its own roots and versions (compute_lock's
    ``keep``), so that only the paths, archives and time stamps it lacks are added. ``snapshot``: the
    snapshot archive's base URL (compute_lock).
    """
    chosen = sorted(ROOTS) if roots is None else roots
    try:
        keep = None
        if keep_versions:
            kept = read_debian_lock(out, formats=_KEPT_FORMATS)
            if kept.architecture != arch:
                raise AptError(f"{out}: expected a lock for {arch}, actual architecture {kept.architecture}")
            keep = list(kept.packages)
            chosen = list(kept.roots or chosen)
        document = compute_lock(arch, chosen, sources, keep, snapshot)
        text = dump_lock(document, out)
    except AptError as exc:
        print(f"sparkseal: {out}: {exc}", file=sys.stderr)
        return 1
    except LockError as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    unchanged = out.is_file() and out.read_text() == text
    if not unchanged:
        write_atomically(out, text)
    packages = document["packages"]
    size = sum(p["size"] for p in packages)
    state = "unchanged" if unchanged else "written"
    print(f"{out}: {len(packages)} packages for {arch}, {size} bytes of .debs ({state})")
    return 0
