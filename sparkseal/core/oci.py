"""The OCI image layout format: media types, canonical JSON, blob paths, and a reader of a layout's image.

The image writer (``sparkseal.actions.oci_image``) and every reader (``sparkseal verify``'s comparison,
``sparkseal provenance check``) share these, so a layout is written and read by one definition.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sparkseal.core.determinism import SOURCE_DATE_EPOCH
from sparkseal.core.digests import sha256_file
from sparkseal.core.pzstd import MAGIC as ZSTD_MAGIC
from sparkseal.core.pzstd import load_zstandard
from sparkseal.core.pzstd import reader as zstd_reader

# The OCI media type of gzip-compressed layers: the compression every consumer of our images reads, and
# the default. zstd layers (`--//rules:layer_compression=zstd`) are smaller and several times cheaper to
# write and read, but umoci 0.4.7 refuses them and a docker-archive cannot carry them
# (bench/results/compression.md): `.load` writes their tars uncompressed into the archive.
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
ZSTD_LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"
# Layer compression (the build setting's values) -> media type; one table for writers and readers.
LAYER_MEDIA_TYPES = {"gzip": LAYER_MEDIA_TYPE, "zstd": ZSTD_LAYER_MEDIA_TYPE}

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
LAYOUT_VERSION = "1.0.0"
# Where a layout keeps its sha256 blobs, relative to the layout directory.
BLOB_DIR = Path("blobs") / "sha256"

# The OCI RFC 3339 form of SOURCE_DATE_EPOCH, for the config's and every history entry's ``created``.
CREATED = datetime.datetime.fromtimestamp(SOURCE_DATE_EPOCH, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# The docker reference grammar, one definition for the image writer's tag and the push's reference.
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
# One path component of a repository: lower-case alphanumerics joined by '.', '_', '__' or dashes.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# A registry host as docker tells it apart from a path component: it has a dot or a port, or is localhost.
_HOST = r"(?:localhost|[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)+)(?::[0-9]+)?|[a-zA-Z0-9-]+:[0-9]+"
REPOSITORY_PATH_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
REPOSITORY_RE = re.compile(rf"(?:(?:{_HOST})/)?{REPOSITORY_PATH_RE.pattern}")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class LayoutError(ValueError):
    """A directory is not an OCI image layout with one readable image; the message names the file."""


def layer_tar(stream: IO[bytes]) -> IO[bytes]:
    """The tar of a layer blob, for ``tarfile.open(fileobj=..., mode="r|*")``: zstd is decompressed here.

    tarfile reads gzip itself but not zstd; the blob's first bytes say which it is, whatever its media type
    claims, so a reader cannot be misled into reading compressed bytes as a tar.
    """
    buffered = stream if isinstance(stream, io.BufferedReader) else io.BufferedReader(stream)  # type: ignore[arg-type]
    if buffered.peek(len(ZSTD_MAGIC))[: len(ZSTD_MAGIC)] == ZSTD_MAGIC:
        zstandard = load_zstandard()
        return _TarReadErrors(zstd_reader(buffered, zstandard), zstandard.ZstdError)
    return buffered


class _TarReadErrors(io.RawIOBase):
    """A decompressing stream whose corrupt input is a ``tarfile.ReadError``, as a corrupt gzip layer's is."""

    def __init__(self, stream: IO[bytes], error: type[Exception]) -> None:
        self._stream = stream
        self._error = error

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        try:
            return self._stream.read(size)
        except self._error as error:
            raise tarfile.ReadError(f"zstd: {error}") from error

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def canonical_json(value: object) -> bytes:
    """Sorted keys, no whitespace, ASCII only, no trailing newline: one byte form per document.

    A blob's digest is over its exact bytes, so another key order, an indent or a final newline would make
    another image with the same content.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


# The image-layout specification lets a layout leave referenced blobs out of ``blobs/`` for an external store
# to supply. Ours keeps each layer's blob where the layer action wrote it (beside the layout in bazel-bin and
# in runfiles) instead of copying gigabytes into the layout, and names those files here: a JSON object
# ``{"sha256:<hex>": "path relative to the layout directory"}``.
EXTERNAL_BLOBS = "sparkseal-external-blobs.json"


def external_blobs(layout: Path) -> dict[str, str]:
    """The blobs the layout keeps outside ``blobs/``: digest -> path relative to the layout ({} if none)."""
    path = layout / EXTERNAL_BLOBS
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise LayoutError(f"{path}: not a readable JSON object: {error}") from error
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and DIGEST_RE.fullmatch(k) and isinstance(v, str) and v and not v.startswith("/")
        for k, v in data.items()
    ):
        raise LayoutError(f"{path}: expected {{'sha256:<64 hex>': 'relative/path'}}, found {data!r:.200}")
    return data


def blob_path(layout: Path, digest: str) -> Path:
    """The file of blob ``digest`` (``sha256:<hex>``): in the layout's ``blobs/``, else where it names it.

    A blob in neither place gives its path under ``blobs/``, so that the caller's error names where an
    ordinary layout would hold it.
    """
    algorithm, _, hexdigest = digest.partition(":")
    inside = layout / "blobs" / algorithm / hexdigest
    if inside.is_file():
        return inside
    outside = external_blobs(layout).get(digest)
    return layout / outside if outside is not None else inside


def write_blob(layout: Path, data: bytes, media_type: str) -> dict[str, object]:
    """Write ``data`` as a blob of ``layout`` (whose ``blobs/sha256`` exists); return its descriptor."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / BLOB_DIR / digest.removeprefix("sha256:")).write_bytes(data)
    return {"digest": digest, "mediaType": media_type, "size": len(data)}


