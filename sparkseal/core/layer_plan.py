"""The entries of one OCI layer: every input gathered, checked and ordered, with modes and owners.

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

A path given by two inputs, a whiteout name, a link that climbs above the image root and a mode a kind
may not have are refused, naming the inputs. Pure: it reads the inputs' files and writes nothing
(``sparkseal.core.layer_write`` writes the entries).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from sparkseal.core.determinism import (
    DIR_MODE,
    EXEC_MODE,
    FILE_MODE,
    GID,
    STICKY_DIR_MODE,
    UID,
)
from sparkseal.core.paths import UnsafePath, check_relative
from sparkseal.core.tar import SYMLINK_MODE, USTAR_ID_LIMIT
from sparkseal.core.tree import content_mode

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
