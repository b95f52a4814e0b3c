"""The command-line options of ``sparkseal lock`` (vllm, debian, python), beside the lock writers they run."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from sparkseal.core.platforms import PLATFORMS

DEFAULT_VLLM_LOCK = Path("third_party/vllm/vllm.lock.json")
DEFAULT_VLLM_SERIES = Path("patches/vllm/series")
DEFAULT_DEBIAN_LOCK = "third_party/debian/bookworm_{arch}.lock.json"
DEFAULT_TOOLCHAIN_LOCK = "third_party/toolchains/{kind}_bookworm_{arch}.lock.json"


def _default_download_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sparkseal" / "downloads"


def _version_arg(value: str) -> str:
    if not re.fullmatch(r"\d+(\.\d+)*([a-z0-9.]*)", value):
        raise argparse.ArgumentTypeError(f"expected a release version such as 0.25.1, got {value!r}")
    return value


def _lock_vllm(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.fetch.lock_vllm import lock_vllm

    if not args.lock.parent.is_dir():
        parser.error(f"--lock {args.lock}: directory {args.lock.parent} does not exist")
    series = args.series
    if series is not None and not series.is_file():
        parser.error(f"--series {series}: no such file")
    if series is None:
        if DEFAULT_VLLM_SERIES.is_file():
            series = DEFAULT_VLLM_SERIES
        else:
            print(f"note: no patch series at {DEFAULT_VLLM_SERIES}; the patch check is skipped")
    return lock_vllm(args.version, args.lock, series, args.download_dir, args.index)


def _lock_debian(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.fetch.debian_archive import ArchiveError, snapshot_base
    from sparkseal.fetch.debian_snapshot import SnapshotError, parse_base
    from sparkseal.fetch.lock_debian import lock_debian, roots_of

    default = DEFAULT_DEBIAN_LOCK if args.kind == "image" else DEFAULT_TOOLCHAIN_LOCK
    out = args.out or Path(default.format(arch=args.arch, kind=args.kind))
    if not out.parent.is_dir():
        parser.error(f"--out {out}: directory {out.parent} does not exist")
    if args.sources is not None and not args.sources.is_file():
        parser.error(f"--sources {args.sources}: no such file")
    if args.keep_versions and not out.is_file():
        parser.error(f"--keep-versions: {out}: no such file")
    try:
        snapshot = parse_base(args.snapshot, "--snapshot") if args.snapshot else snapshot_base()
    except (ArchiveError, SnapshotError) as exc:
        parser.error(str(exc))
    return lock_debian(
        args.arch,
        out,
        roots=sorted(roots_of(args.kind, args.arch)),
        sources=args.sources,
        keep_versions=args.keep_versions,
        snapshot=snapshot,
    )


def _add_lock_debian(kinds: argparse._SubParsersAction) -> None:
    from sparkseal.fetch.debian_snapshot import SNAPSHOT_ENV
    from sparkseal.fetch.lock_debian import ARCHITECTURES, KINDS, SOURCES_ENV

    debian = kinds.add_parser(
        "debian",
        help="lock the Debian packages of the image's base OS for one architecture",
        description="Lock the dependency closure (Depends and Pre-Depends, as apt resolves them for an "
        "install without recommends) of the base OS packages for one architecture: each package's "
        "version, filename, size and sha256 as apt's index lists them, its path in the archive, the "
        "archive's name and the time stamp at which Debian's snapshot archive first held the file (its "
        "API, checked by downloading the file there); a fetch joins them to the base URLs the build "
        "machine configures, no host is written. apt runs with a private state directory; the machine's "
        "dpkg state is not changed.",
    )
    debian.add_argument("--arch", required=True, choices=ARCHITECTURES, help="Debian architecture")
    debian.add_argument(
        "--kind",
        choices=KINDS,
        default="image",
        help="what to lock: the image's base OS (default), or the build host's locked interpreter "
        "(python) or C/C++ toolchain (cc) for a build host of this architecture",
    )
    debian.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"lock file to write (default: {DEFAULT_DEBIAN_LOCK.format(arch='ARCH')}, or "
        f"{DEFAULT_TOOLCHAIN_LOCK.format(kind='KIND', arch='ARCH')} for a toolchain)",
    )
    sources = os.environ.get(SOURCES_ENV, "").strip()
    debian.add_argument(
        "--sources",
        type=Path,
        default=Path(sources) if sources else None,
        help=f"apt sources file to use instead of the machine's (default: ${SOURCES_ENV})",
    )
    debian.add_argument(
        "--keep-versions",
        action="store_true",
        help="re-write the existing lock with its own roots and versions, adding the path and archive "
        "apt lists for each file now and the snapshot time stamps it lacks; fails if a sha256 or size "
        "differs",
    )
    debian.add_argument(
        "--snapshot",
        default=None,
        metavar="URL",
        help=f"base URL of Debian's snapshot archive, whose API gives each file's time stamp (default: "
        f"${SNAPSHOT_ENV}, else a snapshot URL of the machine's apt sources)",
    )
    debian.set_defaults(handler=_lock_debian, parser=debian)


def add_commands(commands: argparse._SubParsersAction) -> None:
    lock = commands.add_parser("lock", help="write a lock file from the package index")
    kinds = lock.add_subparsers(dest="kind", metavar="KIND", required=True)
    vllm = kinds.add_parser(
        "vllm",
        help="lock a vLLM release (sdist, linux_aarch64 and linux_x86_64 wheels, commit)",
        description="Lock a vLLM release: the sdist and the manylinux aarch64/x86_64 wheels with the sha256 "
        "the index lists, and the commit recorded in the sdist. Then report which patches of the series "
        "no longer apply to the release's tree (the patches are not changed).",
    )
    vllm.add_argument("--version", required=True, type=_version_arg, help="the release, e.g. 0.25.1")
    vllm.add_argument(
        "--lock",
        type=Path,
        default=DEFAULT_VLLM_LOCK,
        help=f"lock file to write (default: {DEFAULT_VLLM_LOCK})",
    )
    vllm.add_argument(
        "--series",
        type=Path,
        default=None,
        help=f"patch series to check (default: {DEFAULT_VLLM_SERIES}, skipped if absent)",
    )
    vllm.add_argument(
        "--download-dir",
        type=Path,
        default=_default_download_dir(),
        help="where the sdist is kept; a file already there is reused when its sha256 matches the index "
        "(default: $XDG_CACHE_HOME/sparkseal/downloads)",
    )
    vllm.add_argument("--index", help="index URL (default: PIP_INDEX_URL, then pip's configuration)")
    vllm.set_defaults(handler=_lock_vllm, parser=vllm)
    _add_lock_debian(kinds)
    _add_lock_python(kinds)


def _lock_python(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.fetch.lock_python import PLATFORMS, lock_python

    if not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: no such directory")
    platforms = PLATFORMS if args.platform == "all" else (args.platform,)
    return lock_python(
        platforms, args.dir, args.vllm_lock, args.download_dir, index=args.index, upgrade=args.upgrade
    )


def _add_lock_python(kinds: argparse._SubParsersAction) -> None:
    python = kinds.add_parser(
        "python",
        help="lock the Python closure of vLLM's requirements, per platform, with one wheel per pin",
        description="Resolve vLLM's requirements (from the locked sdist) and ours for CPython 3.11 on "
        "manylinux glibc <= 2.36 with uv, check that every pin has a wheel for the platform, and write "
        "requirements_<platform>.txt (--hash format) and requirements_<platform>.files.json; also the "
        "build tools' lock (tools.txt) and uv's (uv.txt).",
    )
    python.add_argument(
        "--platform",
        choices=(*PLATFORMS, "all"),
        default="all",
        help="platform to lock (default: all)",
    )
    python.add_argument(
        "--dir", type=Path, default=Path("third_party/python"), help="lock directory (default: %(default)s)"
    )
    python.add_argument(
        "--vllm-lock", type=Path, default=DEFAULT_VLLM_LOCK, help="the vLLM lock naming the sdist"
    )
    python.add_argument(
        "--download-dir",
        type=Path,
        default=_default_download_dir(),
        help="where the vLLM sdist is kept (default: $XDG_CACHE_HOME/sparkseal/downloads)",
    )
    python.add_argument(
        "--upgrade", action="store_true", help="resolve afresh instead of keeping the current lock's versions"
    )
    python.add_argument("--index", help="index URL (default: PIP_INDEX_URL, then pip's configuration)")
    python.set_defaults(handler=_lock_python, parser=python)
