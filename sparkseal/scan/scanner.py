"""Secret and private-data scan of the repository and of every layer of an OCI image.

Two rule sets run over each file's bytes (text and binary alike: build paths and keys leak into shared
objects too). Vendor secrets (tokens, keys, private keys, JWTs) are the maintained catalogue's
(``sparkseal.scan.catalogue``: Kingfisher, from a hash-locked package), so no token format is kept by
hand here. Our own rules (``sparkseal.scan.secret_rules``) cover what no catalogue knows: private data
(private addresses, people's home directories), password and generic key assignments, and key files by
name. Each finding is reported as ``path:line:rule: <redacted match>``; the secret itself is never
printed. This module walks what is scanned (the checkout as git lists it, paths, layers, images), hands
files to both rule sets and reads the allow-list; it runs git and the catalogue's binary, so it sits above
the pure core.

The allow-list (``.sparkseal-scan-allow.json`` at the repository root for the checkout's files and
``PATHS``, ``third_party/scan/image-allow.json`` for ``--image``, the list the image build's layer scans
read; or ``--allow`` for everything scanned) is a JSON object
``{"allow": [{"path": GLOB, "rule": RULE, "reason": TEXT}, ...]}``; ``GLOB`` is matched with
``fnmatch`` against the repository path or the path inside the image, ``RULE`` must be a rule id (ours or
the catalogue's, e.g. ``betterleaks.jwt``, or a glob that matches at least one, e.g. ``betterleaks.*``),
and an entry without a reason is a usage error. An entry that names a module's source also covers its
bytecode (``pkg/__pycache__/mod.cpython-311.pyc`` for ``pkg/mod.py``). It lives at the repository root,
beside ``.gitignore``, rather than inside the ``sparkseal`` package: it is policy about this repository's
files, and the package ships in the image where the list would mean nothing.

Archives among the files named on the command line (or the checkout's) are opened
(``sparkseal.core.archives``: wheels, zips, sdists, tars, .debs, by name): read as files, their compressed
bytes hid every secret from our rules, and the catalogue skips a file that looks like an archive. Their
regular members are scanned instead (a zip's "links" too: their bytes are data to any unzip), and those
that are archives in turn, down to ``MAX_ARCHIVE_DEPTH``. What lies outside a zip's members (its comment,
bytes prepended, appended or between its records: ``sparkseal.core.archives.outside_members``) is read by
both rule sets: the catalogue reads those bytes alone, as the pseudo-member ``ARCHIVE!(bytes outside the
members)``, a finding there at the archive's own line (never the whole compressed archive, which it would
skip as an archive and which is slow to read for a large wheel); our rules read each archive's own bytes
whole, reporting a match as the archive's. A tar's bytes that are no member's data (headers, every pax
record, GNU long names, padding: ``sparkseal.core.archives.Skipped``), which a compressed tar's own bytes
hide from that pass and which the catalogue never sees (it is never shown a tar, and skips a ``.tar`` by its
name), are read by both rule sets as the pseudo-member ``ARCHIVE!(tar headers and padding)``, written to
scratch space as the tar is read, a finding there at the line of the tar (decompressed). A match a member
already gave is not reported again.
A tar is read whole: one holding bytes past where the reader stops (after its end blocks or a zero block,
in a second gzip member) is refused, as are headers and member counts over the limits of
``sparkseal.core.archives``. A finding inside one is named ``ARCHIVE!member`` (nested:
``outer!inner!member``), and so are allow-list paths for it. An archive that cannot be read, or is
refused as a bomb, fails the scan (:class:`ScanInputError`, exit 2), as an unreadable image does: it is
no finding, since the scan cannot say what the archive holds, and an allow-list entry must not be able to
wave it through. The image scan opens no archive inside a layer: it reads what the image holds, at the
speed the image build needs; nor does it read a layer's headers apart, since its findings are those of the
layer action's scan of the files it writes (:func:`scan_files`), which has none.
"""

from __future__ import annotations

import bisect
import fnmatch
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath
from typing import IO, Any

