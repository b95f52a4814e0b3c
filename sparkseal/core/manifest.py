"""The module manifest format: the sha256 of every file of an installed tree or of a PEX, per distribution.

A manifest lists the sha256 of every file, grouped by the distribution whose ``*.dist-info/RECORD`` names it
(files no RECORD names go to the ``(unowned)`` bucket), with one digest per distribution and one for the
whole input. Paths are POSIX paths relative to the site-packages directory, as RECORD writes them
(``vllm/__init__.py``; a console script is ``../../../bin/vllm``), so the same distribution gives the same
keys in an image, in a PEX and in any virtual environment.

Each distribution's files are split in two:

* ``files``: the module's own content, inside site-packages and copied from the wheel unchanged;
* ``install_files``: what the installer wrote or placed outside site-packages (``RECORD``, ``INSTALLER``,
  ``REQUESTED``, ``direct_url.json``, console scripts, a PEX's ``.layout.json`` and stash directory). These
  depend on the installer and the prefix, so the same wheel gives different bytes in a PEX and an image.

A distribution's ``digest`` covers ``files`` only: the same module bytes in a PEX and in the image give the
same digest. The top ``digest`` covers every file of the input, installer files included. Both are the
sha256 of a ``sha256sum``-style listing (``<hex>  <path>\\n`` per file, sorted by path), so an auditor can
recompute them with coreutils alone, e.g. for an image tree:
``cd opt/venv && find . -type f -printf '%P\\0' | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum``.

The JSON is written with ``indent=2`` and sorted keys: one file per line, so ``diff`` or diffoscope between
two builds' manifests shows a changed file as one changed line (compact JSON would be one line for all).

The action that writes it is ``sparkseal.actions.module_manifest``.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from email.parser import HeaderParser
from functools import partial
from pathlib import Path
from typing import IO, Any

from sparkseal.core.digests import listing_digest, sha256_file, sha256_stream
from sparkseal.core.tree import list_files
from sparkseal.core.wheels import normalize_name

FORMAT = "sparkseal-module-manifest/1"
# Where the image carries the manifest of its /opt/venv; `sparkseal verify-modules` reads it from there.
IMAGE_MANIFEST_PATH = Path("/opt/sparkseal/manifest.json")
DEFAULT_PREFIX = "/opt/venv"
# The bucket for files that no RECORD names; not a valid (normalised) project name, so it cannot collide.
UNOWNED = "(unowned)"
# dist-info files an installer writes (PEP 376 RECORD, INSTALLER, REQUESTED; PEP 610 direct_url.json).
INSTALLER_WRITTEN = frozenset({"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"})
# pex keeps the layout of a pre-installed wheel in this file at the root of the wheel's chroot.
PEX_LAYOUT = ".layout.json"
PEX_DEPS = ".deps"


class ManifestError(Exception):
    """The input cannot be described: bad RECORD, clashing owners, missing file; the message says which."""


@dataclass
class Distribution:
    """The hashed files of one distribution (or of the unowned bucket), keyed relative to site-packages."""

    name: str
    version: str | None
    files: dict[str, str] = field(default_factory=dict)
    install_files: dict[str, str] = field(default_factory=dict)

    def add(self, key: str, sha256: str) -> None:
        """File ``key`` under ``files`` or ``install_files`` according to where it lies and who wrote it."""
        (self.install_files if is_install_file(key) else self.files)[key] = sha256

    def all_files(self) -> dict[str, str]:
        """Every file of the distribution: module files and installer files."""
        return {**self.files, **self.install_files}

    def to_json(self) -> dict[str, Any]:
        """The manifest entry of this distribution."""
        return {
            "name": self.name,
            "version": self.version,
            "digest": listing_digest(self.files),
            "files": dict(sorted(self.files.items())),
            "install_files": dict(sorted(self.install_files.items())),
        }


@dataclass(frozen=True)
class DistInfo:
    """One ``*.dist-info`` directory: its project and the files its RECORD names (site-packages relative)."""

    key: str  # normalised project name
    name: str
    version: str
    directory: str
    record: tuple[str, ...]


def is_install_file(key: str) -> bool:
    """True for a path the installer wrote or placed outside site-packages (see the module docstring)."""
    if key.startswith("../"):
        return True
    parts = key.split("/")
    if len(parts) == 2 and parts[0].endswith(".pex-info"):
        return True  # pex records each wheel's original RECORD beside the installed chroot
    return len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] in INSTALLER_WRITTEN


def normalise_key(path: str, where: str) -> str:
    """A RECORD path in canonical form: POSIX, no ``.`` parts, ``..`` only as a leading run."""
    if not path or path.startswith("/") or "\\" in path:
        raise ManifestError(f"{where}: path {path!r} is not a relative POSIX path")
    key = posixpath.normpath(path)
    if key.split("/")[-1] in (".", ".."):
        raise ManifestError(f"{where}: path {path!r} does not name a file")
    return key


def parse_record(text: str, where: str) -> tuple[str, ...]:
    """The normalised paths a RECORD names (its first column)."""
    paths = []
    for row in csv.reader(io.StringIO(text)):
        if row:
            paths.append(normalise_key(row[0], where))
    return tuple(paths)


def parse_metadata(text: str, where: str) -> tuple[str, str]:
    """``(Name, Version)`` of a METADATA file."""
    headers = HeaderParser().parsestr(text)
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        raise ManifestError(
            f"{where}: expected Name and Version headers, found Name={name!r} Version={version!r}"
        )
    return name.strip(), version.strip()


def read_dist_infos(site: Path) -> list[DistInfo]:
    """Every ``*.dist-info`` of a site-packages directory on disk, sorted by directory name."""
    found = []
    for directory in sorted(site.glob("*.dist-info")):
        metadata, record = directory / "METADATA", directory / "RECORD"
        for required in (metadata, record):
            if not required.is_file():
                raise ManifestError(f"{required}: expected a file in every installed *.dist-info, found none")
        name, version = parse_metadata(metadata.read_text(encoding="utf-8"), str(metadata))
        found.append(
            DistInfo(
                key=normalize_name(name),
                name=name,
                version=version,
                directory=directory.name,
                record=parse_record(record.read_text(encoding="utf-8"), str(record)),
            )
        )
    return found


def owner_map(dists: Iterable[DistInfo], where: str) -> dict[str, DistInfo]:
    """Map every RECORD path to its distribution; two distributions naming one file is an error."""
    owners: dict[str, DistInfo] = {}
    for dist in dists:
        for key in dist.record:
            other = owners.get(key)
            if other is not None and other is not dist:
                raise ManifestError(
                    f"{where}: {key} is named by the RECORD of {other.directory} and of {dist.directory}"
                )
            owners[key] = dist
    return owners


def find_site_packages(venv: Path) -> Path:
    """The one ``lib/python3.*/site-packages`` directory of a virtual environment."""
    candidates = sorted(p for p in venv.glob("lib/python3*/site-packages") if p.is_dir())
    if len(candidates) != 1:
        found = ", ".join(str(p.relative_to(venv)) for p in candidates) or "none"
        raise ManifestError(f"{venv}: expected one lib/python3.*/site-packages directory, found {found}")
    return candidates[0]


def _manifest(
    source: dict[str, Any], listing: Mapping[str, str], dists: Iterable[Distribution]
) -> dict[str, Any]:
    by_key = {}
    for dist in dists:
        key = UNOWNED if dist.name == UNOWNED else normalize_name(dist.name)
        if key in by_key:
            raise ManifestError(
                f"distribution {key} is installed twice ({by_key[key]['version']}, {dist.version})"
            )
        by_key[key] = dist.to_json()
    return {
        "format": FORMAT,
        "source": source,
        "digest": listing_digest(listing),
        "distributions": dict(sorted(by_key.items())),
    }


def tree_manifest(
    tree: Path,
    prefix: str = DEFAULT_PREFIX,
    hashes: Mapping[str, str] | None = None,
    keep: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """The manifest of the virtual environment at ``tree/prefix`` (``tree`` holds the image's files).

    ``hashes`` are the sha256 of the venv's files (keys relative to it) when the caller has read them
    already, as the layer writer has; they must name exactly the files there. ``keep`` (a predicate on
    those keys) describes part of the venv only, the part one layer of a split distribution holds
    (``sparkseal.core.wheel_split``): the RECORDs still say who owns each file, and only the kept files
    must exist.
    """
    venv = tree / prefix.strip("/")
    if not venv.is_dir():
        raise ManifestError(
            f"{tree}: expected the virtual environment of prefix {prefix} at {venv}, found none"
        )
    site = find_site_packages(venv)
    site_rel = site.relative_to(venv).as_posix()
    dist_infos = read_dist_infos(site)
    owners = owner_map(dist_infos, str(site))
    files = [rel for rel in list_files(venv) if keep is None or keep(rel)]
    if hashes is None:
        hashes = {rel: sha256_file(venv / rel) for rel in files}
    elif sorted(hashes) != files:
        unhashed = sorted(set(files) - set(hashes))[:3]
        absent = sorted(set(hashes) - set(files))[:3]
        raise ManifestError(
            f"{venv}: the given digests do not name the files there: "
            f"files without a digest {unhashed}, digests without a file {absent}"
        )
    for key, info in owners.items():
        rel = posixpath.normpath(f"{site_rel}/{key}")
        if keep is not None and not rel.startswith("../") and not keep(rel):
            continue
        if rel.startswith("../") or rel not in hashes:
            where = "lies outside the virtual environment" if rel.startswith("../") else "is not a file"
            raise ManifestError(
                f"{site / info.directory / 'RECORD'}: names {key}, which {where} ({venv / rel})"
            )

    by_dist = {info.directory: Distribution(info.name, info.version) for info in dist_infos}
    unowned = Distribution(UNOWNED, None)
    for rel, digest in hashes.items():
        key = posixpath.relpath(rel, site_rel)
        info = owners.get(key)
        (by_dist[info.directory] if info else unowned).add(key, digest)
    dists = [*by_dist.values(), *([unowned] if unowned.files or unowned.install_files else [])]
    try:
        return _manifest({"kind": "tree", "prefix": prefix, "site_packages": site_rel}, hashes, dists)
    except ManifestError as error:
        raise ManifestError(f"{site}: {error}") from error


def merge_trees(trees: Sequence[Path], scratch: Path) -> Path:
    """One view of several layer trees, as the image stacks them: a farm of links under ``scratch``.

    A path present in two trees is an error naming both, since one layer would hide the other's file.
    A single tree is returned as it is.
    """
    if len(trees) == 1:
        return trees[0]
    origin: dict[str, Path] = {}
    for tree in trees:
        for rel in list_files(tree):
            if rel in origin:
                raise ManifestError(f"{rel} is in two layer trees: {origin[rel]} and {tree}")
            origin[rel] = tree
            link = scratch / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to((tree / rel).resolve())
    return scratch


def merge_manifests(parts: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The manifest of the virtual environment that several layers make together, from each layer's own.

    Each part is ``(where, manifest)``: the tree manifest of one layer's files (``tree_manifest`` of what
    that layer installs), named by ``where`` in errors. Merging gives the same bytes as ``tree_manifest`` of
    the stacked trees, so the layer actions need not keep their installed files for a manifest action to
    read: a path may appear in one part only, and the unowned buckets join. A distribution appears in one
    part, or in several with one name and version when its files are split between layers
    (``sparkseal.core.wheel_split``).
    """
    if not parts:
        raise ManifestError("no layer manifests to merge; expected at least one")
    sources = {json.dumps(manifest.get("source"), sort_keys=True) for _, manifest in parts}
    first_where, first = parts[0]
    source = first.get("source")
    if not isinstance(source, dict) or source.get("kind") != "tree" or len(sources) != 1:
        found = sorted(sources)
        raise ManifestError(
            f"{first_where}: expected tree manifests of one prefix and site-packages, found sources {found}"
        )
    site_rel = str(source["site_packages"])
    owners: dict[str, str] = {}  # venv-relative path -> the part that holds it
    listing: dict[str, str] = {}
    dists: dict[str, Distribution] = {}
    dist_where: dict[str, str] = {}
    unowned = Distribution(UNOWNED, None)
    for where, manifest in parts:
        if manifest.get("format") != FORMAT:
            raise ManifestError(f"{where}: expected format {FORMAT!r}, found {manifest.get('format')!r}")
        try:
            entries = [
                (key, entry["name"], entry["version"], entry["files"], entry["install_files"])
                for key, entry in manifest["distributions"].items()
            ]
        except (KeyError, TypeError, AttributeError) as error:
            raise ManifestError(
                f"{where}: expected distributions of name, version, files and install_files: {error!r}"
            ) from error
        for key, name, version, *file_maps in entries:
            if key == UNOWNED:
                dist = unowned
            elif key in dists:
                dist = dists[key]
                if (dist.name, dist.version) != (name, version):
                    raise ManifestError(
                        f"distribution {key} is in two layers as different releases: {dist.name} "
                        f"{dist.version} in {dist_where[key]} and {name} {version} in {where}; expected "
                        f"one release split between layers"
                    )
            else:
                dist = dists[key] = Distribution(name, version)
                dist_where[key] = where
            for files in file_maps:
                for file_key, digest in files.items():
                    rel = posixpath.normpath(f"{site_rel}/{file_key}")
                    if rel in owners:
                        raise ManifestError(f"{rel} is in two layers: {owners[rel]} and {where}")
                    owners[rel] = where
                    listing[rel] = digest
                    dist.add(file_key, digest)
    merged = [*dists.values(), *([unowned] if unowned.files or unowned.install_files else [])]
    return _manifest(source, listing, merged)


# A PEX holds one chroot per wheel under .deps/<wheel file name>: a pre-installed wheel (site-packages
# content at its root, scripts and data in a stash directory named by .layout.json) or, built with
# --no-pre-install-wheels, the wheel itself (data under <name>.data/).
Opener = Callable[[], IO[bytes]]


def _chroot_distribution(chroot: str, entries: Mapping[str, Opener]) -> tuple[Distribution, dict[str, str]]:
    """Hash one PEX chroot; return its distribution and the hashes keyed by path inside the chroot."""
    dist_infos = sorted({path.split("/")[0] for path in entries if path.split("/")[0].endswith(".dist-info")})
    if len(dist_infos) != 1:
        raise ManifestError(f"{chroot}: expected one *.dist-info directory, found {dist_infos or 'none'}")
    metadata = f"{dist_infos[0]}/METADATA"
    if metadata not in entries:
        raise ManifestError(f"{chroot}: expected {metadata}, found none")
    with entries[metadata]() as stream:
        name, version = parse_metadata(stream.read().decode("utf-8"), f"{chroot}/{metadata}")
    stash = None
    if PEX_LAYOUT in entries:
        with entries[PEX_LAYOUT]() as stream:
            stash = json.loads(stream.read()).get("stash_dir")
        if not isinstance(stash, str) or not stash:
            raise ManifestError(f"{chroot}/{PEX_LAYOUT}: expected a stash_dir string, found {stash!r}")
    dist = Distribution(name, version)
    hashes = {}
    for path, opener in sorted(entries.items()):
        with opener() as stream:
            hashes[path] = digest = sha256_stream(stream)
        top, _, rest = path.partition("/")
        if path == PEX_LAYOUT or (stash is not None and top == stash):
            dist.install_files[path] = digest
        elif stash is None and top.endswith(".data"):
            kind, _, inner = rest.partition("/")
            if kind in ("purelib", "platlib") and inner:
                dist.add(inner, digest)
            else:
                dist.install_files[path] = digest
        else:
            dist.add(path, digest)
    return dist, hashes


def _zip_entries(archive: zipfile.ZipFile) -> dict[str, Opener]:
    return {
        info.filename: (lambda info=info: archive.open(info))
        for info in archive.infolist()
        if not info.is_dir()
    }


def _split_chroots(entries: Mapping[str, Opener]) -> tuple[dict[str, dict[str, Opener]], dict[str, Opener]]:
    chroots: dict[str, dict[str, Opener]] = {}
    rest: dict[str, Opener] = {}
    for path, opener in entries.items():
        parts = path.split("/", 2)
        if len(parts) == 3 and parts[0] == PEX_DEPS:
            chroots.setdefault(parts[1], {})[parts[2]] = opener
        else:
            rest[path] = opener
    return chroots, rest


def pex_manifest(pex: Path) -> dict[str, Any]:
    """The manifest of a PEX: a zip file, or a ``--layout packed`` / ``loose`` directory.

    Entries outside ``.deps`` (PEX-INFO, the bootstrap) go to the unowned bucket's ``install_files``.
    """
    with ExitStack() as stack:
        chroots, rest = _split_chroots(_pex_entries(pex, stack))
        listing: dict[str, str] = {}
        dists = []
        for chroot, entries in sorted(chroots.items()):
            dist, hashes = _chroot_distribution(f"{pex}!{PEX_DEPS}/{chroot}", entries)
            dists.append(dist)
            listing.update({f"{PEX_DEPS}/{chroot}/{path}": digest for path, digest in hashes.items()})
        unowned = Distribution(UNOWNED, None)
        for path, opener in sorted(rest.items()):
            with opener() as stream:
                unowned.install_files[path] = listing[path] = sha256_stream(stream)
    try:
        return _manifest({"kind": "pex"}, listing, [*dists, *([unowned] if unowned.install_files else [])])
    except ManifestError as error:
        raise ManifestError(f"{pex}: {error}") from error


def _open_zip(path: Path, stack: ExitStack) -> zipfile.ZipFile:
    try:
        return stack.enter_context(zipfile.ZipFile(path))
    except (OSError, zipfile.BadZipFile) as error:
        raise ManifestError(f"{path}: expected a zip archive: {error}") from error


def _pex_entries(pex: Path, stack: ExitStack) -> dict[str, Opener]:
    """Every file of a PEX by path; the wheels of a packed layout are opened as directories."""
    if pex.is_file():
        return _zip_entries(_open_zip(pex, stack))
    if not pex.is_dir():
        raise ManifestError(f"{pex}: expected a PEX file or directory, found nothing")
    entries: dict[str, Opener] = {}
    for rel in list_files(pex):
        parts = rel.split("/")
        if len(parts) == 2 and parts[0] == PEX_DEPS and rel.endswith(".whl"):
            for inner, opener in _zip_entries(_open_zip(pex / rel, stack)).items():
                entries[f"{rel}/{inner}"] = opener
        else:
            entries[rel] = partial(open, pex / rel, "rb")
    return entries


def dumps(manifest: Mapping[str, Any]) -> str:
    """The canonical text of a manifest: sorted keys, indent 2, ASCII, one trailing newline."""
    return json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def load_manifest(path: Path) -> dict[str, Any]:
    """Read a manifest written by this module; fail with the file name on anything else."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ManifestError(f"{path}: no manifest there") from error
    except (OSError, ValueError) as error:
        raise ManifestError(f"{path}: not a readable JSON manifest: {error}") from error
    found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
    if found != FORMAT or not isinstance(manifest.get("distributions"), dict):
        raise ManifestError(
            f"{path}: expected format {FORMAT!r} with a distributions object, found {found!r}"
        )
    return manifest
