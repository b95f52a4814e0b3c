"""The OCI image layout format: media types, canonical JSON, blob paths, and a reader of a layout's image.

The image writer (``sparkseal.actions.oci_image``) and every reader (``sparkseal verify``'s comparison,
``sparkseal provenance check``) share these, so a layout is written and read by one definition.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkseal.core.determinism import SOURCE_DATE_EPOCH

# The OCI media type of gzip-compressed layers: the compression every consumer of our images reads. zstd
# layers are refused by umoci 0.4.7 and cannot go into a docker-archive (bench/results/compression.md).
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
LAYOUT_VERSION = "1.0.0"

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


def canonical_json(value: object) -> bytes:
    """Sorted keys, no whitespace, ASCII only, no trailing newline: one byte form per document.

    A blob's digest is over its exact bytes, so another key order, an indent or a final newline would make
    another image with the same content.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def blob_path(layout: Path, digest: str) -> Path:
    """The file of blob ``digest`` (``sha256:<hex>``) inside the layout directory."""
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


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
