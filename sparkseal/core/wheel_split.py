"""One distribution installed as two layers: the upstream wheel's files below, ours above.

Why: our vLLM wheel and the upstream wheel of the same release differ in a handful of files (those our
patches and overlay change, add or delete) and in the ``.dist-info``. Installed as one layer, every edit of
a patch rewrote the whole vLLM layer and its hundreds of megabytes of extension modules. Installed as two:

* the lower layer installs the *upstream* wheel and leaves out the split's paths. Its inputs (the locked
  upstream wheel and the split file) keep their bytes when a patch's content changes, so Bazel does not run
  it again and a registry already holds its blob;
* the upper layer installs *our* wheel and keeps only the split's paths, their bytecode and the
  distribution's ``.dist-info`` (RECORD names every file, with our hashes, and the installer writes it).

Every other file is the same in both wheels (the split file lists every member whose bytes differ), so the
two layers stacked hold the bytes of our wheel installed as one.

The split file is written by the repack (``vllm_wheel``) as data::

    {"format": "sparkseal-wheel-split/1", "project": "vllm", "dist_info": "vllm-0.25.1.dist-info",
     "upstream_wheel": {"file": "vllm-....whl", "sha256": "..."}, "paths": ["vllm/a.py", ...]}

``paths`` are wheel members outside the ``.dist-info`` that are changed, added or deleted by us, sorted.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkseal.core.paths import UnsafePath, check_relative

FORMAT = "sparkseal-wheel-split/1"
LOWER, UPPER = "lower", "upper"
PARTS = (LOWER, UPPER)

# A split path must install below site-packages: `.data/` members go to other directories of the venv,
# and entry points generate scripts in bin/, which the upper layer does not hold.
_REFUSED = (".data/", ".dist-info/")


class SplitError(Exception):
    """The split file is malformed or does not describe this layer's wheels; the message names it."""


def differing_paths(upstream: Mapping[str, bytes], ours: Mapping[str, bytes], dist_info: str) -> list[str]:
    """The members outside ``dist_info`` that one wheel has and the other lacks or holds other bytes of."""
    names = set(upstream) | set(ours)
    return sorted(
        name
        for name in names
        if not name.startswith(dist_info + "/") and upstream.get(name) != ours.get(name)
    )


def split_document(
    project: str, dist_info: str, upstream_file: str, upstream_sha256: str, paths: list[str]
) -> str:
    """The split file's text (sorted keys, one trailing newline: it is reviewed in diffs of build outputs)."""
    document = {
        "format": FORMAT,
        "project": project,
        "dist_info": dist_info,
        "upstream_wheel": {"file": upstream_file, "sha256": upstream_sha256},
        "paths": sorted(paths),
    }
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class WheelSplit:
    """A parsed split file: which installed files of ``project`` the upper layer holds."""

    project: str
    dist_info: str
    upstream_file: str
    upstream_sha256: str
    paths: frozenset[str]

    def upper_keys(self) -> frozenset[str]:
        """The listed paths and the bytecode of the listed sources, relative to site-packages."""
        pycs = {importlib.util.cache_from_source(p, optimization="") for p in self.paths if p.endswith(".py")}
        return self.paths | frozenset(pycs)

    def is_upper(self, key: str, upper_keys: frozenset[str]) -> bool:
        """True when the file at ``key`` (relative to site-packages) belongs to the upper layer."""
        return key in upper_keys or key.startswith(self.dist_info + "/")


def load_split(path: Path) -> WheelSplit:
    """Read and check a split file; errors name the file, the field, what was expected and what was found."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SplitError(f"{path}: not a readable JSON split file: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise SplitError(f"{path}: expected format {FORMAT!r}, found {found!r}")
    upstream = data.get("upstream_wheel")
    fields = {
        "project": data.get("project"),
        "dist_info": data.get("dist_info"),
        "upstream_wheel.file": upstream.get("file") if isinstance(upstream, dict) else None,
        "upstream_wheel.sha256": upstream.get("sha256") if isinstance(upstream, dict) else None,
    }
    for name, value in fields.items():
        if not isinstance(value, str) or not value:
            raise SplitError(f"{path}: expected a non-empty string in {name}, found {value!r}")
    dist_info = str(fields["dist_info"])
    if "/" in dist_info or not dist_info.endswith(".dist-info"):
        raise SplitError(
            f"{path}: dist_info: expected a NAME-VERSION.dist-info directory, found {dist_info!r}"
        )
    paths = data.get("paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise SplitError(f"{path}: paths: expected a list of wheel member paths, found {paths!r}")
    for member in paths:
        try:
            normal = check_relative(member, f"{path}: paths").as_posix()
        except UnsafePath as exc:
            raise SplitError(str(exc)) from exc
        if normal != member:
            raise SplitError(
                f"{path}: paths: expected normalised member paths, found {member!r} ({normal!r})"
            )
        first = member.split("/", 1)[0]
        for suffix in _REFUSED:
            if first.endswith(suffix.rstrip("/")):
                raise SplitError(
                    f"{path}: paths: {member!r} lies in a {suffix.rstrip('/')} directory; a split holds "
                    f"site-packages modules only (the upper layer keeps the whole .dist-info already)"
                )
    return WheelSplit(
        project=str(fields["project"]),
        dist_info=dist_info,
        upstream_file=str(fields["upstream_wheel.file"]),
        upstream_sha256=str(fields["upstream_wheel.sha256"]),
        paths=frozenset(paths),
    )