from sparkseal.core.archives import (
    HEADERS,
    MAX_ARCHIVE_DEPTH,
    OUTSIDE,
    ArchiveError,
    ArchiveKind,
    Budget,
    Member,
    Skipped,
    Tally,
    archive_kind,
    members,
    open_tar,
    outside_members,
)
from sparkseal.core.oci import LayoutError, blob_path, layer_tar
from sparkseal.scan.catalogue import Catalogue, CatalogueError
from sparkseal.scan.secret_rules import (
    CHUNK,
    RULES,
    AllowEntry,
    Finding,
    Report,
    apply_allowlist_to,
    scan_stream,
)

DEFAULT_ALLOW = Path(".sparkseal-scan-allow.json")
# The image's allow-list, the one every layer action of the image build reads (//:BUILD's SCAN_ALLOW): what
# `scan --image` reads by default from the checkout it runs in. The checkout's, not a list carried by the
# image under audit, so that what the image says of itself cannot wave its own findings through.
DEFAULT_IMAGE_ALLOW = Path("third_party/scan/image-allow.json")
SKIP_DIRS = {".git"}
# Layer members are written to scratch space and handed to the catalogue in batches of about this many
# bytes: one scanner start per batch, and scratch space bounded even for the torch layer.
_BATCH_BYTES = 1 << 30
_MAX_NAME = 200  # bytes of a member's file name in a batch (file systems allow 255)


class ScanInputError(Exception):
    """The scan cannot start (bad allow-list, missing path, unreadable image); the message says which."""


def load_allowlist(path: Path, catalogue: Catalogue | None = None) -> list[AllowEntry]:
    """Read and check an allow-list; every problem is a :class:`ScanInputError` naming the entry.

    A rule must name (or, as a glob, match) at least one rule id of ours or of ``catalogue``'s.
    """
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ScanInputError(f"{path}: no allow-list there") from error
    except (OSError, ValueError) as error:
        raise ScanInputError(f"{path}: not a readable JSON allow-list: {error}") from error
    if (
        not isinstance(document, dict)
        or set(document) != {"allow"}
        or not isinstance(document["allow"], list)
    ):
        raise ScanInputError(
            f'{path}: expected an object {{"allow": [...]}}, found {json.dumps(document)[:80]}'
        )
    entries = []
    for index, entry in enumerate(document["allow"]):
        where = f"{path}: allow[{index}]"
        if not isinstance(entry, dict) or set(entry) != {"path", "rule", "reason"}:
            found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise ScanInputError(f"{where}: expected the keys path, rule, reason, found {found}")
        if not all(isinstance(entry[key], str) for key in ("path", "rule", "reason")):
            raise ScanInputError(f"{where}: path, rule and reason must be strings, found {entry}")
        if not entry["reason"].strip():
            raise ScanInputError(
                f"{where}: expected a reason for allowing {entry['rule']} in {entry['path']}, found none"
            )
        known = [*RULES, *(_catalogue_rules(catalogue) if catalogue is not None else ())]
        if not any(fnmatch.fnmatchcase(rule, entry["rule"]) for rule in known):
            theirs = f" or of the catalogue ({catalogue.binary} rules list)" if catalogue else ""
            raise ScanInputError(
                f"{where}: expected a rule among {', '.join(RULES)}{theirs}, found {entry['rule']!r}"
            )
        if not entry["path"].strip():
            raise ScanInputError(f"{where}: expected a path glob, found an empty one")
        entries.append(AllowEntry(entry["path"], entry["rule"], entry["reason"].strip()))
    return entries


def _catalogue_rules(catalogue: Catalogue) -> dict[str, str]:
    try:
        return catalogue.rules
    except CatalogueError as error:
        raise ScanInputError(str(error)) from error


def scan_with_catalogue(
    catalogue: Catalogue, targets: list[Path], names: dict[str, str], layer: str | None = None
) -> list[Finding]:
    """The catalogue's findings in ``targets``, named by ``names`` (see :meth:`Catalogue.scan`)."""
    try:
        found = catalogue.scan(targets, names)
    except CatalogueError as error:
        raise ScanInputError(str(error)) from error
    return [Finding(f.path, f.line, f.rule, f.match, layer) for f in found]


