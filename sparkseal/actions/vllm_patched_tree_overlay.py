"""Action: copy the patched tree and drop our downstream files onto it, as the overlay manifest allows.

The manifest (``overlay.json`` beside the overlay files) is JSON::

    {"files": {"vllm/x.py": "why this file exists"}, "replaces": {"vllm/y.py": "why it replaces upstream"}}

Every overlay file must be listed under ``files``. A file that already exists in the patched tree may only
be overwritten when ``replaces`` names it; if a patch of the series changed that file, the error says so.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from sparkseal.core.patchset import PatchError, parse_patch
from sparkseal.core.paths import UnsafePath, check_relative, resolve_inside
from sparkseal.core.tree import copy_tree, normalised_mode


class OverlayError(Exception):
    """The overlay or its manifest is inconsistent, unsafe, or conflicts with the patched tree."""


def load_manifest(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Return the manifest's ``files`` and ``replaces`` maps, checked for shape and safe paths."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise OverlayError(f"{path}: not a readable JSON manifest: {exc}") from exc
    if not isinstance(data, dict) or set(data) - {"files", "replaces"}:
        raise OverlayError(f"{path}: expected an object with keys 'files' and 'replaces', got {data!r:.80}")
    maps: list[dict[str, str]] = []
    for key in ("files", "replaces"):
        value = data.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) and v for v in value.values()):
            raise OverlayError(f"{path}: '{key}' must map each path to a non-empty reason")
        for rel in value:
            try:
                check_relative(rel, f"{path}: {key}")
            except UnsafePath as exc:
                raise OverlayError(str(exc)) from exc
        maps.append(value)
    files, replaces = maps
    stray = sorted(set(replaces) - set(files))
    if stray:
        raise OverlayError(f"{path}: 'replaces' names {stray[0]}, which is not listed under 'files'")
    return files, replaces


def patched_by(patches: list[Path]) -> dict[str, str]:
    """Map each file a patch changes to the (last) patch that changes it."""
    owners: dict[str, str] = {}
    for patch in patches:
        for target in parse_patch(patch).targets:
            owners[target] = patch.name
    return owners


def apply_overlay(
    tree: Path, overlay_files: dict[str, Path], manifest: Path, patches: list[Path]
) -> list[str]:
    """Write ``overlay_files`` (relative path -> source file) into ``tree``; return the paths written."""
    listed, replaces = load_manifest(manifest)
    given = set(overlay_files)
    if given - set(listed):
        raise OverlayError(
            f"{manifest}: overlay file {sorted(given - set(listed))[0]} is not listed in 'files'"
        )
    if set(listed) - given:
        raise OverlayError(
            f"{manifest}: lists {sorted(set(listed) - given)[0]}, but no such overlay file exists"
        )
    owners = patched_by(patches)
    for rel in sorted(overlay_files):
        where = f"overlay file {rel}"
        try:
            target = resolve_inside(tree, check_relative(rel, where), where)
        except UnsafePath as exc:
            raise OverlayError(str(exc)) from exc
        if target.exists() and rel not in replaces:
            if rel in owners:
                raise OverlayError(
                    f"{where} would replace a file that patch {owners[rel]} modified; list it under "
                    f"'replaces' in {manifest} with a reason if that is intended"
                )
            raise OverlayError(
                f"{where} would replace the upstream file {rel}; list it under 'replaces' in {manifest} "
                f"with a reason if that is intended"
            )
        if rel in replaces and not target.exists():
            raise OverlayError(f"{manifest}: 'replaces' names {rel}, but the patched tree has no such file")
    for rel, source in sorted(overlay_files.items()):
        target = tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(normalised_mode(source.stat().st_mode))
    return sorted(overlay_files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="patched tree")
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--file", action="append", default=[], metavar="REL=PATH", help="overlay file")
    parser.add_argument("--patch", action="append", type=Path, default=[], help="patches of the series")
    parser.add_argument("--out", type=Path, required=True, help="output tree (empty directory)")
    args = parser.parse_args(argv)
    files = {}
    for spec in args.file:
        rel, _, path = spec.partition("=")
        files[rel] = Path(path)
    try:
        copy_tree(args.src, args.out)
        apply_overlay(args.out, files, args.manifest, args.patch)
    except (OverlayError, PatchError, ValueError) as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
