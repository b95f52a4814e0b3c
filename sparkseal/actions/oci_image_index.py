"""Action: write an OCI image index (one manifest per platform) over images written by ``oci_image``.

The index is a small document, not a layout: the per-platform layouts already hold every blob, and copying
them into a third directory would write (and make a cache store) the whole image again. ``oci_push`` reads
the blobs from the per-platform layouts and pushes each manifest by digest before the index.

Entries keep the order the rule lists the images in, each with the platform its layout's ``index.json``
records, so the same images give the same index bytes on every machine.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from sparkseal.core.oci import (
    INDEX_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    LayoutError,
    canonical_json,
    read_image_entry,
)


class ImageIndexError(Exception):
    """The images cannot make one index; the message names the layout."""


def index_document(layouts: list[Path]) -> dict[str, object]:
    """The image index over the one image of each layout, in the given order."""
    if not layouts:
        raise ImageIndexError("an image index needs at least one image; got none")
    manifests: list[dict[str, object]] = []
    seen: dict[str, Path] = {}
    for layout in layouts:
        entry = read_image_entry(layout)
        platform = entry.get("platform")
        if not isinstance(platform, dict) or not platform.get("os") or not platform.get("architecture"):
            raise ImageIndexError(
                f"{layout / 'index.json'}: the image entry has platform {platform!r}, "
                f"expected an object with os and architecture"
            )
        if entry.get("mediaType") != MANIFEST_MEDIA_TYPE:
            raise ImageIndexError(
                f"{layout / 'index.json'}: the image entry has mediaType {entry.get('mediaType')!r}, "
                f"expected {MANIFEST_MEDIA_TYPE!r}"
            )
        if not isinstance(entry.get("size"), int):
            raise ImageIndexError(f"{layout / 'index.json'}: the image entry has no size")
        name = "/".join(str(platform[k]) for k in ("os", "architecture", "variant") if platform.get(k))
        if name in seen:
            raise ImageIndexError(f"{layout}: platform {name} is already the image of {seen[name]}")
        seen[name] = layout
        manifests.append(
            {
                "digest": entry["digest"],
                "mediaType": MANIFEST_MEDIA_TYPE,
                "platform": platform,
                "size": entry["size"],
            }
        )
    return {"manifests": manifests, "mediaType": INDEX_MEDIA_TYPE, "schemaVersion": 2}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", action="append", type=Path, default=[], help="an image layout directory")
    parser.add_argument("--index", type=Path, required=True, help="the index document to write")
    parser.add_argument("--digest", type=Path, required=True, help="file for the index digest")
    args = parser.parse_args(argv)
    try:
        data = canonical_json(index_document(args.image))
    except (ImageIndexError, LayoutError) as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    args.index.write_bytes(data)
    args.digest.write_text("sha256:" + hashlib.sha256(data).hexdigest(), encoding="ascii")
    return 0


if __name__ == "__main__":
    sys.exit(main())
