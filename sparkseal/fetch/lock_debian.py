"""Lock the Debian packages of the image's base OS, and turn a locked package into its download URL.

``lock_debian`` asks apt for the dependency closure of ``ROOTS`` (Depends and Pre-Depends; apt picks
alternatives and providers of virtual packages as it would for ``apt-get install --no-install-recommends``
on an empty system) and writes ``third_party/debian/bookworm_<arch>.lock.json``. apt runs with a private
state directory (package lists, an empty dpkg status, the target architecture only): the machine's dpkg
state is never read or changed, and no ``dpkg --add-architecture`` is needed. The apt sources are the
machine's own, or those of a file named by ``--sources`` / ``$SPARKSEAL_APT_SOURCES`` (a snapshot of the
archive, say); no archive host is written into the lock.

Repository rules run ``python3 -m sparkseal.fetch.lock_debian uris ...`` (standard library only): it
prints the URL apt would download each locked package from, after checking that the sha256 and size apt's
signed index lists are the locked ones. The download itself, and the final sha256 check, are Bazel's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sparkseal.core.files import write_atomically
from sparkseal.core.platforms import DEBIAN_ARCHITECTURES

SUITE = "bookworm"
ARCHITECTURES = tuple(sorted(DEBIAN_ARCHITECTURES.values()))
LOCK_FORMAT = 1
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
_SHA256 = re.compile(r"[0-9a-f]{64}")
_URI_LINE = re.compile(r"^'(?P<url>[^']+)' (?P<local>\S+) (?P<size>\d+) (?P<hash>\S+)$")


class AptError(Exception):
    """apt failed, or what it reports does not allow writing (or honouring) a lock."""


@dataclass(frozen=True)
class LockedDeb:
    """One locked Debian package: the file apt would download, with its size and sha256."""

    package: str
    version: str
    architecture: str
    filename: str
    sha256: str
    size: int

    def as_json(self) -> dict[str, Any]:
        """The lock entry of this package."""
        return {
            "architecture": self.architecture,
            "filename": self.filename,
            "package": self.package,
            "sha256": self.sha256,
            "size": self.size,
            "version": self.version,
        }

    @property
    def request(self) -> str:
        """``package:arch=version``, the form apt takes for exactly this file."""
        return f"{self.package}:{self.architecture}={self.version}"


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
            attrs = dict(part.split("=", 1) for part in fields[len("release ") :].split(",") if "=" in part)
            found.add(attrs.get("n", ""))
        return sorted(found)

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


def _locked_debs(apt: PrivateApt, closure: list[tuple[str, str, str]]) -> list[LockedDeb]:
    requests = {f"{p}:{apt.arch}={v}": (p, v, a) for p, v, a in closure}
    wanted = set(requests.values())
    debs = {}
    for record in apt.records(sorted(requests)):
        key = (record.get("Package", ""), record.get("Version", ""), record.get("Architecture", ""))
        if key not in wanted:
            continue
        sha256 = record.get("SHA256", "")
        if (
            not _SHA256.fullmatch(sha256)
            or not record.get("Size", "").isdigit()
            or not record.get("Filename")
        ):
            raise AptError(
                f"the apt index record of {key[0]}={key[1]} lacks Filename, Size or SHA256: {record}"
            )
        deb = LockedDeb(
            key[0], key[1], key[2], PurePosixPath(record["Filename"]).name, sha256, int(record["Size"])
        )
        if debs.setdefault(key, deb) != deb:
            raise AptError(f"apt lists two different files for {deb.request}: {debs[key]} and {deb}")
    missing = sorted(r for r, key in requests.items() if key not in debs)
    if missing:
        raise AptError(f"apt-cache show returned no index record for {', '.join(missing)}")
    return sorted(debs.values(), key=lambda d: (d.package, d.architecture))


def lock_document(arch: str, roots: list[str], debs: list[LockedDeb]) -> dict[str, Any]:
    """The lock's JSON document."""
    return {
        "architecture": arch,
        "format": LOCK_FORMAT,
        "generator": GENERATOR,
        "packages": [deb.as_json() for deb in debs],
        "roots": sorted(roots),
        "suite": SUITE,
    }