def write_complete_layout(layout: Path, dest: Path) -> None:
    """Write ``layout`` as an ordinary OCI layout at ``dest`` (absent or empty), every blob in ``blobs/``.

    Blobs are hard-linked where ``dest`` is on the same file system, otherwise copied; each external blob
    is checked against its digest first. For tools that read only ordinary layouts (``skopeo copy oci:``,
    umoci).
    """
    if dest.exists() and any(dest.iterdir()):
        raise LayoutError(f"{dest}: expected an empty or absent directory for the layout")
    external = external_blobs(layout)
    (dest / BLOB_DIR).mkdir(parents=True, exist_ok=True)
    for name in ("oci-layout", "index.json"):
        shutil.copyfile(layout / name, dest / name)
    digests = {p.name: p for p in (layout / BLOB_DIR).iterdir()}
    digests.update({d.removeprefix("sha256:"): layout / rel for d, rel in external.items()})
    for hexdigest, source in sorted(digests.items()):
        if not source.is_file():
            raise LayoutError(f"{layout}: blob sha256:{hexdigest} is not at {source}")
        if f"sha256:{hexdigest}" in external and (actual := sha256_file(source)) != hexdigest:
            raise LayoutError(f"{source}: expected the blob sha256:{hexdigest}, found sha256:{actual}")
        target = dest / BLOB_DIR / hexdigest
        try:
            os.link(source.resolve(), target)
        except OSError:
            shutil.copyfile(source, target)


def is_layout(path: Path) -> bool:
    """True for an OCI image layout directory (``oci-layout`` and ``index.json``)."""
    return path.is_dir() and (path / "oci-layout").is_file() and (path / "index.json").is_file()


@dataclass(frozen=True)
class LayoutImage:
    """The one image of a layout: its manifest digest and parsed manifest."""

    digest: str
    manifest: dict[str, Any]

    @property
    def layers(self) -> list[dict[str, Any]]:
        """The layer descriptors, bottom first."""
        return list(self.manifest.get("layers", []))


def read_image_entry(layout: Path) -> dict[str, Any]:
    """The one descriptor of ``index.json``; fail naming the file unless there is exactly one."""
    index_path = layout / "index.json"
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise LayoutError(f"{index_path}: not a readable OCI index: {error}") from error
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or len(manifests) != 1:
        found = len(manifests) if isinstance(manifests, list) else "no list"
        raise LayoutError(f"{index_path}: expected exactly one manifest, found {found}")
    entry = manifests[0]
    if not isinstance(entry, dict) or not isinstance(entry.get("digest"), str):
        raise LayoutError(f"{index_path}: the manifest entry {entry!r} has no digest")
    return entry


def read_image(layout: Path) -> LayoutImage:
    """Read the image that ``index.json`` names; fail naming the file unless there is exactly one."""
    digest = read_image_entry(layout)["digest"]
    path = blob_path(layout, digest)
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise LayoutError(
            f"{path}: the manifest {digest} that index.json names is not readable: {error}"
        ) from error
    return LayoutImage(digest=digest, manifest=manifest)