def git_listed(root: Path) -> list[str]:
    """What git would commit, sorted: tracked and untracked-not-ignored paths; no ``bazel-*``, no ``.git``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        raise ScanInputError(f"{root}: not a git checkout ({listed.stderr.decode().strip()})")
    names = sorted({n for n in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if n})
    return [
        n for n in names if not n.split("/")[0].startswith("bazel-") and not SKIP_DIRS & set(n.split("/"))
    ]


def repository_files(root: Path) -> list[str]:
    """The regular files git would commit (no symlinks), as :func:`git_listed` names them."""
    try:
        names = git_listed(root)
    except ScanInputError as error:
        raise ScanInputError(f"{error}; name PATHS to scan") from error
    return [n for n in names if (root / n).is_file() and not (root / n).is_symlink()]


def _walk(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    if not path.is_dir():
        raise ScanInputError(f"{path}: no such file or directory")
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("bazel-"))
        for name in sorted(filenames):
            file = Path(dirpath) / name
            if file.is_file() and not file.is_symlink():
                yield file


# --- images -------------------------------------------------------------------------------------------

_INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}


class _Source:
    """An OCI layout as a directory or as a tar archive: read a file by its path inside the layout."""

    def __init__(self, path: Path, tally: Tally) -> None:
        self.path = path
        self.tar: tarfile.TarFile | None = None
        self.members: dict[str, tarfile.TarInfo] = {}
        if not path.is_dir():
            try:
                # closed by close(); its headers bounded and its entries counted like any archive's
                self.tar = open_tar(str(path), path=path, mode="r:*", budget=Budget(scan=tally))
                self.members = {_member_path(m.name): m for m in self.tar.getmembers() if m.isfile()}
            except ArchiveError as error:
                raise ScanInputError(str(error)) from error
            except (OSError, tarfile.TarError) as error:
                raise ScanInputError(
                    f"{path}: expected an OCI layout directory or an image archive: {error}"
                ) from error

    def _file(self, name: str) -> Path:
        # A layout directory may keep blobs outside blobs/ (sparkseal.core.oci.EXTERNAL_BLOBS).
        algorithm, _, hexdigest = name.removeprefix("blobs/").partition("/")
        if name.startswith("blobs/") and not (self.path / name).is_file():
            try:
                return blob_path(self.path, f"{algorithm}:{hexdigest}")
            except LayoutError as error:
                raise ScanInputError(str(error)) from error
        return self.path / name

    def has(self, name: str) -> bool:
        return self._file(name).is_file() if self.tar is None else name in self.members

    def open(self, name: str) -> IO[bytes]:
        if self.tar is None:
            return open(self._file(name), "rb")  # the caller closes it
        stream = self.tar.extractfile(self.members[name])
        assert stream is not None  # members holds regular files only
        return stream

    def json(self, name: str) -> Any:
        if not self.has(name):
            raise ScanInputError(f"{self.path}: expected {name} in the image, found none")
        with self.open(name) as stream:
            return json.load(stream)

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()


def _blob(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def _oci_layers(source: _Source, descriptors: list[dict[str, Any]], found: list[tuple[str, str]]) -> None:
    for descriptor in descriptors:
        document = source.json(_blob(descriptor["digest"]))
        if descriptor.get("mediaType") in _INDEX_TYPES or "manifests" in document:
            _oci_layers(source, document["manifests"], found)
            continue
        for layer in document.get("layers", []):
            entry = (layer["digest"], _blob(layer["digest"]))
            if entry not in found:
                found.append(entry)


def image_layers(source: _Source) -> list[tuple[str, str]]:
    """``(layer id, path inside the layout)`` of every layer of every image, in manifest order, once each."""
    found: list[tuple[str, str]] = []
    if source.has("index.json"):
        _oci_layers(source, source.json("index.json").get("manifests", []), found)
    elif source.has("manifest.json"):
        for image in source.json("manifest.json"):
            for layer in image.get("Layers", []):
                if (layer, layer) not in found:
                    found.append((layer, layer))
    else:
        raise ScanInputError(
            f"{source.path}: expected index.json (OCI) or manifest.json (docker archive), found none"
        )
    return found


def _member_path(name: str) -> str:
    return name.removeprefix("./").lstrip("/")


@dataclass(frozen=True)
class _Lines:
    """Where each range of a file's bytes copied into a batch starts: its line in the copy, in the file."""

    copy: list[int]
    source: list[int]

    def of_source(self, line: int) -> int:
        """The line of the file where line ``line`` of the copy lies."""
        at = max(bisect.bisect_right(self.copy, line) - 1, 0)
        return self.source[at] + line - self.copy[at]


