"""`sparkseal.audit.compare`: two builds' OCI layouts compared layer by layer, their tars read bounded.

The layouts are built here; no diffoscope runs (the differing members are links and a refused layer).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

from sparkseal.audit.compare import compare_layouts


def _blob(root: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs/sha256").mkdir(parents=True, exist_ok=True)
    (root / "blobs/sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _layout(root: Path, layer: bytes) -> str:
    """An OCI layout of one image with one layer (named "//:app" in its history); the layer's digest."""
    config = {"architecture": "arm64", "os": "linux", "history": [{"created_by": "//:app"}]}
    descriptor = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **_blob(root, layer)}
    manifest = {
        "schemaVersion": 2,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            **_blob(root, json.dumps(config).encode()),
        },
        "layers": [descriptor],
    }
    top = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **_blob(root, json.dumps(manifest).encode()),
    }
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return str(descriptor["digest"])


def _layer(links: dict[str, str], tar_format: int = tarfile.PAX_FORMAT) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tar_format) as tar:
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return gzip.compress(raw.getvalue(), mtime=0)


def test_differing_layers_are_compared_member_by_member(tmp_path: Path) -> None:
    first = _layout(tmp_path / "a", _layer({"etc/link": "one"}))
    second = _layout(tmp_path / "b", _layer({"etc/link": "two"}))
    found = compare_layouts("//:image", tmp_path / "a", tmp_path / "b", tmp_path / "reports")
    assert found is not None
    assert found.detail[1:] == [
        f"layer //:app: {first} vs {second}",
        "  etc/link: symlink mode 0644 owner 0:0 mtime 0 -> one vs "
        "symlink mode 0644 owner 0:0 mtime 0 -> two",
    ]


def test_a_layer_header_over_the_limit_is_refused_not_read(tmp_path: Path) -> None:
    """A pax path of 4 MiB (a few KB gzipped) is refused from its header block, naming blob and member."""
    first = _layout(tmp_path / "a", _layer({"etc/link": "one"}))
    long = "d/" * (2 << 20)
    hostile = _layer({"etc/link": "one", long: "x"})
    second = _layout(tmp_path / "b", hostile)
    raw = gzip.decompress(hostile)
    stated = tarfile.TarInfo.frombuf(raw[512:1024], "utf-8", "surrogateescape").size
    assert stated > 1 << 20
    found = compare_layouts("//:image", tmp_path / "a", tmp_path / "b", tmp_path / "reports")
    assert found is not None
    blob = tmp_path / "b/blobs/sha256" / second.removeprefix("sha256:")
    assert found.detail[1:] == [
        f"layer //:app: {first} vs {second}",
        f"  members not compared: {blob}: refused, not read further: member 2 (its header at byte 512 of "
        f"the tar): its pax extended header states {stated} bytes, over the limit of 1048576 bytes "
        "(MAX_HEADER_BYTES)",
    ]
