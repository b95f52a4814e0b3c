"""The docker-archive format (what ``docker load`` and ``podman load`` read), streamed from an OCI layout.

An image is stored once, as its OCI layout; the archive is the same blobs (gzip layers included, which
both engines decompress) under ``blobs/sha256/`` and a ``manifest.json`` naming the config, the layers and
one repository tag. It is written on demand, to a pipe or a file, so no build writes (and no cache stores)
the image a second time.

A docker-archive cannot carry zstd layers (skopeo: "zstd compression is not supported for docker
images"), so a zstd layer goes in as its uncompressed tar, named by its diff_id as ``docker save`` names
layers: the engine checks it against the config's diff_ids as usual. Its size is counted by a first
decompression, since a tar member's header comes before its bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparkseal.core.oci import (
    ZSTD_LAYER_MEDIA_TYPE,
    LayoutError,
    blob_path,
    canonical_json,
    read_image,
)
from sparkseal.core.pzstd import reader
from sparkseal.core.tar import CHUNK, TarWriter, Writable

# Members are plain files of the archive, read by the engine: one mode for all, as in the layout.
BLOB_MODE = 0o644


def _tar_size(blob: Path, zstandard: Any) -> int:
    size = 0
    with blob.open("rb") as raw:
        source = reader(raw, zstandard)
        while chunk := source.read(CHUNK):
            size += len(chunk)
    return size


def write_docker_archive(layout: Path, stream: Writable, tag: str, zstandard: Any = None) -> None:
    """Write the docker-archive of ``layout``'s image, tagged ``tag`` (REPOSITORY:TAG), to ``stream``.

    ``zstandard`` (the imported python-zstandard module) is needed only for an image of zstd layers.
    """
    image = read_image(layout)
    config = image.manifest["config"]["digest"]
    blob_name = "blobs/sha256/{}".format
    zstd = [layer for layer in image.layers if layer.get("mediaType") == ZSTD_LAYER_MEDIA_TYPE]
    if zstd and zstandard is None:
        raise LayoutError(
            f"{layout}: {len(zstd)} zstd layers go into a docker-archive uncompressed, which needs the "
            f"zstandard module; expected --zstd-site (oci_load passes it for an image of zstd layers)"
        )
    diff_ids: list[str] = []
    if zstd:
        with blob_path(layout, config).open("rb") as config_blob:
            diff_ids = list(json.load(config_blob).get("rootfs", {}).get("diff_ids", []))
        if len(diff_ids) != len(image.layers):
            raise LayoutError(
                f"{layout}: the config names {len(diff_ids)} diff_ids for {len(image.layers)} layers"
            )
    # Sizes before the first byte is written: a blob kept outside the layout (``EXTERNAL_BLOBS``) that is
    # missing or is another file fails here, with nothing sent to the engine.
    for descriptor in [image.manifest["config"], *image.layers]:
        path = blob_path(layout, descriptor["digest"])
        try:
            size = path.stat().st_size
        except OSError as error:
            raise LayoutError(f"{path}: blob {descriptor['digest']} is not readable: {error}") from error
        if size != descriptor.get("size"):
            raise LayoutError(
                f"{path}: blob {descriptor['digest']} has {size} bytes, expected {descriptor.get('size')}"
            )
    # Each layer's archive member: its blob, or for a zstd layer its tar, under its diff_id (with the blob
    # and the tar's size, counted before the archive is written).
    members: list[str] = []
    tars: dict[str, tuple[Path, int]] = {}
    for i, layer in enumerate(image.layers):
        if layer.get("mediaType") == ZSTD_LAYER_MEDIA_TYPE:
            blob = blob_path(layout, layer["digest"])
            tars[diff_ids[i]] = (blob, _tar_size(blob, zstandard))
            members.append(diff_ids[i])
        else:
            members.append(layer["digest"])
    manifest = [
        {
            "Config": blob_name(config.removeprefix("sha256:")),
            "Layers": [blob_name(digest.removeprefix("sha256:")) for digest in members],
            "RepoTags": [tag],
        }
    ]
    writer = TarWriter(stream)
    writer.directory("blobs")
    writer.directory("blobs/sha256")
    # Every blob the image needs (and its manifest, as in the layout), in digest order; a missing one
    # fails with its path.
    for digest in sorted({config, image.digest, *members}):
        name = blob_name(digest.removeprefix("sha256:"))
        if digest in tars:
            blob, size = tars[digest]
            with blob.open("rb") as raw:
                writer.stream(name, BLOB_MODE, size, reader(raw, zstandard))
        else:
            writer.file(name, BLOB_MODE, blob_path(layout, digest))
    writer.data("manifest.json", canonical_json(manifest))
    writer.close()
