"""Action: write one OCI layer deterministically: an uncompressed tar, its gzip or zstd blob and a descriptor.

Inputs are directory trees mapped to destination prefixes in the image, single files, links specs,
explicit directories and mode overrides. Inside Bazel's sandbox every input file is a symlink to the real
file, and Bazel marks every action output r-xr-xr-x, so a tree's own links and permission bits carry no
information there. Hence:

* a symlink in a tree that points to a regular file is read for its content (a sandbox link);
* real symlinks come only from a links spec (a JSON object ``{"relative/path": "target"}`` mapped to a
  prefix, written by the action that made the tree) or from ``--symlink``;
* a file is executable (0755) when its content starts with an ELF magic or ``#!``, otherwise 0644, the same
  inside and outside the sandbox; ``--mode`` overrides one path;
* empty directories of a tree are not written (the sandbox does not stage them, so they would make the
  layer depend on the spawn strategy): a dirs spec (``{"relative/path": {"mode": "0755", "uid": 0,
  "gid": 0}}``, written by the action that made the tree) or ``--dir`` declares directories explicitly.

The tar is POSIX ustar: entries sorted by path, every parent directory written explicitly (0755), owner
0:0 (a dirs spec may give a directory another owner) with empty user and group names, mtime
SOURCE_DATE_EPOCH, no hard links, no device files. A pax header is written only for a path, link target or
size that ustar cannot hold, and then holds only that record.

A layer of wheels (``--wheel``, with ``--platform``, ``--installer`` and ``--modules``) installs them
(``sparkseal.core.install``) into a scratch directory of the action, writes them as a tree at ``/`` and
writes the module manifest of their files to ``--modules``; the scratch directory is removed when the
layer is written, so the build keeps the compressed layer and not the installed files (several GB for
torch and the CUDA wheels). With ``--bytecode`` the installed sources are byte-compiled first
(``sparkseal.core.bytecode``: reproducible unchecked-hash pycs, listed in each RECORD and so in the module
manifest). The layer's bytes are those of the same wheels installed by ``wheel_install``
and written as a tree.

A layer of locked .debs (``--deb``, with ``--deb-lock``) unpacks them (``sparkseal.core.debian_rootfs``)
into a scratch directory the same way, and writes the tree, its links and directories at ``/``: the image
build keeps no unpacked root file system (it would be a second copy of the base layer in every cache).

With ``--split`` (a split file, ``sparkseal.core.wheel_split``) and ``--split-part``, the layer holds one
part of a distribution installed as two layers: ``lower`` installs the upstream wheel the split names and
leaves out the split's paths, their bytecode and the ``.dist-info``; ``upper`` installs our wheel and keeps
only those. Each part's module manifest names its own files, and the two merge into that of our wheel.

With ``--scanner`` the layer's files are scanned for secrets and private data (``sparkseal.core.scan``:
our rules and the locked Kingfisher catalogue's) before anything is written, where they lie: the
installed wheels in the scratch directory, the inputs through their sandbox links (the catalogue reads
hard links to them). Reading them there costs a fraction of decompressing the written layer again. A
finding the allow-list (``--scan-allow``, the image's: paths inside the image, entries for other layers
expected not to match) does not cover fails the action: the findings are printed redacted and no
output is written, so Bazel caches nothing for a layer that leaks. A clean layer also writes
``--scan-report``, which names the scanner.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from sparkseal.core.catalogue import Catalogue, CatalogueError
from sparkseal.core.debian_rootfs import EXCLUDE_PROFILES, DebError, build_rootfs
from sparkseal.core.determinism import (
    DIR_MODE,
    EXEC_MODE,
    FILE_MODE,
    GID,
    STICKY_DIR_MODE,
    UID,
)
from sparkseal.core.digests import sha256_file
from sparkseal.core.install import DEFAULT_PREFIX, InstallError, install_wheels, python_dirs, read_replaces
from sparkseal.core.manifest import ManifestError, dumps, tree_manifest
from sparkseal.core.oci import LAYER_MEDIA_TYPES
from sparkseal.core.paths import UnsafePath, check_relative
from sparkseal.core.pgzip import BLOCK_SIZE, DICTIONARY_SIZE, ParallelGzipWriter
from sparkseal.core.pzstd import BLOCK_SIZE as ZSTD_BLOCK_SIZE
from sparkseal.core.pzstd import LEVEL as ZSTD_LEVEL
from sparkseal.core.pzstd import ParallelZstdWriter, ZstdUnavailable, describe, load_zstandard
from sparkseal.core.repo_names import apparent_text
from sparkseal.core.scan import ScanInputError, apply_allowlist, load_allowlist, scan_files
from sparkseal.core.tar import SYMLINK_MODE, USTAR_ID_LIMIT, Digesting, TarError, TarWriter, Writable
from sparkseal.core.tree import content_mode
from sparkseal.core.wheel_split import LOWER, PARTS, UPPER, SplitError, WheelSplit, load_split
from sparkseal.core.wheels import PLATFORMS, WheelError

# gzip level of layer blobs. On the vLLM + torch trees (bench/results/compression.md) level 6 is 0.8% larger
# than level 9 for a quarter of its CPU time, and 12% smaller than level 1.
GZIP_LEVEL = 6
# What the blob's bytes depend on besides the tar (the worker count is not among them): recorded in the
# layer's descriptor so a rebuild can use the same settings. A zstd blob's also names the library.
COMPRESSION = {"format": "gzip", "level": GZIP_LEVEL, "block_size": BLOCK_SIZE, "dictionary": DICTIONARY_SIZE}
ZSTD_COMPRESSION = {
    "format": "zstd",
    "level": ZSTD_LEVEL,
    "block_size": ZSTD_BLOCK_SIZE,
    "frames": "per block",
}

DIR, FILE, LINK = "directory", "file", "symlink"
ALLOWED_MODES = {FILE: (FILE_MODE, EXEC_MODE), DIR: (DIR_MODE, STICKY_DIR_MODE)}

WHITEOUT_PREFIX = ".wh."  # OCI whiteout marker: such a file would delete paths of lower layers


class LayerError(Exception):
    """An input of the layer is unsafe, ambiguous or unsupported; the message names it."""


@dataclass(frozen=True)
class Entry:
    """One member of the layer, by image path (relative, no leading or trailing slash)."""

    path: str
    kind: str
    origin: str  # which input gave it, for error messages
    source: Path | None = None
    target: str = ""
    mode: int | None = None  # None: decided from the content (files) or DIR_MODE (directories)
    uid: int = UID
    gid: int = GID


def image_path(dest: str, where: str, *, allow_root: bool = False) -> str:
    """Normalise an absolute image path ``dest`` to a relative one ("" for the root when ``allow_root``)."""
    if not dest.startswith("/"):
        raise LayerError(f"{where}: destination {dest!r} must be an absolute image path (start with '/')")
    if dest.strip("/") in ("", ".") and allow_root:
        return ""
    try:
        return check_relative(dest.lstrip("/"), where).as_posix()
    except UnsafePath as exc:
        raise LayerError(str(exc)) from exc


def relative_path(rel: str, where: str) -> str:
    """Check a path inside an input (a links spec key) and return it normalised."""
    try:
        return check_relative(rel, where).as_posix()
    except UnsafePath as exc:
        raise LayerError(str(exc)) from exc


def join(prefix: str, rel: str) -> str:
    """Join a relative image path below a (possibly root, "") prefix."""
    return f"{prefix}/{rel}" if prefix else rel


def scan_tree(root: Path, prefix: str) -> Iterator[Entry]:
    """Yield the files of ``root`` placed under ``prefix``; fail on anything but files and directories."""
    if not root.is_dir():
        raise LayerError(f"tree {root}: expected a directory, found {_kind_of(root)}")
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise, followlinks=False):
        here = Path(dirpath)
        dirnames.sort()
        for name in dirnames:
            if (here / name).is_symlink():
                rel = (here / name).relative_to(root).as_posix()
                raise LayerError(
                    f"tree {root}: {rel} is a symlink to a directory (-> {os.readlink(here / name)}); "
                    f"expected a regular file or directory (declare links in a links spec)"
                )
        for name in sorted(filenames):
            path = here / name
            rel = path.relative_to(root).as_posix()
            try:
                info = path.stat()
            except FileNotFoundError:
                raise LayerError(
                    f"tree {root}: {rel} is a broken symlink (-> {os.readlink(path)}); "
                    f"expected a regular file"
                ) from None
            if not stat.S_ISREG(info.st_mode):
                raise LayerError(
                    f"tree {root}: {rel} is {_kind_of(path)}; a layer holds only regular files, "
                    f"directories and declared symlinks"
                )
            yield Entry(join(prefix, rel), FILE, f"tree {root} ({rel})", source=path)


def _raise(error: OSError) -> None:
    raise LayerError(f"tree: cannot list {error.filename}: {error.strerror}")


def _kind_of(path: Path) -> str:
    if not path.exists() and not path.is_symlink():
        return "nothing (no such path)"
    mode = path.stat().st_mode if path.exists() else path.lstat().st_mode
    for test, kind in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return kind
    return f"an unknown file type (mode {mode:o})"


def load_links(spec: Path, prefix: str) -> Iterator[Entry]:
    """Yield the symlinks of a links spec (``{"relative/path": "target"}``) placed under ``prefix``."""
    try:
        data = json.loads(spec.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LayerError(f"links spec {spec}: not a readable JSON object: {exc}") from exc
    if not isinstance(data, dict):
        raise LayerError(
            f"links spec {spec}: expected a JSON object of path -> target, got {type(data).__name__}"
        )
    for rel, target in sorted(data.items()):
        where = f"links spec {spec}: {rel}"
        if not isinstance(target, str):
            raise LayerError(f"{where}: expected a target string, got {target!r}")
        yield Entry(join(prefix, relative_path(rel, where)), LINK, where, target=target)


def load_dirs(spec: Path, prefix: str) -> Iterator[Entry]:
    """Yield the directories of a dirs spec (``{"relative/path": {"mode", "uid", "gid"}}``) at ``prefix``."""
    try:
        data = json.loads(spec.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LayerError(f"dirs spec {spec}: not a readable JSON object: {exc}") from exc
    if not isinstance(data, dict):
        raise LayerError(
            f"dirs spec {spec}: expected a JSON object of path -> attributes, got {type(data).__name__}"
        )
    for rel, attributes in sorted(data.items()):
        where = f"dirs spec {spec}: {rel}"
        if not isinstance(attributes, dict) or set(attributes) != {"mode", "uid", "gid"}:
            raise LayerError(f'{where}: expected {{"mode": "0755", "uid": 0, "gid": 0}}, got {attributes!r}')
        mode = parse_mode(str(attributes["mode"]), where)
        if mode not in ALLOWED_MODES[DIR]:
            raise LayerError(
                f"{where}: mode {mode:04o} is not allowed for a directory; expected 0755 or 1777"
            )
        for key in ("uid", "gid"):
            value = attributes[key]
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < USTAR_ID_LIMIT:
                raise LayerError(f"{where}: {key} {value!r} is not an id from 0 to {USTAR_ID_LIMIT - 1}")
        path = join(prefix, relative_path(rel, where))
        yield Entry(path, DIR, where, mode=mode, uid=attributes["uid"], gid=attributes["gid"])


def link_destination(path: str, target: str, where: str) -> str:
    """Resolve a symlink's target lexically inside the image; fail if it climbs above the root."""
    if not target or "\0" in target:
        raise LayerError(f"{where}: symlink target {target!r} is empty or contains a NUL byte")
    base = [] if target.startswith("/") else list(PurePosixPath(path).parent.parts)
    for part in PurePosixPath(target).parts:
        if part in ("/", "."):
            continue
        if part == "..":
            if not base:
                raise LayerError(
                    f"{where}: symlink /{path} -> {target} escapes the image root; "
                    f"expected a target inside the image"
                )
            base.pop()
        else:
            base.append(part)
    return "/".join(base)