def _newlines(raw: IO[bytes], start: int, end: int, out: IO[bytes] | None = None) -> int:
    """The newlines in bytes ``start`` to ``end`` of ``raw``, read in chunks (copied to ``out``, if given)."""
    raw.seek(start)
    count, left = 0, end - start
    while left > 0 and (data := raw.read(min(left, CHUNK))):
        count += data.count(b"\n")
        left -= len(data)
        if out is not None:
            out.write(data)
    return count


class _CatalogueBatches:
    """Hands layer members to the catalogue in batches, each member at ``NNNNNN/<its file name>``.

    The member's own path is never shown to the scanner: no member path can collide with another or
    leave the scratch directory, and the scanner's path heuristics cannot skip a member (Kingfisher 2.14
    silently skips files below ``lib/python3.*/``, where a venv's packages live, and ``node_modules/``).
    ``NNNNNN`` is how many members of that file name came before in the batch, so a batch has as many
    directories as its most frequent name (``__init__.py``), not one per member. A member that is a file
    on the scratch directory's filesystem is hard-linked there (no bytes copied); anything else (a tar
    member, a link, a file on another filesystem) is copied, one batch of about ``_BATCH_BYTES`` of
    copies at a time.
    """

    def __init__(self, catalogue: Catalogue, layer: str | None, scratch: Path) -> None:
        self.catalogue, self.layer = catalogue, layer
        # Resolved once: the scanner reports the paths it was given, and they are looked up as given.
        self.batch = scratch.resolve() / "batch"
        self.names: dict[str, str] = {}
        self.seen: Counter[str] = Counter()
        self.levels = 0  # directories made in this batch: 000000 .. levels - 1
        self.size = 0
        self.findings: list[Finding] = []

    def _place(self, name: str) -> str:
        # The last part of the name only (an archive member's: ``a.whl!pkg/x.py`` gives ``x.py``); one
        # that names no file, holds a NUL or is too long for a file name is replaced.
        base = name.replace("!", "/").rpartition("/")[2].replace("\0", "_")
        if base in ("", ".", ".."):
            base = "member"
        elif len(os.fsencode(base)) > _MAX_NAME:
            base = "member" + PurePosixPath(base).suffix[:16]
        level = self.seen[base]
        self.seen[base] += 1
        directory = f"{self.batch}/{level:06d}"
        if level == self.levels:  # a name reaches level k only after level k - 1: made in order
            os.makedirs(directory)
            self.levels += 1
        place = f"{directory}/{base}"
        self.names[place] = name
        return place

    def add_copy(self, content: IO[bytes], name: str, size: int) -> Path:
        """Copy ``content`` into the batch; return the copy (our rules read it there before a flush)."""
        place = self._place(name)
        with open(place, "wb") as out:
            shutil.copyfileobj(content, out, CHUNK)
        self.size += size
        return Path(place)

    def bound(self) -> None:
        """Scan the batch once it holds ``_BATCH_BYTES`` of copies (scratch space stays bounded)."""
        if self.size >= _BATCH_BYTES:
            self.flush()

    def add_ranges(self, source: Path, ranges: list[tuple[int, int]], name: str) -> _Lines:
        """Copy the byte ``ranges`` of ``source`` into the batch as one file, each range on a line of its own.

        The newline before each range keeps a match from spanning two of them (they do not touch in
        ``source``), and keeps the file from starting with an archive's magic, which the scanner would
        skip (a zip's ``PK\\3\\4``, even prepended to another zip, is a range like any other). The bytes
        between the ranges are read too, for their newlines only: so a finding in the copy can be given
        the line of ``source`` where it lies (see :class:`_Lines`).
        """
        place = self._place(name)
        lines = _Lines([], [])
        copied, line, cursor = 1, 1, 0  # the line the copy and ``source`` have reached
        with open(source, "rb") as raw, open(place, "wb") as out:
            for start, end in ranges:
                line += _newlines(raw, cursor, start)
                out.write(b"\n")
                copied += 1
                lines.copy.append(copied)
                lines.source.append(line)
                inside = _newlines(raw, start, end, out)
                line, copied, cursor = line + inside, copied + inside, end
                self.size += end - start + 1
        self.bound()
        return lines

    def add_moved(self, source: Path, name: str) -> None:
        """Move ``source``, a file of the scan's scratch space, into the batch, counted as a copy."""
        place = self._place(name)
        os.replace(source, place)
        self.size += os.path.getsize(place)
        self.bound()

    def add_file(self, source: Path, name: str) -> None:
        """Hard-link ``source`` into the batch; copy it when it is a link or no hard link can be made.

        A link's target is copied, not linked: another hard link would change the target's ctime, which
        makes Bazel hash an input again (the sandbox shows inputs as links).
        """
        place = self._place(name)
        if not source.is_symlink():
            try:
                os.link(source, place)
                return
            except OSError:
                pass  # another filesystem, or links not allowed there: copied below
        shutil.copyfile(source, place)
        self.size += os.path.getsize(place)
        self.bound()

    def flush(self) -> None:
        if self.names:
            self.findings.extend(scan_with_catalogue(self.catalogue, [self.batch], self.names, self.layer))
        shutil.rmtree(self.batch, ignore_errors=True)
        self.names, self.seen, self.levels, self.size = {}, Counter(), 0, 0

    def finish(self) -> list[Finding]:
        self.flush()
        return self.findings


