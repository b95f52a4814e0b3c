"""Unpack a locked build toolchain (.debs) into a repository: the interpreter or compiler of the actions.

A repository rule (``rules/private/toolchains.bzl``) runs ``python3 -m sparkseal.fetch.toolchain_root``
once the locked .debs are fetched and verified. The result is a function of the .debs alone, so its files
(and the action keys they enter) are the same on every host:

- ``root/``: each package's ``data.tar`` as ``dpkg-deb -x`` lays it out (no merged /usr, so a compiler
  given ``--sysroot=root`` finds ``root/lib/...`` where the C library's linker scripts say), without
  documentation; absolute symlinks are turned relative, so nothing points into the host's ``/``;
- ``lib/``: a link to every shared library of the root except those of ``--host-libc`` packages. That
  folder alone goes on ``LD_LIBRARY_PATH``: the toolchain's programs load the locked zlib, OpenSSL, libffi,
  libisl, … but always the host's own C library and dynamic loader, which must come as a pair;
- ``packages.json``: name, version, architecture and sha256 of every .deb, for provenance.

Standard library, ``sparkseal.core`` and the data members both unpackers read
(``sparkseal.install.debian_rootfs``) only: the host's ``python3`` (any version from 3.9) runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import posixpath
import shutil
import sys
from pathlib import Path, PurePosixPath

from sparkseal.core.deb import DROP_POLICIES, DebError, read_members
from sparkseal.core.determinism import EXEC_MODE, FILE_MODE
from sparkseal.install.debian_rootfs import check_against_lock, check_link_target, data_members, read_control

# What no tool reads (documentation, manuals, translations, ...): skipping it keeps the repository (and the
# action inputs) small.
DROPPED = DROP_POLICIES["toolchain"]
# Directories whose shared libraries go into lib/ (per multiarch triplet).
LIBRARY_DIRS = ("lib/{triplet}", "usr/lib/{triplet}")


class ToolchainError(Exception):
    """A .deb is not the locked one, is unsafe to unpack, or two packages disagree about a path."""


def _relative_target(path: PurePosixPath, target: str) -> str:
    """``target`` of the link at ``path`` as a path relative to the link's folder, inside the root."""
    if not target.startswith("/"):
        return target
    return posixpath.relpath(target.lstrip("/"), path.parent.as_posix() or ".")


class Unpacker:
    """Lays out the data of several .debs in one root; refuses clashes between packages."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.owners: dict[PurePosixPath, tuple[str, str]] = {}  # path -> (package, digest or link target)
        self.links: dict[PurePosixPath, str] = {}

    def add(self, deb: Path, package: str, members: dict[str, bytes]) -> None:
        """Unpack the ``data.tar`` of ``deb`` (of ``package``): its files and links (a folder comes with
        what it holds; an empty one no tool needs)."""
        for member in data_members(deb, members, DROPPED):
            rel, info, where = member.path, member.info, member.where
            if info.issym():
                check_link_target(rel, info.linkname, where)
                self._claim(rel, package, "link:" + info.linkname, where)
                self.links[rel] = _relative_target(rel, info.linkname)
            elif member.content is not None:  # a file or a hard link, not a folder
                digest = hashlib.sha256(member.content).hexdigest()
                if self._claim(rel, package, digest, where):
                    target = self.root.joinpath(*rel.parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(member.content)
                    target.chmod(EXEC_MODE if info.mode & 0o111 else FILE_MODE)

    def _claim(self, rel: PurePosixPath, package: str, what: str, where: str) -> bool:
        """Record ``rel``; False when another package already wrote the same thing there."""
        previous = self.owners.get(rel)
        if previous is None:
            self.owners[rel] = (package, what)
            return True
        if previous[1] != what:
            raise ToolchainError(
                f"{where}: /{rel} of {package} differs from the one {previous[0]} ships "
                f"(expected {previous[1]}, got {what})"
            )
        return False

    def write_links(self) -> None:
        """Create the symlinks last (relative targets); drop those that end nowhere (a link to a file of a
        package outside the lock), however many links the chain has."""
        for rel, target in sorted(self.links.items()):
            path = self.root.joinpath(*rel.parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, path)
        for rel in sorted(self.links):
            path = self.root.joinpath(*rel.parts)
            if not path.exists():
                path.unlink()
                del self.owners[rel]


def library_links(
    root: Path, out: Path, triplet: str, owners: dict[PurePosixPath, tuple[str, str]], host_libc: set[str]
) -> list[str]:
    """Link every shared library of ``root`` (but the host C library's) into ``out``; return the names."""
    out.mkdir()
    names = []
    for pattern in LIBRARY_DIRS:
        folder = root / pattern.format(triplet=triplet)
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            rel = PurePosixPath(path.relative_to(root).as_posix())
            owner = owners.get(rel, ("", ""))[0]
            if ".so" not in path.name or owner in host_libc or not path.exists() or path.is_dir():
                continue
            if (out / path.name).exists():
                continue
            os.symlink(os.path.relpath(path, out), out / path.name)
            names.append(path.name)
    return names


def unpack(
    debs: list[Path], lock: Path, out: Path, triplet: str, skip: set[str], host_libc: set[str]
) -> None:
    """Unpack ``debs`` (exactly the packages ``lock`` lists, by sha256) into ``out``."""
    entries = check_against_lock(debs, lock)
    unpacker = Unpacker(out / "root")
    packages = []
    for deb in sorted(debs, key=lambda d: d.name):
        entry = entries[deb.name]
        members = read_members(deb)
        package = read_control(deb, members).name
        if package != entry.package:
            raise ToolchainError(f"{deb}: expected package {entry.package} ({lock}), got {package}")
        packages.append({k: getattr(entry, k) for k in ("package", "version", "architecture", "sha256")})
        if package not in skip:
            unpacker.add(deb, package, members)
    unpacker.write_links()
    library_links(out / "root", out / "lib", triplet, unpacker.owners, host_libc)
    text = json.dumps(packages, indent=2, sort_keys=True) + "\n"
    (out / "packages.json").write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sparkseal.fetch.toolchain_root", description=__doc__)
    parser.add_argument("--lock", type=Path, required=True, help="the toolchain's Debian lock")
    parser.add_argument("--out", type=Path, required=True, help="an empty or missing folder to fill")
    parser.add_argument("--triplet", required=True, help="multiarch triplet, e.g. x86_64-linux-gnu")
    parser.add_argument("--skip", action="append", default=[], help="a locked package not to unpack")
    parser.add_argument(
        "--host-libc", action="append", default=[], help="a package whose libraries stay off lib/"
    )
    parser.add_argument("debs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.out.exists() and any(args.out.iterdir()):
        print(f"sparkseal: --out {args.out}: expected an empty folder, it has files", file=sys.stderr)
        return 2
    partial = args.out.with_name(args.out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        unpack(args.debs, args.lock, partial, args.triplet, set(args.skip), set(args.host_libc))
    except (ToolchainError, DebError, OSError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    if args.out.exists():
        args.out.rmdir()
    partial.rename(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
