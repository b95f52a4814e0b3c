"""The docker-archive format (what ``docker load`` and ``podman load`` read), streamed from an OCI layout.

An image is stored once, as its OCI layout; the archive is the same blobs (gzip layers included, which
both engines decompress) under ``blobs/sha256/`` and a ``manifest.json`` naming the config, the layers and
one repository tag. It is written on demand, to a pipe or a file, so no build writes (and no cache stores)
the image a second time.
"""

from __future__ import annotations

from pathlib import Path

from sparkseal.core.oci import LayoutError, blob_path, canonical_json, read_image
from sparkseal.core.tar import TarWriter, Writable

# Members are plain files of the archive, read by the engine: one mode for all, as in the layout.
BLOB_MODE = 0o644


def write_docker_archive(layout: Path, stream: Writable, tag: str) -> None:
    """Write the docker-archive of ``layout``'s image, tagged ``tag`` (REPOSITORY:TAG), to ``stream``."""
    image = read_image(layout)
    config = image.manifest["config"]["digest"]
    layers = [layer["digest"] for layer in image.layers]
    blob_name = "blobs/sha256/{}".format
    manifest = [
        {
            "Config": blob_name(config.removeprefix("sha256:")),
            "Layers": [blob_name(digest.removeprefix("sha256:")) for digest in layers],
            "RepoTags": [tag],
        }
    ]
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
    writer = TarWriter(stream)
    writer.directory("blobs")
    writer.directory("blobs/sha256")
    # Every blob the image needs (and its manifest, as in the layout), in digest order; a missing one
    # fails with its path.
    for digest in sorted({config, image.digest, *layers}):
        writer.file(blob_name(digest.removeprefix("sha256:")), BLOB_MODE, blob_path(layout, digest))
    writer.data("manifest.json", canonical_json(manifest))
    writer.close()