def scan_layer_stream(
    stream: IO[bytes],
    layer: str,
    catalogue: Catalogue,
    shown: str | None = None,
    budget: Budget | None = None,
) -> tuple[int, list[Finding]]:
    """Scan every regular file of one layer tar (any compression), streamed; return (files, findings).

    Our rules read each member's scratch copy, which the catalogue then reads in its batch. The tar is
    read through :func:`open_tar` (named ``shown`` in its refusals, by default "layer LAYER"): a layer
    is as untrusted as any archive under PATH, its headers bounded and its entries counted against
    ``budget`` (by default its own).
    """
    shown = f"layer {layer}" if shown is None else shown
    budget = Budget() if budget is None else budget
    files, findings = 0, []
    with tempfile.TemporaryDirectory(prefix="sparkseal-layer-scan-") as scratch:
        batches = _CatalogueBatches(catalogue, layer, Path(scratch))
        with open_tar(shown, layer_tar(stream), budget=budget) as tar:
            for member in tar:
                name = _member_path(member.name)
                if not member.isfile() or PurePosixPath(name).name.startswith(".wh."):
                    continue
                content = tar.extractfile(member)
                assert content is not None  # a regular member always has content
                files += 1
                copy = batches.add_copy(content, name, member.size)
                with open(copy, "rb") as again:
                    findings.extend(scan_stream(name, again, layer))
                batches.bound()
        findings.extend(batches.finish())
    return files, sorted(findings, key=lambda f: (f.path, f.line or 0, f.rule))


def scan_files(
    files: Iterable[tuple[Path, str]],
    catalogue: Catalogue,
    layer: str | None = None,
    workdir: Path | None = None,
) -> tuple[int, list[Finding]]:
    """Scan files where they lie: ``(source, name)`` pairs; return (files, findings), sorted.

    The layer action calls this on the files it is about to write (named by their image paths), so the
    scan reads them where they lie instead of decompressing the written layer again: its findings are
    those ``scan_layer_stream`` reports for the written layer. The catalogue's batches hard-link the
    files, so ``workdir`` (where the batches go) is best on the files' filesystem; elsewhere they are
    copied.
    """
    count, findings = 0, []
    with tempfile.TemporaryDirectory(prefix=".layer-scan-", dir=workdir) as scratch:
        batches = _CatalogueBatches(catalogue, layer, Path(scratch))
        for source, name in files:
            count += 1
            with open(source, "rb") as content:
                findings.extend(scan_stream(name, content, layer))
            batches.add_file(source, name)
        findings.extend(batches.finish())
    return count, sorted(findings, key=lambda f: (f.path, f.line or 0, f.rule))


@dataclass(frozen=True)
class Scanned:
    """What :func:`scan_paths` read and found (before the allow-list)."""

    files: int
    archives: int
    notes: list[str]
    findings: list[Finding]