def parse_mode(text: str, where: str) -> int:
    """Parse an octal mode such as ``0755``."""
    try:
        return int(text, 8)
    except ValueError:
        raise LayerError(f"{where}: mode {text!r} is not an octal number such as 0644") from None


class LayerPlan:
    """Collects entries from every input, refusing duplicates, and orders them for writing."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._modes: dict[str, tuple[int, str]] = {}

    def add(self, entry: Entry) -> None:
        """Add one entry; a path given twice (except a directory twice) is an error naming both inputs."""
        name = entry.path.rsplit("/", 1)[-1]
        if name.startswith(WHITEOUT_PREFIX):
            raise LayerError(
                f"{entry.origin}: /{entry.path} starts with {WHITEOUT_PREFIX!r}, which OCI runtimes read "
                f"as a whiteout (a deletion); expected an ordinary name"
            )
        other = self._entries.get(entry.path)
        if other is None:
            self._entries[entry.path] = entry
        elif other.kind != DIR or entry.kind != DIR:
            raise LayerError(
                f"/{entry.path}: given twice, as a {other.kind} by {other.origin} and as a {entry.kind} by "
                f"{entry.origin}; expected each image path from one input only"
            )
        elif _dir_attributes(other) != _dir_attributes(entry):
            raise LayerError(
                f"/{entry.path}: directory given twice with different attributes, "
                f"{_dir_attributes(other)} by {other.origin} and {_dir_attributes(entry)} by {entry.origin}"
            )

    def set_mode(self, path: str, mode: int, where: str) -> None:
        """Record an explicit mode for ``path`` (checked against the entry kind in ``entries``)."""
        if path in self._modes:
            raise LayerError(f"{where}: a mode for /{path} is already given by {self._modes[path][1]}")
        self._modes[path] = (mode, where)

    def entries(self) -> list[Entry]:
        """All entries with implied parents, final modes and safe links, in tree order."""
        entries = dict(self._entries)
        for entry in self._entries.values():
            if entry.kind == LINK:
                link_destination(entry.path, entry.target, entry.origin)
            parts = entry.path.split("/")
            for depth in range(1, len(parts)):
                parent = "/".join(parts[:depth])
                found = entries.get(parent)
                if found is None:
                    entries[parent] = Entry(parent, DIR, f"parent of /{entry.path}")
                elif found.kind != DIR:
                    raise LayerError(
                        f"{entry.origin}: /{entry.path} lies under /{parent}, which {found.origin} makes a "
                        f"{found.kind}; expected a directory there"
                    )
        for path, (mode, where) in self._modes.items():
            entry = entries.get(path)
            if entry is None:
                raise LayerError(f"{where}: /{path} is not in the layer; expected a file or directory of it")
            allowed = ALLOWED_MODES.get(entry.kind, ())
            if mode not in allowed:
                expected = " or ".join(f"{m:04o}" for m in allowed) or "no mode (symlinks have none)"
                raise LayerError(
                    f"{where}: mode {mode:04o} is not allowed for a {entry.kind}; expected {expected}"
                )
            entries[path] = replace(entry, mode=mode)
        final = []
        for entry in entries.values():
            if entry.mode is None:
                if entry.kind == FILE:
                    assert entry.source is not None
                    entry = replace(entry, mode=content_mode(entry.source))
                else:
                    entry = replace(entry, mode=DIR_MODE if entry.kind == DIR else SYMLINK_MODE)
            final.append(entry)
        return sorted(final, key=lambda e: e.path.split("/"))


def _dir_attributes(entry: Entry) -> str:
    return f"mode {entry.mode or DIR_MODE:04o} owner {entry.uid}:{entry.gid}"


def write_tar(entries: Iterable[Entry], stream: Writable, digests: dict[Path, str] | None = None) -> None:
    """Write ``entries`` (from ``LayerPlan.entries``, modes decided) as a complete tar to ``stream``.

    ``digests``, when given, receives the sha256 of every file written, by source path.
    """
    writer = TarWriter(stream)
    for entry in entries:
        assert entry.mode is not None
        if entry.kind == DIR:
            writer.directory(entry.path, entry.mode, entry.uid, entry.gid)
        elif entry.kind == LINK:
            writer.symlink(entry.path, entry.target)
        else:
            assert entry.source is not None
            digest = writer.file(entry.path, entry.mode, entry.source, sha256=digests is not None)
            if digests is not None and digest is not None:
                digests[entry.source] = digest
    writer.close()


def write_layer(
    entries: Iterable[Entry],
    tar_path: Path | None,
    blob_path: Path,
    digests: dict[Path, str] | None = None,
    zstandard: Any = None,
) -> dict[str, object]:
    """Write the blob (and the plain tar, when ``tar_path`` is given) in one pass; return the descriptor.

    Each file is read once: ``digests`` (see ``write_tar``) gets the content digests in the same pass.

    The blob is gzip unless ``zstandard`` (the imported python-zstandard module) is given. The gzip stream
    has mtime 0, no file name and level GZIP_LEVEL, so its bytes depend only on the tar and on the zlib of
    the Python that runs the action (the host python3 of the build toolchain); a zstd blob's depend on the
    tar and the locked zstandard wheel (``sparkseal.core.pzstd``). Either is compressed on every CPU the
    action may use, in blocks whose bytes do not depend on that number.
    """
    workers = len(os.sched_getaffinity(0))
    with contextlib.ExitStack() as stack:
        blob = Digesting(stack.enter_context(blob_path.open("wb")))
        if zstandard is None:
            compressed: Writable = ParallelGzipWriter(blob, GZIP_LEVEL, workers=workers)
            settings: dict[str, object] = COMPRESSION
        else:
            compressed = ParallelZstdWriter(blob, ZSTD_LEVEL, workers, zstandard)
            settings = {**ZSTD_COMPRESSION, "library": describe(zstandard)}
        stack.enter_context(compressed)  # type: ignore[arg-type]
        plain = [stack.enter_context(tar_path.open("wb"))] if tar_path is not None else []
        tar = Digesting(*plain, compressed)
        write_tar(entries, tar, digests)
    return {
        "diff_id": tar.digest,
        "digest": blob.digest,
        "mediaType": LAYER_MEDIA_TYPES[str(settings["format"])],
        "size": blob.size,
        "compression": settings,
    }


def plan_layer(
    trees: Iterable[tuple[Path, str]] = (),
    files: Iterable[tuple[Path, str]] = (),
    links: Iterable[tuple[Path, str]] = (),
    dirs: Iterable[tuple[Path, str]] = (),
    symlinks: Iterable[tuple[str, str]] = (),
    directories: Iterable[str] = (),
    modes: Iterable[tuple[str, str]] = (),
    keep: Callable[[str], bool] | None = None,
) -> list[Entry]:
    """Gather every input into the ordered entries of one layer (see the module docstring).

    ``keep`` (a predicate on image paths) leaves out the files of ``trees`` it refuses: the other part of
    a split distribution.
    """
    plan = LayerPlan()
    for root, dest in trees:
        for entry in scan_tree(root, image_path(dest, f"--tree {root}", allow_root=True)):
            if keep is None or keep(entry.path):
                plan.add(entry)
    for source, dest in files:
        where = f"--file {source}"
        if not source.is_file():
            raise LayerError(f"{where}: expected a regular file, found {_kind_of(source)}")
        plan.add(Entry(image_path(dest, where), FILE, where, source=source))
    for spec, dest in links:
        for entry in load_links(spec, image_path(dest, f"--links {spec}", allow_root=True)):
            plan.add(entry)
    for spec, dest in dirs:
        for entry in load_dirs(spec, image_path(dest, f"--dirs {spec}", allow_root=True)):
            plan.add(entry)
    for dest, target in symlinks:
        where = f"--symlink {dest}"
        plan.add(Entry(image_path(dest, where), LINK, where, target=target))
    for dest in directories:
        where = f"--dir {dest}"
        plan.add(Entry(image_path(dest, where), DIR, where))
    for dest, text in modes:
        where = f"--mode {dest}"
        plan.set_mode(image_path(dest, where), parse_mode(text, where), where)
    return plan.entries()


def split_keep(
    split: WheelSplit, part: str, scratch: Path, venv: str, wheels: list[Path]
) -> Callable[[str], bool]:
    """The predicate on venv-relative paths of the files that ``part`` of ``split`` holds.

    Checks first that the layer installed the split's distribution and, for the lower part, that it
    installed the upstream wheel the split was computed against.
    """
    site = python_dirs(venv)["purelib"].removeprefix(venv.rstrip("/") + "/")
    if not (scratch / venv.strip("/") / site / split.dist_info).is_dir():
        names = ", ".join(w.name for w in wheels)
        raise LayerError(
            f"--split: expected the layer's wheels ({names}) to install {split.dist_info}, found no such "
            f"directory in {site}"
        )
    if part == LOWER:
        upstream = [w for w in wheels if w.name == split.upstream_file]
        if not upstream:
            raise LayerError(
                f"--split-part lower: expected the upstream wheel {split.upstream_file} among the layer's "
                f"wheels, found {', '.join(w.name for w in wheels)}"
            )
        found = sha256_file(upstream[0])
        if found != split.upstream_sha256:
            raise LayerError(
                f"--split-part lower: {upstream[0]}: expected sha256 {split.upstream_sha256} (the wheel the "
                f"split was computed against), found {found}"
            )
    upper_keys = split.upper_keys()

    def keep(rel: str) -> bool:
        upper = rel.startswith(site + "/") and split.is_upper(rel[len(site) + 1 :], upper_keys)
        return upper == (part == UPPER)

    return keep


def _image_keep(venv_keep: Callable[[str], bool], venv: str, part: str) -> Callable[[str], bool]:
    # Image paths outside the venv (none today) stay with the lower part, as the venv's scripts do.
    prefix = venv.strip("/") + "/"

    def keep(path: str) -> bool:
        return venv_keep(path[len(prefix) :]) if path.startswith(prefix) else part == LOWER

    return keep


def scan_entries(
    entries: Iterable[Entry], label: str, scanner: Path, allow: Path | None, workdir: Path
) -> dict[str, object]:
    """Scan the layer's files; return the clean report, or raise ``LayerError`` listing the findings."""
    catalogue = Catalogue(scanner)
    described = catalogue.describe()
    allowed = load_allowlist(allow, catalogue) if allow is not None else []
    files = ((entry.source, entry.path) for entry in entries if entry.kind == FILE and entry.source)
    count, findings = scan_files(files, catalogue, label, workdir)
    report = apply_allowlist(findings, allowed)
    if not report.clean:
        lines = "".join(f"\n  {finding.location()}: {finding.match}" for finding in report.findings)
        raise LayerError(
            f"layer {label}: expected no secrets or private data, found {len(report.findings)} "
            f"(allow-list: {allow or 'none'}; add an entry with a reason if a match is not a secret):{lines}"
        )
    return {
        "allowed": len(report.allowed),
        "files": count,
        "findings": 0,
        "layer": label,
        "scanner": described,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], fromfile_prefix_chars="@")
    pair = {"action": "append", "nargs": 2, "default": []}
    parser.add_argument("--tree", **pair, metavar=("DIR", "DEST"), help="directory tree -> image prefix")
    parser.add_argument("--file", **pair, metavar=("SRC", "DEST"), help="single file -> image path")
    parser.add_argument("--links", **pair, metavar=("JSON", "DEST"), help="links spec -> image prefix")
    parser.add_argument("--dirs", **pair, metavar=("JSON", "DEST"), help="dirs spec -> image prefix")
    parser.add_argument("--symlink", **pair, metavar=("DEST", "TARGET"), help="one symlink")
    parser.add_argument("--dir", action="append", default=[], metavar="DEST", help="explicit directory")
    parser.add_argument("--mode", **pair, metavar=("DEST", "MODE"), help="mode override (octal)")
    wheels = parser.add_argument_group("wheels", "install wheels into the layer's virtual environment")
    wheels.add_argument("--wheel", type=Path, action="append", default=[], help="a wheel to install")
    wheels.add_argument("--platform", choices=PLATFORMS, help="target wheel platform")
    wheels.add_argument("--installer", type=Path, help="the locked installer wheel")
    wheels.add_argument("--venv", default=DEFAULT_PREFIX, help=f"venv path in the image ({DEFAULT_PREFIX})")
    wheels.add_argument("--no-pyvenv-cfg", action="store_true", help="leave pyvenv.cfg to another layer")
    wheels.add_argument("--replaces", type=Path, help="JSON policy: which project may replace whose files")
    wheels.add_argument("--modules", type=Path, help="write the module manifest of the wheels' files here")
    wheels.add_argument("--bytecode", action="store_true", help="byte-compile the installed sources")
    wheels.add_argument("--split", type=Path, help="split file of a distribution installed as two layers")
    wheels.add_argument("--split-part", choices=PARTS, help="which part of --split this layer holds")
    debian = parser.add_argument_group("debs", "unpack locked .debs at / (the base OS)")
    debian.add_argument("--deb", type=Path, action="append", default=[], help="a locked .deb to unpack")
    debian.add_argument("--deb-lock", type=Path, help="the Debian lock the .debs must be exactly")
    debian.add_argument("--deb-exclude", choices=sorted(EXCLUDE_PROFILES), default="slim")
    scan = parser.add_argument_group("scan", "scan the layer's files for secrets before writing it")
    scan.add_argument("--scanner", type=Path, help="the locked kingfisher binary")
    scan.add_argument("--scan-allow", type=Path, help="allow-list JSON (none: every finding fails)")
    scan.add_argument("--scan-report", type=Path, help="JSON report to write when the layer is clean")
    scan.add_argument("--label", default="layer", help="the layer's name in messages (its Bazel label)")
    parser.add_argument("--tar", type=Path, help="also write the uncompressed layer tar here")
    parser.add_argument("--compression", choices=sorted(LAYER_MEDIA_TYPES), default="gzip")
    parser.add_argument("--zstd-site", type=Path, help="the unpacked locked zstandard wheel (zstd blobs)")
    parser.add_argument("--blob", type=Path, required=True, help="blob to write (gzip or zstd)")
    parser.add_argument("--descriptor", type=Path, required=True, help="JSON descriptor to write")
    return parser


