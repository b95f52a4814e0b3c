"""Action: write the module manifest (``sparkseal.core.manifest``) of installed trees, of layers or of a PEX.

``module_manifest --tree DIR --prefix /opt/venv --out manifest.json`` (``DIR`` holds the image's files, the
virtual environment at ``DIR/opt/venv``), ``module_manifest --part LAYER.modules.json ... --out ...`` (the
manifests that wheel layers wrote of their own files, merged as the image stacks them), or
``module_manifest --pex APP.pex --out ...``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path, PurePosixPath

from sparkseal.core.manifest import (
    DEFAULT_PREFIX,
    ManifestError,
    dumps,
    load_manifest,
    merge_manifests,
    merge_trees,
    pex_manifest,
    tree_manifest,
)


def main(argv: list[str] | None = None) -> int:
    """Action entry point: write the manifest of ``--tree``/``--prefix`` or of ``--pex`` to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--tree",
        type=Path,
        action="append",
        help="directory of the image's files (venv at TREE/PREFIX); repeat for the trees of several layers",
    )
    source.add_argument(
        "--part",
        type=Path,
        action="append",
        help="the manifest a wheel layer wrote of its own files; repeat for each layer, bottom first",
    )
    source.add_argument("--pex", type=Path, help="a PEX file or a packed/loose PEX directory")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"venv path in the image ({DEFAULT_PREFIX})")
    parser.add_argument("--out", type=Path, required=True, help="manifest JSON to write")
    args = parser.parse_args(argv)
    if args.tree is None and args.prefix != DEFAULT_PREFIX:
        parser.error("--prefix applies to --tree only (a layer's manifest names its own prefix)")
    if not PurePosixPath(args.prefix).is_absolute():
        parser.error(f"--prefix {args.prefix}: expected an absolute path such as {DEFAULT_PREFIX}")
    try:
        if args.tree:
            with tempfile.TemporaryDirectory(prefix="module-manifest-") as scratch:
                manifest = tree_manifest(merge_trees(args.tree, Path(scratch)), args.prefix)
        elif args.part:
            manifest = merge_manifests([(str(part), load_manifest(part)) for part in args.part])
        else:
            manifest = pex_manifest(args.pex)
    except ManifestError as error:
        print(f"module_manifest: {error}", file=sys.stderr)
        return 1
    args.out.write_text(dumps(manifest), encoding="ascii")
    return 0


if __name__ == "__main__":
    sys.exit(main())