class _PathScan:
    """The files of :func:`run_scan` and the archives among them, scanned through one set of batches.

    A file on disk is hard-linked into the catalogue's batch, as the layer action's files are. An
    archive's members are copied there, each under a name of the batch's own, so no member path (absolute,
    with ``..``, or through a link) is ever a path on disk; an archive inside one is copied to
    ``nested/`` and opened in turn. All of it lies in the scan's private scratch directory.
    """

    def __init__(self, catalogue: Catalogue, scratch: Path) -> None:
        self.batches = _CatalogueBatches(catalogue, None, scratch)
        self.nested = scratch / "nested"
        self.nested.mkdir()
        self.files = 0
        self.archives = 0
        self.notes: list[str] = []
        self.findings: list[Finding] = []
        self.tally = Tally()  # archive entries over the whole scan (MAX_SCAN_MEMBERS)
        # The pseudo-members ARCHIVE!(bytes outside the members) and ARCHIVE!(tar headers and padding)
        # handed out, and where their lines lie in the archive (the tar, for the second)
        self.outside: dict[str, _Lines] = {}

    def file(self, source: Path, name: str) -> None:
        """Scan the file at ``source`` (named ``name``), or the members of the archive it is."""
        kind = archive_kind(name)
        if kind is not None:
            self._archive(source, name, kind, 1, Budget(scan=self.tally))
            return
        self.files += 1
        with open(source, "rb") as content:
            self.findings.extend(scan_stream(name, content))
        self.batches.add_file(source, name)

    def _archive(self, source: Path, shown: str, kind: ArchiveKind, depth: int, budget: Budget) -> None:
        self.archives += 1
        if kind.container == "zip":
            self._members(source, shown, kind, depth, budget, None)
        else:
            # A tar's bytes that are no member's data, written as they are read, into a file of its own
            # (a batch may be scanned and removed while the tar is still being read).
            fd, part = tempfile.mkstemp(dir=self.nested)
            try:
                with os.fdopen(fd, "wb") as out:
                    skipped = Skipped(out)
                    self._members(source, shown, kind, depth, budget, skipped)
                if skipped.size:
                    self._headers(Path(part), f"{shown}!{HEADERS}", skipped)
            finally:
                if os.path.exists(part):
                    os.unlink(part)
        self._raw(source, shown)

    def _headers(self, part: Path, name: str, skipped: Skipped) -> None:
        """Both rule sets over a tar's bytes that are no member's data (``part``, named ``name``).

        Our rules read them here, the catalogue in its batch; the findings of both are given the tar's
        own line, and those a member already gave are dropped, by :func:`_outside_placed`.
        """
        with open(part, "rb") as content:
            self.findings.extend(scan_stream(name, content))
        self.outside[name] = _Lines([copy for copy, _ in skipped.lines], [line for _, line in skipped.lines])
        self.batches.add_moved(part, name)

    def _members(
        self,
        source: Path,
        shown: str,
        kind: ArchiveKind,
        depth: int,
        budget: Budget,
        skipped: Skipped | None,
    ) -> None:
        """Scan the members of the archive at ``source``; hand the catalogue a zip's bytes outside them."""
        listed = members(source, shown, kind, budget, skipped)
        try:
            for member in listed:
                name = f"{shown}!{member.name}"
                inner = archive_kind(member.name)
                if inner is not None and depth < MAX_ARCHIVE_DEPTH:
                    self._nested(member, name, inner, depth + 1, budget)
                    continue
                if inner is not None:
                    self.notes.append(
                        f"{name}: {inner.description} nested deeper than {MAX_ARCHIVE_DEPTH} archives "
                        "(MAX_ARCHIVE_DEPTH): not opened, its bytes read by sparkseal's own rules only"
                    )
                self.files += 1
                copy = self.batches.add_copy(member.stream, name, member.size)
                with open(copy, "rb") as again:
                    self.findings.extend(scan_stream(name, again))
                self.batches.bound()
            # After its members, which have proved the zip readable: what none of them covers.
            ranges = outside_members(source, shown, kind)
        except ArchiveError as error:
            raise ScanInputError(str(error)) from error
        finally:
            listed.close()  # closes the archive even when a member failed
        if ranges:
            name = f"{shown}!{OUTSIDE}"
            self.outside[name] = self.batches.add_ranges(source, ranges, name)

    def _raw(self, source: Path, shown: str) -> None:
        """Our rules over the archive's own bytes: what no reader hands out as a member is scanned too.

        A zip's comment, bytes before or after its records, a compressed file's header fields: an
        unzip shows some of them, and our rules read them here (the catalogue reads a zip's bytes
        outside its members apart, see :meth:`_archive`). A match that one of the archive's members
        already gave (a stored member's bytes lie in the archive as they are) is not reported twice.
        """
        seen = _given(self.findings, shown)
        with open(source, "rb") as own:
            self.findings.extend(f for f in scan_stream(shown, own) if (f.rule, f.match) not in seen)

    def _nested(self, member: Member, name: str, kind: ArchiveKind, depth: int, budget: Budget) -> None:
        # A file of its own, not a batch member: a zip needs to seek, and a batch may be scanned and
        # removed while the nested archive is still being read.
        fd, part = tempfile.mkstemp(dir=self.nested)
        try:
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(member.stream, out, CHUNK)
            self._archive(Path(part), name, kind, depth, budget)
        finally:
            os.unlink(part)