def _unpack_debs(args: argparse.Namespace, scratch: Path) -> tuple[Path, Path, Path]:
    """The locked .debs unpacked below ``scratch``: (tree, links spec, dirs spec)."""
    tree, links, dirs = scratch / "root", scratch / "links.json", scratch / "dirs.json"
    tree.mkdir()
    build_rootfs(args.deb, args.deb_lock, tree, links, dirs, args.deb_exclude)
    return tree, links, dirs


def _install(args: argparse.Namespace, scratch: Path) -> Callable[[str], bool] | None:
    """Install the wheels into ``scratch``; with a split, return which venv paths the layer keeps."""
    replaces = read_replaces(args.replaces) if args.replaces else {}
    install_wheels(
        args.wheel,
        scratch,
        args.platform,
        args.installer,
        args.venv,
        not args.no_pyvenv_cfg,
        replaces,
        bytecode=args.bytecode,
    )
    if args.split is None:
        return None
    return split_keep(load_split(args.split), args.split_part, scratch, args.venv, args.wheel)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    needed = {"--platform": args.platform, "--installer": args.installer, "--modules": args.modules}
    missing = [flag for flag, value in needed.items() if value is None]
    if args.wheel and missing:
        parser.error(f"--wheel needs {', '.join(missing)}")
    if not args.wheel and len(missing) < len(needed):
        parser.error(f"{', '.join(f for f in needed if f not in missing)} given without --wheel")
    if args.bytecode and not args.wheel:
        parser.error("--bytecode given without --wheel: only installed wheels are byte-compiled")
    if bool(args.deb) != (args.deb_lock is not None):
        parser.error("--deb and --deb-lock go together")
    if (args.split is None) != (args.split_part is None):
        parser.error("--split and --split-part go together")
    if args.split and (not args.wheel or args.tree):
        parser.error("--split needs --wheel and no --tree: it splits the installed wheels only")
    if (args.scanner is None) != (args.scan_report is None) or (args.scan_allow and not args.scanner):
        parser.error("--scanner and --scan-report go together (--scan-allow needs them)")
    if args.zstd_site and args.compression != "zstd":
        parser.error("--zstd-site given without --compression zstd")
    scanned: dict[str, object] | None = None
    try:
        zstandard = load_zstandard(args.zstd_site) if args.compression == "zstd" else None
        with contextlib.ExitStack() as stack:
            trees = [(Path(d), dest) for d, dest in args.tree]
            links = [(Path(j), dest) for j, dest in args.links]
            dirs = [(Path(j), dest) for j, dest in args.dirs]
            # Scratch space beside the outputs, so on the output tree's filesystem rather than a small /tmp.
            if args.deb:
                unpacked = stack.enter_context(
                    tempfile.TemporaryDirectory(prefix=".debs-", dir=args.blob.parent)
                )
                tree, links_spec, dirs_spec = _unpack_debs(args, Path(unpacked))
                trees.append((tree, "/"))
                links.append((links_spec, "/"))
                dirs.append((dirs_spec, "/"))
            modules = None
            scratch: Path | None = None
            venv_keep: Callable[[str], bool] | None = None
            keep: Callable[[str], bool] | None = None
            if args.wheel:
                scratch = Path(
                    stack.enter_context(tempfile.TemporaryDirectory(prefix=".wheels-", dir=args.blob.parent))
                )
                venv_keep = _install(args, scratch)
                trees.append((scratch, "/"))
                if venv_keep is not None:
                    keep = _image_keep(venv_keep, args.venv, args.split_part)
            entries = plan_layer(
                trees=trees,
                files=[(Path(s), dest) for s, dest in args.file],
                links=links,
                dirs=dirs,
                symlinks=[tuple(s) for s in args.symlink],
                directories=args.dir,
                modes=[tuple(m) for m in args.mode],
                keep=keep,
            )
            if args.scanner is not None:
                # Beside the outputs, as the wheels' scratch: the scan's batches hard-link the files.
                workdir = args.blob.parent
                scanned = scan_entries(entries, args.label, args.scanner, args.scan_allow, workdir)
            digests: dict[Path, str] | None = {} if scratch is not None else None
            descriptor = write_layer(entries, args.tar, args.blob, digests, zstandard)
            if scratch is not None and digests is not None:
                # The module manifest from the digests the tar pass computed: the files are read once.
                venv = scratch / args.venv.strip("/")
                hashes = {
                    source.relative_to(venv).as_posix(): digest
                    for source, digest in digests.items()
                    if source.is_relative_to(venv)
                }
                modules = tree_manifest(scratch, args.venv, hashes, venv_keep)
    except (
        LayerError,
        TarError,
        InstallError,
        WheelError,
        ManifestError,
        CatalogueError,
        ScanInputError,
        SplitError,
        DebError,
        ZstdUnavailable,
        OSError,
    ) as exc:
        for written in (args.blob, args.tar):
            if written is not None:
                written.unlink(missing_ok=True)
        print(f"sparkseal: {apparent_text(str(exc))}", file=sys.stderr)
        return 1
    if modules is not None:
        args.modules.write_text(dumps(modules), encoding="ascii")
    if scanned is not None:
        args.scan_report.write_text(json.dumps(scanned, indent=2, sort_keys=True) + "\n", encoding="ascii")
    args.descriptor.write_text(json.dumps(descriptor, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
