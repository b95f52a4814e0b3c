"""``bazel run`` program of ``oci_load``: stream an image's docker-archive to a container engine or a file.

The archive is made from the OCI layout at the moment it is needed, so that no build writes the image
twice: ``bazel run //:image.load`` pipes it into ``podman load`` (or ``docker load``); with ``--output
FILE`` it goes to a file, written beside it under another name and renamed when complete, so that no
half-written archive is left behind. With ``--oci-layout DIR`` it writes the image as an ordinary OCI
layout instead (every blob under ``DIR/blobs``, hard-linked where it can be), for ``skopeo copy oci:DIR``,
umoci and other tools that do not follow the build's external layer blobs.

An image of zstd layers keeps them in the OCI layout; a docker-archive gets their tars uncompressed
(``sparkseal.core.docker_archive``), with the zstandard wheel the rule passes as ``--zstd-site``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from sparkseal.core.docker_archive import write_docker_archive
from sparkseal.core.oci import LayoutError, write_complete_layout
from sparkseal.core.pzstd import ZstdUnavailable, load_zstandard


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", type=Path, required=True, help="the image's OCI layout directory")
    parser.add_argument("--tag", required=True, help="REPOSITORY:TAG the engine names the image")
    parser.add_argument("--zstd-site", type=Path, help="the unpacked zstandard wheel (zstd layers)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--output", type=Path, help="write the archive to this file (default: stdout)")
    where.add_argument("--oci-layout", type=Path, help="write a complete OCI layout to this new directory")
    args = parser.parse_args(argv)
    try:
        zstandard = load_zstandard(args.zstd_site) if args.zstd_site is not None else None
        if args.oci_layout is not None:
            dest = args.oci_layout.absolute()
            if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
                raise LayoutError(f"--oci-layout {dest}: expected a new or empty directory")
            partial = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
            try:
                write_complete_layout(args.layout, partial)
                partial.chmod(0o755)
                if dest.exists():
                    dest.rmdir()
                partial.rename(dest)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
            print(f"wrote the OCI layout {dest}", file=sys.stderr)
            return 0
        if args.output is None:
            if sys.stdout.isatty():
                print(
                    "sparkseal: refusing to write a tar archive to a terminal (use --output FILE)",
                    file=sys.stderr,
                )
                return 2
            write_docker_archive(args.layout, sys.stdout.buffer, args.tag, zstandard)
            sys.stdout.buffer.flush()
            return 0
        output = args.output.resolve()
        handle, partial = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
        try:
            with os.fdopen(handle, "wb") as stream:
                write_docker_archive(args.layout, stream, args.tag, zstandard)
            os.chmod(partial, 0o644)
            os.replace(partial, output)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
        print(f"wrote {output}", file=sys.stderr)
    except (LayoutError, ZstdUnavailable) as exc:
        print(f"sparkseal: load: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the engine stopped reading; it says why on its own stderr
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("sparkseal: load: the container engine stopped reading the archive", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"sparkseal: load: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