def _given(found: list[Finding], archive: str, but: str | None = None) -> set[tuple[str, str]]:
    """The (rule, match) pairs the findings inside ``archive`` gave (``ARCHIVE!...``), but those of
    the member ``but``: what a pass over the archive's other bytes must not report again."""
    inside = f"{archive}!"
    return {(f.rule, f.match) for f in found if f.path.startswith(inside) and f.path != but}


def _outside_placed(found: list[Finding], outside: dict[str, _Lines]) -> list[Finding]:
    """``found``, with each finding in a pseudo-member (a zip's bytes outside its members, a tar's bytes
    that are no member's data) at the archive's own line, and without those a member already gave.

    The line is the archive's, as our rules report a match in its own bytes (:meth:`_PathScan._raw`); of
    a tar, the line of the tar itself (decompressed). The catalogue's findings arrive when a batch is
    scanned, after the archive is closed: so repeats are judged over the whole scan's findings, as
    ``_raw`` judges our rules' at once.
    """
    if not outside:
        return found
    # "ARCHIVE!(...)": neither pseudo-member's name holds a "!", so the archive is what precedes the last
    given = {path: _given(found, path[: path.rindex("!")], but=path) for path in outside}
    placed = []
    for finding in found:
        lines = outside.get(finding.path)
        if lines is not None:
            if (finding.rule, finding.match) in given[finding.path]:
                continue
            if finding.line is not None:
                finding = replace(finding, line=lines.of_source(finding.line))
        placed.append(finding)
    return placed


def scan_paths(files: Iterable[tuple[Path, str]], catalogue: Catalogue) -> Scanned:
    """Scan files where they lie, ``(source, name)`` pairs, opening the archives among them.

    Unlike :func:`scan_files` (the layer action's), an archive's members are scanned, not its bytes.
    """
    with tempfile.TemporaryDirectory(prefix="sparkseal-scan-") as scratch:
        scan = _PathScan(catalogue, Path(scratch))
        for source, name in files:
            scan.file(source, name)
        found = _outside_placed(scan.findings + scan.batches.finish(), scan.outside)
    findings = sorted(found, key=lambda f: (f.path, f.line or 0, f.rule))
    return Scanned(scan.files, scan.archives, scan.notes, findings)


def scan_image(path: Path, catalogue: Catalogue) -> tuple[int, list[Finding]]:
    """Scan every regular file of every layer, streaming the tars; return (files scanned, findings)."""
    tally = Tally()  # archive entries over the image archive and all its layers (MAX_SCAN_MEMBERS)
    source = _Source(path, tally)
    files, findings = 0, []
    try:
        for layer_id, blob in image_layers(source):
            short = layer_id[:19] if layer_id.startswith("sha256:") else layer_id
            with source.open(blob) as stream:
                try:
                    layer_files, layer_findings = scan_layer_stream(
                        stream, short, catalogue, f"{path}: layer {layer_id}", Budget(scan=tally)
                    )
                except ArchiveError as error:
                    raise ScanInputError(str(error)) from error
                except tarfile.TarError as error:
                    raise ScanInputError(
                        f"{path}: layer {layer_id} is not a readable tar: {error}"
                    ) from error
            files += layer_files
            findings.extend(layer_findings)
    finally:
        source.close()
    return files, findings