def dump_lock(document: dict[str, Any]) -> str:
    """The lock's text: sorted keys, two-space indent, one trailing newline."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def compute_lock(arch: str, roots: list[str], sources: Path | None = None) -> dict[str, Any]:
    """Ask apt for the closure of ``roots`` on ``arch`` and return the lock document."""
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
        debs = _locked_debs(apt, apt.closure(roots))
    return lock_document(arch, roots, debs)


def lock_debian(arch: str, out: Path, roots: list[str] | None = None, sources: Path | None = None) -> int:
    """Write the lock of ``roots`` (default ``ROOTS``) for ``arch`` to ``out``; return the exit status."""
    chosen = sorted(ROOTS) if roots is None else roots
    try:
        document = compute_lock(arch, chosen, sources)
    except AptError as exc:
        print(f"sparkseal: {out}: {exc}", file=sys.stderr)
        return 1
    text = dump_lock(document)
    unchanged = out.is_file() and out.read_text() == text
    if not unchanged:
        write_atomically(out, text)
    packages = document["packages"]
    size = sum(p["size"] for p in packages)
    state = "unchanged" if unchanged else "written"
    print(f"{out}: {len(packages)} packages for {arch}, {size} bytes of .debs ({state})")
    return 0


def read_lock(path: Path) -> tuple[str, list[LockedDeb]]:
    """Return the architecture and the packages of the lock at ``path``; raise ``AptError`` if malformed."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AptError(f"{path}: cannot read the lock: {exc}") from exc
    arch = document.get("architecture") if isinstance(document, dict) else None
    if arch not in ARCHITECTURES:
        raise AptError(f"{path}: expected architecture one of {', '.join(ARCHITECTURES)}, got {arch!r}")
    debs = []
    for entry in document.get("packages", []):
        try:
            deb = LockedDeb(**{k: entry[k] for k in LockedDeb.__dataclass_fields__})
        except (KeyError, TypeError) as exc:
            raise AptError(f"{path}: malformed package entry {entry!r}: missing {exc}") from exc
        if not _SHA256.fullmatch(str(deb.sha256)):
            raise AptError(f"{path}: {deb.package}: sha256 {deb.sha256!r} is not 64 lowercase hex digits")
        debs.append(deb)
    if not debs:
        raise AptError(f"{path}: expected a non-empty list of packages, got {document.get('packages')!r}")
    return arch, debs


def resolve_uris(
    lock: Path, packages: list[str], scratch: Path, sources: Path | None = None
) -> dict[str, str]:
    """Package -> download URL for the named locked ``packages`` (all of them when empty).

    apt's index (signed by the archive) must list the locked size and sha256 for each file; otherwise the
    error names the package, the locked value and apt's.
    """
    arch, debs = read_lock(lock)
    by_name = {deb.package: deb for deb in debs}
    unknown = sorted(set(packages) - set(by_name))
    if unknown:
        raise AptError(f"{lock}: no locked package named {', '.join(unknown)}")
    wanted = [by_name[name] for name in sorted(set(packages))] if packages else debs
    apt = PrivateApt(arch, scratch, sources)
    apt.update()
    try:
        uris = apt.uris([deb.request for deb in wanted])
    except AptError as exc:
        raise AptError(
            f"{lock}: {exc}. The apt sources no longer carry a locked version: re-lock with "
            f"`sparkseal lock debian --arch {arch}`, or point ${SOURCES_ENV} at an apt sources file "
            "for a snapshot of the archive"
        ) from exc
    result = {}
    for deb in wanted:
        if deb.filename not in uris:
            raise AptError(f"{lock}: {deb.request}: apt printed no download URI for {deb.filename}")
        url, size, digest = uris[deb.filename]
        listed = digest.split(":", 1)[1].lower() if digest.startswith("SHA256:") else None
        if listed != deb.sha256 or size != deb.size:
            raise AptError(
                f"{lock}: {deb.request}: sha256 mismatch: expected {deb.sha256} ({deb.size} bytes, locked), "
                f"actual {listed or digest} ({size} bytes, listed by the apt sources)"
            )
        result[deb.package] = url
    return result


def _default_sources() -> Path | None:
    value = os.environ.get(SOURCES_ENV, "").strip()
    return Path(value) if value else None


def main(argv: list[str] | None = None) -> int:
    """``uris`` subcommand for repository rules: print ``package<TAB>url`` lines; exit 1 on failure."""
    parser = argparse.ArgumentParser(prog="python3 -m sparkseal.fetch.lock_debian")
    commands = parser.add_subparsers(dest="command", required=True)
    uris = commands.add_parser("uris", help="print the download URL of locked packages")
    uris.add_argument("--lock", type=Path, required=True, help="a bookworm_<arch>.lock.json")
    uris.add_argument("--scratch", type=Path, required=True, help="a directory for apt's private state")
    uris.add_argument("packages", nargs="*", help="locked package names (default: all)")
    args = parser.parse_args(argv)
    try:
        resolved = resolve_uris(args.lock, args.packages, args.scratch, _default_sources())
    except AptError as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    for package, url in sorted(resolved.items()):
        print(f"{package}\t{url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
