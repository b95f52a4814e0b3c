"""Compare the outputs of two builds and explain each difference down to the file that differs.

Plain outputs are compared by sha256. An OCI image layout is compared as an image: manifest, config, then
each layer by position (named by the config's history, which carries the layer's Bazel label), then the
members of a differing layer (type, mode, owner, mtime, link target, content). For each differing file, and
for the first differing members of a layer, a diffoscope report is written (Debian's ``diffoscope``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkseal.audit.rebuild import artifact_digests
from sparkseal.core.archives import ArchiveError, open_tar
from sparkseal.core.digests import sha256_stream
from sparkseal.core.oci import blob_path, is_layout, layer_tar, read_image

# Members of one layer that get their own diffoscope report; the rest are listed by name.
DIFFOSCOPE_MEMBERS = 3
# diffoscope on multi-GB archives takes hours: larger files are only named (their layers are drilled into).
DIFFOSCOPE_MAX_BYTES = 512 << 20
DIFFOSCOPE_TIMEOUT_S = 600
LISTED_MEMBERS = 20
_CHUNK = 1 << 20


@dataclass
class Difference:
    """One output that differs: the artifact, where inside it, the image layers that differ (by name and
    the two digests), and the diffoscope reports written."""

    artifact: str
    detail: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)
    layers: list[dict[str, str]] = field(default_factory=list)


@dataclass
class _Member:
    kind: str
    mode: int
    owner: str
    mtime: int
    link: str
    sha256: str

    def describe(self) -> str:
        return (
            f"{self.kind} mode {self.mode:04o} owner {self.owner} mtime {self.mtime} "
            f"{'-> ' + self.link if self.link else self.sha256[:19]}"
        )


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:150]


def diffoscope(first: Path, second: Path, report: Path) -> str:
    """Write a diffoscope text report of two files; return its path, or a note why there is none."""
    tool = shutil.which("diffoscope")
    if tool is None:
        return "no diffoscope report: diffoscope is not installed (Debian package diffoscope-minimal)"
    if max(first.stat().st_size, second.stat().st_size) > DIFFOSCOPE_MAX_BYTES:
        return f"no diffoscope report: {first.name} is larger than {DIFFOSCOPE_MAX_BYTES >> 20} MiB"
    report.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            [tool, "--no-progress", "--text", str(report), str(first), str(second)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=DIFFOSCOPE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"no diffoscope report: diffoscope ran past {DIFFOSCOPE_TIMEOUT_S} s on {first.name}"
    return str(report)


# --- OCI images -------------------------------------------------------------------------------------


def _json_blob(layout: Path, digest: str) -> Any:
    return json.loads(blob_path(layout, digest).read_text(encoding="utf-8"))


def _image(layout: Path) -> tuple[str, dict[str, Any], list[tuple[str, str]]]:
    """(manifest digest, config, [(layer digest, layer name)]) of the layout's one image."""
    image = read_image(layout)
    config = _json_blob(layout, image.manifest["config"]["digest"])
    layers = image.layers
    names = [h.get("created_by", "") for h in config.get("history", []) if not h.get("empty_layer")]
    return (
        image.digest,
        config,
        [(layer["digest"], names[i] if i < len(names) else f"layer {i}") for i, layer in enumerate(layers)],
    )


def _members(blob: Path) -> dict[str, _Member]:
    """Every member of a layer blob by name; its tar read bounded (:func:`open_tar`), as all layers are."""
    members = {}
    with blob.open("rb") as raw, open_tar(str(blob), layer_tar(raw)) as tar:
        for info in tar:
            content = ""
            if info.isfile():
                stream = tar.extractfile(info)
                assert stream is not None  # a regular member always has content
                content = sha256_stream(stream)
            kind = (
                "file" if info.isfile() else "dir" if info.isdir() else "symlink" if info.issym() else "other"
            )
            members[info.name.removeprefix("./")] = _Member(
                kind, info.mode, f"{info.uid}:{info.gid}", int(info.mtime), info.linkname, content
            )
    return members