def run_scan(
    paths: list[Path],
    image: Path | None,
    allow: Path | None,
    root: Path | None = None,
    catalogue: Catalogue | None = None,
) -> Report:
    """Scan ``paths`` (or the git checkout at ``root``, default the current directory) and ``image``.

    ``catalogue`` defaults to :meth:`Catalogue.find` (the installed, locked scanner).
    """
    root = root or Path.cwd()
    try:
        catalogue = catalogue or Catalogue.find()
        scanner = catalogue.describe()
    except CatalogueError as error:
        raise ScanInputError(str(error)) from error
    report = Report(scanner=scanner)
    file_allow, image_allow = _default_allowlists(
        root, allow, bool(paths) or image is None, image, report.notes
    )
    if image is not None and not image.exists():
        raise ScanInputError(f"--image {image}: no such file or directory")
    file_entries = load_allowlist(file_allow, catalogue) if file_allow is not None else []
    image_entries = load_allowlist(image_allow, catalogue) if image_allow is not None else []
    files: list[tuple[str, Path]] = []
    if paths:
        files = [(file.as_posix(), file) for path in paths for file in _walk(path)]
    elif image is None:
        files = [(name, root / name) for name in repository_files(root)]
    scanned = scan_paths([(file, name) for name, file in files], catalogue)  # sorted
    report.files += scanned.files
    report.archives = scanned.archives
    report.notes += scanned.notes
    image_findings: list[Finding] = []
    if image is not None:
        image_files, image_findings = scan_image(image, catalogue)
        report.files += image_files
    if allow is not None:  # one list for all: each entry is stale only if it covered nothing at all
        apply_allowlist_to(report, [*scanned.findings, *image_findings], file_entries)
    else:
        apply_allowlist_to(report, scanned.findings, file_entries)
        apply_allowlist_to(report, image_findings, image_entries)
    return report


def _default_allowlists(
    root: Path, allow: Path | None, files_scanned: bool, image: Path | None, notes: list[str]
) -> tuple[Path | None, Path | None]:
    """The allow-lists of the files' findings and of the image's: ``allow`` for both when given, else each
    its own default below ``root`` (:data:`DEFAULT_ALLOW` for files, :data:`DEFAULT_IMAGE_ALLOW` for the
    image: their paths name different trees), and none for what is not scanned, whose every entry would
    read as stale. A default that is missing reads as none; for an image a note says so, since the image's
    known matches then come back as findings."""
    if allow is not None:
        return allow, allow
    files = root / DEFAULT_ALLOW if files_scanned and (root / DEFAULT_ALLOW).is_file() else None
    if image is None:
        return files, None
    if (root / DEFAULT_IMAGE_ALLOW).is_file():
        return files, root / DEFAULT_IMAGE_ALLOW
    notes.append(
        f"no image allow-list: expected {DEFAULT_IMAGE_ALLOW} in {root} (run the scan in a checkout of "
        "the commit that built the image, or pass --allow), found none: every match is a finding"
    )
    return files, None


def render(report: Report, as_json: bool) -> str:
    """The report: one ``location: match`` line per finding and a summary, or JSON."""
    if as_json:
        return json.dumps(
            {
                "clean": report.clean,
                "files": report.files,
                "findings": [asdict(f) for f in report.findings],
                "allowed": len(report.allowed),
                "archives": report.archives,
                "notes": report.notes,
                "scanner": report.scanner,
                "unused_allow": [asdict(e) for e in report.unused_allow],
            },
            indent=2,
            sort_keys=True,
        )
    lines = [f"{f.location()}: {f.match}" for f in report.findings]
    lines.extend(f"note: allow-list entry {e.path} {e.rule} matched nothing" for e in report.unused_allow)
    lines.extend(f"note: {note}" for note in report.notes)
    opened = f" ({report.archives} archives opened)" if report.archives else ""
    summary = (
        f"{report.files} files scanned{opened}, {len(report.findings)} finding(s), "
        f"{len(report.allowed)} allowed"
        f" (rules: {len(RULES)} of sparkseal, {report.scanner.get('rules', 0)} of "
        f"{report.scanner.get('name', '?')} {report.scanner.get('version', '?')})"
    )
    return "\n".join([*lines, summary])
