"""Action: assemble an OCI image from layers: an image layout directory and a digest file.

Every JSON document the image holds (config, manifest, index, ``oci-layout``, the docker ``manifest.json``)
is written in one canonical form, because each digest is over exact bytes: the same image must have the same
manifest digest on every machine. Every date is SOURCE_DATE_EPOCH, and every layer has a history entry with
``created`` set (umoci 0.4.7 panics on a history entry without it).

The layout holds the config and manifest blobs; the layer blobs stay where the layer actions wrote them,
named by the layout's ``sparkseal-external-blobs.json`` (``sparkseal.core.oci.EXTERNAL_BLOBS``), so the
image costs kilobytes on top of its layers. ``bazel run //:image.load -- --oci-layout DIR`` writes an
ordinary, complete layout for tools that want one. No docker-archive is written here either: ``oci_load``
streams one when it is run (``sparkseal.core.docker_archive``), so a build writes the image once.

With ``--revision-from`` (a build with ``--stamp``: Bazel's stable status file) the config's label
``org.opencontainers.image.revision`` is this repository's commit (``-dirty`` appended for a tree with
uncommitted changes, ``sparkseal.core.source``); a build whose source is unknown fails rather than stamp
nothing. Without it there is no revision label, so the digest does not move with an unrelated commit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sparkseal.core.oci import (
    BLOB_DIR,
    CONFIG_MEDIA_TYPE,
    CREATED,
    DIGEST_RE,
    EXTERNAL_BLOBS,
    INDEX_MEDIA_TYPE,
    LAYER_MEDIA_TYPES,
    LAYOUT_VERSION,
    MANIFEST_MEDIA_TYPE,
    REF_NAME,
    REPOSITORY_RE,
    TAG_RE,
    canonical_json,
    write_blob,
)
from sparkseal.core.platforms import OciPlatform, oci_platform
from sparkseal.core.source import SourceError, parse_status

# The OCI label that names the source revision of the image: ours, and only when stamping asks for it.
REVISION_LABEL = "org.opencontainers.image.revision"


class OciError(Exception):
    """An input of the image is malformed or inconsistent; the message names it."""


@dataclass(frozen=True)
class Layer:
    """One layer of the image: its name (for the history), descriptor and compressed blob."""

    name: str
    digest: str
    size: int
    diff_id: str
    blob: Path
    media_type: str = LAYER_MEDIA_TYPES["gzip"]

    def descriptor(self) -> dict[str, object]:
        """The layer's descriptor in an image manifest."""
        return {"digest": self.digest, "mediaType": self.media_type, "size": self.size}


