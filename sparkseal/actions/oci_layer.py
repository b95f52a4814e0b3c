"""Action: write one OCI layer deterministically: an uncompressed tar, its gzip or zstd blob and a descriptor.

The program of the ``oci_layer`` rule, a flat ``main``: it parses the arguments, prepares the scratch
trees and calls the jobs, each in its own module: gathering and checking the inputs (trees, links and
dirs specs, single files, explicit links, directories and modes) into ordered entries with their modes
and owners (``sparkseal.core.layer_plan``), writing the tar and its compressed blob
(``sparkseal.core.layer_write``), keeping one part of a split distribution (``sparkseal.install.layer_split``)
and scanning the files for secrets (``sparkseal.scan.layer``).

A layer of wheels (``--wheel``, with ``--platform``, ``--installer`` and ``--modules``) installs them
(``sparkseal.install.venv``) into a scratch directory of the action, writes them as a tree at ``/`` and
writes the module manifest of their files to ``--modules``; the scratch directory is removed when the
layer is written, so the build keeps the compressed layer and not the installed files (several GB for
torch and the CUDA wheels). With ``--bytecode`` the installed sources are byte-compiled first
(``sparkseal.install.bytecode``: reproducible unchecked-hash pycs, listed in each RECORD and so in the module
manifest). The layer's bytes are those of the same wheels installed into a directory
(``sparkseal.install.venv``) and written as a tree.

A layer of locked .debs (``--deb``, with ``--deb-lock``) unpacks them (``sparkseal.install.debian_rootfs``)
into a scratch directory the same way, and writes the tree, its links and directories at ``/``: the image
build keeps no unpacked root file system (it would be a second copy of the base layer in every cache).

With ``--split`` (a split file, ``sparkseal.core.wheel_split``) and ``--split-part``, the layer holds one
part of a distribution installed as two layers: ``lower`` installs the upstream wheel the split names and
leaves out the split's paths, their bytecode and the ``.dist-info``; ``upper`` installs our wheel and keeps
only those. Each part's module manifest names its own files, and the two merge into that of our wheel.

With ``--scanner`` the layer's files are scanned for secrets and private data (``sparkseal.scan.layer``:
our rules and the locked Kingfisher catalogue's) before anything is written, where they lie: the
installed wheels in the scratch directory, the inputs through their sandbox links (the catalogue reads
hard links to them). Reading them there costs a fraction of decompressing the written layer again. A
finding the allow-list (``--scan-allow``, the image's: paths inside the image, entries for other layers
expected not to match) does not cover fails the action: the findings are printed redacted and no
output is written, so Bazel caches nothing for a layer that leaks. A clean layer also writes
``--scan-report``, which names the scanner.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from sparkseal.core.deb import DROP_POLICIES, DebError
from sparkseal.core.layer_plan import LayerError, plan_layer
from sparkseal.core.layer_write import write_layer
from sparkseal.core.manifest import ManifestError, dumps, tree_manifest
from sparkseal.core.oci import LAYER_MEDIA_TYPES
from sparkseal.core.pzstd import ZstdUnavailable, load_zstandard
from sparkseal.core.repo_names import apparent_text
from sparkseal.core.tar import TarError
from sparkseal.core.wheel_split import PARTS, SplitError, load_split
from sparkseal.core.wheels import PLATFORMS, WheelError
from sparkseal.install.debian_rootfs import build_rootfs
from sparkseal.install.layer_split import image_keep, split_keep
from sparkseal.install.venv import DEFAULT_PREFIX, InstallError, install_wheels, read_replaces
from sparkseal.scan.catalogue import CatalogueError
from sparkseal.scan.layer import scan_entries
from sparkseal.scan.scanner import ScanInputError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], fromfile_prefix_chars="@")
    pair = {"action": "append", "nargs": 2, "default": []}
    parser.add_argument("--tree", **pair, metavar=("DIR", "DEST"), help="directory tree -> image prefix")
    parser.add_argument("--file", **pair, metavar=("SRC", "DEST"), help="single file -> image path")
    parser.add_argument("--links", **pair, metavar=("JSON", "DEST"), help="links spec -> image prefix")
    parser.add_argument("--dirs", **pair, metavar=("JSON", "DEST"), help="dirs spec -> image prefix")
    parser.add_argument("--symlink", **pair, metavar=("DEST", "TARGET"), help="one symlink")
    parser.add_argument("--dir", action="append", default=[], metavar="DEST", help="explicit directory")
    parser.add_argument("--mode", **pair, metavar=("DEST", "MODE"), help="mode override (octal)")
    wheels = parser.add_argument_group("wheels", "install wheels into the layer's virtual environment")
    wheels.add_argument("--wheel", type=Path, action="append", default=[], help="a wheel to install")
    wheels.add_argument("--platform", choices=PLATFORMS, help="target wheel platform")
    wheels.add_argument("--installer", type=Path, help="the locked installer wheel")
    wheels.add_argument("--venv", default=DEFAULT_PREFIX, help=f"venv path in the image ({DEFAULT_PREFIX})")
    wheels.add_argument("--no-pyvenv-cfg", action="store_true", help="leave pyvenv.cfg to another layer")
    wheels.add_argument("--replaces", type=Path, help="JSON policy: which project may replace whose files")
    wheels.add_argument("--modules", type=Path, help="write the module manifest of the wheels' files here")
    wheels.add_argument("--bytecode", action="store_true", help="byte-compile the installed sources")
    wheels.add_argument("--split", type=Path, help="split file of a distribution installed as two layers")
    wheels.add_argument("--split-part", choices=PARTS, help="which part of --split this layer holds")
    debian = parser.add_argument_group("debs", "unpack locked .debs at / (the base OS)")
    debian.add_argument("--deb", type=Path, action="append", default=[], help="a locked .deb to unpack")
    debian.add_argument("--deb-lock", type=Path, help="the Debian lock the .debs must be exactly")
    debian.add_argument("--deb-exclude", choices=sorted(DROP_POLICIES), default="slim")
    scan = parser.add_argument_group("scan", "scan the layer's files for secrets before writing it")
    scan.add_argument("--scanner", type=Path, help="the locked kingfisher binary")
    scan.add_argument("--scan-allow", type=Path, help="allow-list JSON (none: every finding fails)")
    scan.add_argument("--scan-report", type=Path, help="JSON report to write when the layer is clean")
    scan.add_argument("--label", default="layer", help="the layer's name in messages (its Bazel label)")
    parser.add_argument("--tar", type=Path, help="also write the uncompressed layer tar here")
    parser.add_argument("--compression", choices=sorted(LAYER_MEDIA_TYPES), default="gzip")
    parser.add_argument("--zstd-site", type=Path, help="the unpacked locked zstandard wheel (zstd blobs)")
    parser.add_argument("--blob", type=Path, required=True, help="blob to write (gzip or zstd)")
    parser.add_argument("--descriptor", type=Path, required=True, help="JSON descriptor to write")
    return parser


def _unpack_debs(args: argparse.Namespace, scratch: Path) -> tuple[Path, Path, Path]:
    """The locked .debs unpacked below ``scratch``: (tree, links spec, dirs spec)."""
    tree, links, dirs = scratch / "root", scratch / "links.json", scratch / "dirs.json"
    tree.mkdir()
    build_rootfs(args.deb, args.deb_lock, tree, links, dirs, args.deb_exclude)
    return tree, links, dirs


def _install(args: argparse.Namespace, scratch: Path) -> Callable[[str], bool] | None:
    """Install the wheels into ``scratch``; with a split, return which venv paths the layer keeps."""
    replaces = read_replaces(args.replaces) if args.replaces else {}
    install_wheels(
        args.wheel,
        scratch,
        args.platform,
        args.installer,
        args.venv,
        not args.no_pyvenv_cfg,
        replaces,
        bytecode=args.bytecode,
    )
    if args.split is None:
        return None
    return split_keep(load_split(args.split), args.split_part, scratch, args.venv, args.wheel)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status.

    The arguments are only parsed: which of them go together (wheels with a platform and the installer,
    bytecode and a split with wheels, the scanner with its report, ...) is decided once, when Bazel
    analyses the rules that write them (rules/private/python_venv.bzl, rules/private/oci_layer.bzl). What
    only this program can see, the content of its input files, is checked where it is read.
    """
    args = _parser().parse_args(argv)
    scanned: dict[str, object] | None = None
    try:
        zstandard = load_zstandard(args.zstd_site) if args.compression == "zstd" else None
        with contextlib.ExitStack() as stack:
            trees = [(Path(d), dest) for d, dest in args.tree]
            links = [(Path(j), dest) for j, dest in args.links]
            dirs = [(Path(j), dest) for j, dest in args.dirs]
            # Scratch space beside the outputs, so on the output tree's filesystem rather than a small /tmp.
            if args.deb:
                unpacked = stack.enter_context(
                    tempfile.TemporaryDirectory(prefix=".debs-", dir=args.blob.parent)
                )
                tree, links_spec, dirs_spec = _unpack_debs(args, Path(unpacked))
                trees.append((tree, "/"))
                links.append((links_spec, "/"))
                dirs.append((dirs_spec, "/"))
            modules = None
            scratch: Path | None = None
            venv_keep: Callable[[str], bool] | None = None
            keep: Callable[[str], bool] | None = None
            if args.wheel:
                scratch = Path(
                    stack.enter_context(tempfile.TemporaryDirectory(prefix=".wheels-", dir=args.blob.parent))
                )
                venv_keep = _install(args, scratch)
                trees.append((scratch, "/"))
                if venv_keep is not None:
                    keep = image_keep(venv_keep, args.venv, args.split_part)
            entries = plan_layer(
                trees=trees,
                files=[(Path(s), dest) for s, dest in args.file],
                links=links,
                dirs=dirs,
                symlinks=[tuple(s) for s in args.symlink],
                directories=args.dir,
                modes=[tuple(m) for m in args.mode],
                keep=keep,
            )
            if args.scanner is not None:
                # Beside the outputs, as the wheels' scratch: the scan's batches hard-link the files.
                workdir = args.blob.parent
                scanned = scan_entries(entries, args.label, args.scanner, args.scan_allow, workdir)
            digests: dict[Path, str] | None = {} if scratch is not None else None
            descriptor = write_layer(entries, args.tar, args.blob, digests, zstandard)
            if scratch is not None and digests is not None:
                # The module manifest from the digests the tar pass computed: the files are read once.
                venv = scratch / args.venv.strip("/")
                hashes = {
                    source.relative_to(venv).as_posix(): digest
                    for source, digest in digests.items()
                    if source.is_relative_to(venv)
                }
                modules = tree_manifest(scratch, args.venv, hashes, venv_keep)
    except (
        LayerError,
        TarError,
        InstallError,
        WheelError,
        ManifestError,
        CatalogueError,
        ScanInputError,
        SplitError,
        DebError,
        ZstdUnavailable,
        OSError,
    ) as exc:
        for written in (args.blob, args.tar):
            if written is not None:
                written.unlink(missing_ok=True)
        print(f"sparkseal: {apparent_text(str(exc))}", file=sys.stderr)
        return 1
    if modules is not None:
        args.modules.write_text(dumps(modules), encoding="ascii")
    if scanned is not None:
        args.scan_report.write_text(json.dumps(scanned, indent=2, sort_keys=True) + "\n", encoding="ascii")
    args.descriptor.write_text(json.dumps(descriptor, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