def _extract(blob: Path, name: str, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with blob.open("rb") as raw, open_tar(str(blob), layer_tar(raw)) as tar:
        for info in tar:
            if info.name.removeprefix("./") == name and info.isfile():
                stream = tar.extractfile(info)
                assert stream is not None
                with open(dest, "wb") as out:
                    shutil.copyfileobj(stream, out, _CHUNK)
                break
    return dest


def _layer_difference(
    first: Path, second: Path, name: str, digests: tuple[str, str], report_dir: Path
) -> tuple[list[str], list[str]]:
    blob_a, blob_b = blob_path(first, digests[0]), blob_path(second, digests[1])
    detail = [f"layer {name}: {digests[0]} vs {digests[1]}"]
    try:
        a, b = _members(blob_a), _members(blob_b)
    except (ArchiveError, tarfile.TarError) as error:  # unreadable: the difference stands, unexplained
        return [*detail, f"  members not compared: {error}"], []
    changed = sorted(n for n in a.keys() & b.keys() if a[n] != b[n])
    detail += [f"  only in the first build: {n}" for n in sorted(a.keys() - b.keys())[:LISTED_MEMBERS]]
    detail += [f"  only in the second build: {n}" for n in sorted(b.keys() - a.keys())[:LISTED_MEMBERS]]
    for n in changed[:LISTED_MEMBERS]:
        detail.append(f"  {n}: {a[n].describe()} vs {b[n].describe()}")
    if len(changed) > LISTED_MEMBERS:
        detail.append(f"  ... and {len(changed) - LISTED_MEMBERS} more differing members")
    if a == b:
        detail.append("  same members and contents: only the compressed bytes differ")
    reports = []
    content = [n for n in changed if a[n].kind == "file" and a[n].sha256 != b[n].sha256]
    for n in content[:DIFFOSCOPE_MEMBERS]:
        base = report_dir / _safe_name(name) / _safe_name(n)
        one = _extract(blob_a, n, base / "first" / Path(n).name)
        two = _extract(blob_b, n, base / "second" / Path(n).name)
        reports.append(diffoscope(one, two, base.parent / (base.name + ".diffoscope.txt")))
    return detail, reports


def compare_layouts(artifact: str, first: Path, second: Path, report_dir: Path) -> Difference | None:
    """The difference of two OCI layouts as images, or None when their manifests are the same."""
    digest_a, config_a, layers_a = _image(first)
    digest_b, config_b, layers_b = _image(second)
    if digest_a == digest_b:
        return None
    difference = Difference(artifact, [f"image manifest: {digest_a} vs {digest_b}"])
    if len(layers_a) != len(layers_b):
        difference.detail.append(f"layer count: {len(layers_a)} vs {len(layers_b)}")
    for (layer_a, name), (layer_b, _) in zip(layers_a, layers_b, strict=False):
        if layer_a != layer_b:
            difference.layers.append({"layer": name, "first": layer_a, "second": layer_b})
            detail, reports = _layer_difference(first, second, name, (layer_a, layer_b), report_dir)
            difference.detail += detail
            difference.reports += reports
    strip = ("rootfs", "history")
    plain_a = {k: v for k, v in config_a.items() if k not in strip}
    plain_b = {k: v for k, v in config_b.items() if k not in strip}
    for key in sorted(plain_a.keys() | plain_b.keys()):
        if plain_a.get(key) != plain_b.get(key):
            difference.detail.append(f"config {key}: {plain_a.get(key)!r} vs {plain_b.get(key)!r}")
    return difference


# --- whole builds -----------------------------------------------------------------------------------


def group_layouts(outputs: Mapping[str, Path]) -> dict[str, Path]:
    """Outputs with each OCI layout directory as one entry (Bazel reports a tree artifact file by file)."""
    roots = {
        rel.removesuffix("/oci-layout"): path.parent
        for rel, path in outputs.items()
        if rel.endswith("/oci-layout") and is_layout(path.parent)
    }
    grouped = {rel: path for rel, path in outputs.items() if not any(rel.startswith(r + "/") for r in roots)}
    grouped.update(roots)
    return grouped


def compare_outputs(
    first: Mapping[str, Path], second: Mapping[str, Path], report_dir: Path
) -> list[Difference]:
    """Every difference between two builds' outputs of one target (``{bin path: file}`` each)."""
    first, second = group_layouts(first), group_layouts(second)
    differences = []
    plain_a, plain_b = {}, {}
    for rel in sorted(first.keys() | second.keys()):
        a, b = first.get(rel), second.get(rel)
        if a is None or b is None:
            which = "second" if a is None else "first"
            differences.append(Difference(rel, [f"output only in the {which} build"]))
        elif is_layout(a) and is_layout(b):
            found = compare_layouts(rel, a, b, report_dir)
            if found:
                differences.append(found)
        else:
            plain_a[rel], plain_b[rel] = a, b
    digests_a, digests_b = artifact_digests(plain_a), artifact_digests(plain_b)
    for rel in sorted(digests_a.keys() | digests_b.keys()):
        if digests_a.get(rel) == digests_b.get(rel):
            continue
        difference = Difference(
            rel, [f"sha256: {digests_a.get(rel, 'absent')} vs {digests_b.get(rel, 'absent')}"]
        )
        a, b = _resolve(plain_a, rel), _resolve(plain_b, rel)
        if a is not None and b is not None:
            difference.reports.append(diffoscope(a, b, report_dir / (_safe_name(rel) + ".diffoscope.txt")))
        differences.append(difference)
    return differences


def _resolve(outputs: Mapping[str, Path], rel: str) -> Path | None:
    for root_rel, path in outputs.items():
        if rel == root_rel:
            return path
        if rel.startswith(root_rel + "/"):
            found = path / rel[len(root_rel) + 1 :]
            return found if found.is_file() else None
    return None