def load_layer(name: str, descriptor: Path, blob: Path) -> Layer:
    """Read a descriptor written by ``sparkseal.actions.oci_layer`` and check its fields."""
    try:
        data = json.loads(descriptor.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise OciError(f"layer descriptor {descriptor}: not a readable JSON object: {exc}") from exc
    if not isinstance(data, dict):
        raise OciError(f"layer descriptor {descriptor}: expected a JSON object, got {type(data).__name__}")
    if data.get("mediaType") not in LAYER_MEDIA_TYPES.values():
        expected = " or ".join(repr(t) for t in LAYER_MEDIA_TYPES.values())
        raise OciError(
            f"layer descriptor {descriptor}: mediaType is {data.get('mediaType')!r}, expected {expected}"
        )
    for key in ("digest", "diff_id"):
        if not isinstance(data.get(key), str) or not DIGEST_RE.fullmatch(data[key]):
            raise OciError(
                f"layer descriptor {descriptor}: {key} is {data.get(key)!r}, "
                f"expected 'sha256:' and 64 hex digits"
            )
    size = data.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise OciError(f"layer descriptor {descriptor}: size is {size!r}, expected a byte count")
    return Layer(name, data["digest"], size, data["diff_id"], blob, data["mediaType"])


@dataclass
class ImageConfig:
    """The runtime part of an image config (the ``config`` object of the OCI image config)."""

    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: list[str] = field(default_factory=list)
    workdir: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    user: str = ""

    def as_dict(self) -> dict[str, object]:
        """The ``config`` object, with only the fields that are set."""
        for item in self.env:
            name, eq, _ = item.partition("=")
            if not eq or not name:
                raise OciError(f"env entry {item!r}: expected NAME=VALUE")
        if self.workdir and not self.workdir.startswith("/"):
            raise OciError(f"workdir {self.workdir!r}: expected an absolute path")
        fields: dict[str, object] = {
            "Entrypoint": self.entrypoint,
            "Cmd": self.cmd,
            "Env": self.env or None,
            "WorkingDir": self.workdir or None,
            "Labels": self.labels or None,
            "User": self.user or None,
        }
        return {key: value for key, value in fields.items() if value is not None}


def split_tag(reference: str) -> tuple[str, str]:
    """Split ``repository:tag`` and check both parts against the docker reference grammar."""
    repository, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag:
        raise OciError(f"tag {reference!r}: expected REPOSITORY:TAG, e.g. sparkseal/vllm:0.25.1")
    if not REPOSITORY_RE.fullmatch(repository):
        raise OciError(
            f"tag {reference!r}: repository {repository!r} is not a valid name "
            f"(expected lower-case components separated by '/')"
        )
    if not TAG_RE.fullmatch(tag):
        raise OciError(f"tag {reference!r}: tag {tag!r} is not valid (expected [A-Za-z0-9_][A-Za-z0-9_.-]*)")
    return repository, tag


def image_config(layers: list[Layer], platform: OciPlatform, config: ImageConfig) -> dict[str, object]:
    """The OCI image config: platform, fixed dates, runtime config, diff_ids, a history entry per layer."""
    return {
        **platform.as_dict(),
        "config": config.as_dict(),
        "created": CREATED,
        "history": [{"created": CREATED, "created_by": layer.name} for layer in layers],
        "rootfs": {"diff_ids": [layer.diff_id for layer in layers], "type": "layers"},
    }


def external_blob_paths(layers: list[Layer], layout: Path) -> dict[str, str]:
    """Each layer blob's path relative to the layout directory, by digest (``EXTERNAL_BLOBS``).

    The blobs stay where the layer actions wrote them: the layout names them instead of holding a copy,
    so an image build writes its layers once. Paths are relative, so the same layout reads them in
    bazel-bin, in a runfiles tree and in a remote worker's output tree. The blobs are not read here (they
    are not even inputs of the action): the layer action wrote each blob with its descriptor, and load,
    push and ``sparkseal provenance check`` check sizes or digests when they read them.
    """
    paths: dict[str, str] = {}
    for layer in layers:
        where = os.path.relpath(layer.blob, layout)
        if paths.setdefault(layer.digest, where) != where:
            raise OciError(
                f"layer {layer.name}: blob {layer.digest} is given as {paths[layer.digest]} and {where}"
            )
    return dict(sorted(paths.items()))


def write_layout(
    layout: Path, layers: list[Layer], platform: OciPlatform, config: ImageConfig, tag: str
) -> tuple[str, str]:
    """Write the OCI image layout into ``layout`` (empty or absent); return the config, manifest digests."""
    if not layers:
        raise OciError("an image needs at least one layer; got none")
    _, short_tag = split_tag(tag)
    layout.mkdir(parents=True, exist_ok=True)
    if any(layout.iterdir()):
        raise OciError(
            f"layout directory {layout}: expected it empty, found {sorted(layout.iterdir())[0].name}"
        )
    (layout / BLOB_DIR).mkdir(parents=True)
    (layout / EXTERNAL_BLOBS).write_bytes(canonical_json(external_blob_paths(layers, layout)))
    config_blob = write_blob(
        layout, canonical_json(image_config(layers, platform, config)), CONFIG_MEDIA_TYPE
    )
    manifest = {
        "config": config_blob,
        "layers": [layer.descriptor() for layer in layers],
        "mediaType": MANIFEST_MEDIA_TYPE,
        "schemaVersion": 2,
    }
    manifest_blob = write_blob(layout, canonical_json(manifest), MANIFEST_MEDIA_TYPE)
    entry = {**manifest_blob, "annotations": {REF_NAME: short_tag}, "platform": platform.as_dict()}
    index = {"manifests": [entry], "mediaType": INDEX_MEDIA_TYPE, "schemaVersion": 2}
    (layout / "index.json").write_bytes(canonical_json(index))
    (layout / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": LAYOUT_VERSION}))
    return str(config_blob["digest"]), str(manifest_blob["digest"])


def assemble(
    layers: list[Layer],
    platform_name: str,
    config: ImageConfig,
    tag: str,
    layout: Path,
    digest_file: Path,
) -> str:
    """Write the layout and the digest file; return the image manifest digest."""
    try:
        platform = oci_platform(platform_name)
    except ValueError as exc:
        raise OciError(str(exc)) from exc
    _, digest = write_layout(layout, layers, platform, config, tag)
    digest_file.write_text(digest, encoding="ascii")
    return digest


def _key_values(items: list[str], flag: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise OciError(f"{flag} {item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


def stamped_revision(status: Path, labels: dict[str, str]) -> str:
    """The revision label's value from Bazel's stable status file; a conflicting ``--label`` or an
    unknown source is an error naming the file."""
    if REVISION_LABEL in labels:
        raise OciError(
            f"--label {REVISION_LABEL}: expected it only from --revision-from {status} (--stamp), "
            f"found it given as {labels[REVISION_LABEL]!r}"
        )
    try:
        return parse_status(status.read_text(encoding="utf-8"), str(status)).revision()
    except OSError as error:
        raise OciError(f"{status}: expected Bazel's stable status file, cannot read it: {error}") from None
    except SourceError as error:
        raise OciError(f"--stamp: {status}: {error}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--layer",
        action="append",
        nargs=3,
        default=[],
        metavar=("NAME", "DESCRIPTOR", "BLOB"),
        help="one layer, bottom first",
    )
    parser.add_argument("--platform", required=True, help="linux_aarch64 or linux_x86_64")
    parser.add_argument("--tag", required=True, help="REPOSITORY:TAG of the image")
    parser.add_argument("--entrypoint", action="append", help="one entrypoint word (use --entrypoint=WORD)")
    parser.add_argument("--cmd", action="append", help="one command word (use --cmd=WORD)")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE")
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    parser.add_argument(
        "--revision-from",
        type=Path,
        default=None,
        help=f"Bazel's stable status file: label {REVISION_LABEL} with this repository's commit (--stamp)",
    )
    parser.add_argument("--workdir", default="")
    parser.add_argument("--user", default="")
    parser.add_argument("--layout", type=Path, required=True, help="OCI image layout directory to write")
    parser.add_argument("--digest", type=Path, required=True, help="file for the image manifest digest")
    args = parser.parse_args(argv)
    try:
        layers = [load_layer(name, Path(d), Path(b)) for name, d, b in args.layer]
        labels = _key_values(args.label, "--label")
        if args.revision_from is not None:
            labels[REVISION_LABEL] = stamped_revision(args.revision_from, labels)
        config = ImageConfig(
            entrypoint=args.entrypoint,
            cmd=args.cmd,
            env=args.env,
            workdir=args.workdir,
            labels=labels,
            user=args.user,
        )
        assemble(layers, args.platform, config, args.tag, args.layout, args.digest)
    except OciError as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
