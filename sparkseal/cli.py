"""The ``sparkseal`` command: argument parsing only; the work is done by the sparkseal packages.

Exit status: 0 all good, 1 a finding (or a failed fetch), 2 a usage error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
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
    from sparkseal.fetch.lock_debian import lock_debian, roots_of

    default = DEFAULT_DEBIAN_LOCK if args.kind == "image" else DEFAULT_TOOLCHAIN_LOCK
    out = args.out or Path(default.format(arch=args.arch, kind=args.kind))
    if not out.parent.is_dir():
        parser.error(f"--out {out}: directory {out.parent} does not exist")
    if args.sources is not None and not args.sources.is_file():
        parser.error(f"--sources {args.sources}: no such file")
    if args.keep_versions and not out.is_file():
        parser.error(f"--keep-versions: {out}: no such file")
    return lock_debian(
        args.arch,
        out,
        roots=sorted(roots_of(args.kind, args.arch)),
        sources=args.sources,
        keep_versions=args.keep_versions,
    )


def _add_lock_debian(kinds: argparse._SubParsersAction) -> None:
    from sparkseal.fetch.lock_debian import ARCHITECTURES, KINDS, SOURCES_ENV

    debian = kinds.add_parser(
        "debian",
        help="lock the Debian packages of the image's base OS for one architecture",
        description="Lock the dependency closure (Depends and Pre-Depends, as apt resolves them for an "
        "install without recommends) of the base OS packages for one architecture: each package's "
        "version, filename, size and sha256 as apt's index lists them, its path in the archive and the "
        "archive's name (a fetch joins them to the base URL the build machine configures; no host is "
        "written). apt runs with a private state directory; the machine's dpkg state is not changed.",
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
        "apt lists for each file now; fails if a sha256 or size differs",
    )
    debian.set_defaults(handler=_lock_debian, parser=debian)


def _add_lock(commands: argparse._SubParsersAction) -> None:
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


def _scan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.core.catalogue import Catalogue, CatalogueError
    from sparkseal.core.scan import ScanInputError, render, run_scan

    try:
        catalogue = Catalogue.find(args.scanner)
        report = run_scan(args.paths, args.image, args.allow, catalogue=catalogue)
    except CatalogueError as error:
        parser.error(str(error))
    except ScanInputError as error:
        parser.error(str(error))
    print(render(report, args.json))
    return 0 if report.clean else 1


def _add_scan(commands: argparse._SubParsersAction) -> None:
    from sparkseal.core.archives import (
        KINDS,
        MAX_ARCHIVE_DEPTH,
        MAX_HEADER_BYTES,
        MAX_MEMBERS,
        MAX_SCAN_MEMBERS,
    )
    from sparkseal.core.scan import DEFAULT_ALLOW, RULES

    scan = commands.add_parser(
        "scan",
        help="scan the repository or an OCI image for secrets and private data",
        description="Scan files for private keys, API tokens and other vendor secrets (the maintained rule "
        "catalogue of the Kingfisher scanner, from the hash-locked kingfisher-bin package), and for "
        "passwords, private IPv4 addresses, home directories and key files (our own rules). Without PATHS "
        "and --image: the files of the git checkout in the current directory (tracked and "
        "untracked-not-ignored; bazel-* and .git skipped). --image reads every layer of an OCI layout "
        f"directory, OCI archive or docker archive. Archives among the files ({', '.join(KINDS)}) are "
        f"opened, {MAX_ARCHIVE_DEPTH} levels deep: a finding inside one is named ARCHIVE!member, and a "
        "corrupt archive or a bomb is an error (exit 2). Every member's bytes are scanned, a zip's "
        "'symbolic links' too, and each archive's own bytes as well (a zip comment, appended data); a "
        "tar must be read whole: data past its end (after its end blocks or a zero block, in a second gzip "
        f"member) is refused, as is a tar header over {MAX_HEADER_BYTES} bytes, an archive of more than "
        f"{MAX_MEMBERS} entries or a scan of more than {MAX_SCAN_MEMBERS} archive entries (exit 2). "
        f"Our rules: {', '.join(RULES)}. Findings are exit 1; each prints as file:line:rule with the match "
        "redacted.",
    )
    scan.add_argument("paths", nargs="*", type=Path, metavar="PATHS", help="files or directories to scan")
    scan.add_argument("--image", type=Path, help="OCI layout directory, OCI archive or docker archive")
    scan.add_argument(
        "--allow",
        type=Path,
        default=None,
        help=f"allow-list JSON (default: {DEFAULT_ALLOW} of the current directory, when present)",
    )
    scan.add_argument(
        "--scanner",
        type=Path,
        default=None,
        help="the kingfisher binary (default: $SPARKSEAL_SCANNER, else the installed kingfisher-bin package)",
    )
    scan.add_argument("--json", action="store_true", help="print a JSON report")
    scan.set_defaults(handler=_scan, parser=scan)


def _nccl_diff(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.audit.nccl_diff import NcclLogError, diff_logs, render

    if len(args.logs) < 2:
        parser.error(f"expected the logs of two or more ranks, got {len(args.logs)}")
    try:
        result = diff_logs(args.logs, context=args.context)
    except NcclLogError as error:
        parser.error(str(error))
    print(render(result, args.json))
    return 0 if result.divergence is None else 1


def _add_nccl_diff(commands: argparse._SubParsersAction) -> None:
    nccl = commands.add_parser(
        "nccl-diff",
        help="compare the collective sequences of NCCL debug logs across ranks",
        description="Parse NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL logs (one per rank, in rank order), "
        "normalise each collective (operation, opCount, count, datatype, reduction op, root, nranks, "
        "communicator by order of appearance; pointers, host names, pids and timestamps dropped) and "
        "compare the sequences. Exit 1 at the first divergence, shown with context per rank.",
    )
    nccl.add_argument("logs", nargs="+", type=Path, metavar="RANK.log", help="one log per rank, rank 0 first")
    nccl.add_argument("--context", type=int, default=3, help="records shown before and after (default: 3)")
    nccl.add_argument("--json", action="store_true", help="print a JSON report")
    nccl.set_defaults(handler=_nccl_diff, parser=nccl)


def _provenance_check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.audit.provenance_check import CheckInputError, check, render
    from sparkseal.core.dsse import SignatureError

    if args.root is not None and not args.root.is_dir():
        parser.error(f"--root {args.root}: expected a directory, found none")
    try:
        report = check(args.provenance, args.artifacts, args.root, args.pubkey)
    except CheckInputError as error:
        parser.error(str(error))
    except SignatureError as error:
        print(f"sparkseal provenance check: {error}", file=sys.stderr)
        return 1
    print(render(report, args.json))
    return 0 if report.ok else 1


def _provenance_sign(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.audit.provenance_check import CheckInputError
    from sparkseal.audit.provenance_sign import sign
    from sparkseal.core.dsse import SigningInputError

    try:
        written = sign(args.provenance, args.key, args.out)
    except (CheckInputError, SigningInputError) as error:
        parser.error(str(error))
    print(f"signed {args.provenance} -> {written}")
    return 0


def _add_provenance(commands: argparse._SubParsersAction) -> None:
    provenance = commands.add_parser("provenance", help="sign or check a build's SLSA provenance")
    actions = provenance.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="re-derive the subjects of a provenance statement from the artifacts on disk",
        description="Read PROVENANCE (bazel-bin/provenance_<platform>.intoto.json, from "
        "`bazel build //:provenance`) and re-derive each subject's digest: the image manifest of the OCI "
        "layout (and every blob it names), the PEX tree digest, the sha256 of the module manifest and of "
        "the SBOM. Each artifact is found at the subject's name below --root, unless an ARTIFACT of that "
        "kind is given (an OCI layout directory, a PEX directory, a module manifest or an SPDX file, told "
        "apart by content). A digest that differs is a finding (exit 1); a missing or unreadable "
        "artifact is a usage error (exit 2).",
    )
    check.add_argument("provenance", type=Path, metavar="PROVENANCE", help="the in-toto statement (JSON)")
    check.add_argument(
        "artifacts", nargs="*", type=Path, metavar="ARTIFACT", help="artifacts to use instead of --root's"
    )
    check.add_argument(
        "--root",
        type=Path,
        default=None,
        help="where subjects are looked up by name (default: PROVENANCE's directory, i.e. bazel-bin)",
    )
    check.add_argument(
        "--pubkey",
        type=Path,
        default=None,
        help="ed25519 public key (PEM): PROVENANCE is a signed envelope whose signature is verified first; "
        "a changed payload or another key's signature is exit 1",
    )
    check.add_argument("--json", action="store_true", help="print a JSON report")
    check.set_defaults(handler=_provenance_check, parser=check)

    sign = actions.add_parser(
        "sign",
        help="sign a provenance statement: a DSSE envelope with an ed25519 key",
        description="Wrap PROVENANCE (an in-toto statement from `bazel build //:provenance`) in a DSSE "
        "envelope (payload type application/vnd.in-toto+json) signed with KEY, an ed25519 private key in "
        "PEM (openssl genpkey -algorithm ed25519); an encrypted key's passphrase comes from "
        "$SPARKSEAL_KEY_PASSPHRASE. Writes OUT (default: PROVENANCE with .dsse.json for .json). Verify "
        "with `sparkseal provenance check ENVELOPE --pubkey PUBKEY`.",
    )
    sign.add_argument("provenance", type=Path, metavar="PROVENANCE", help="the in-toto statement (JSON)")
    sign.add_argument("--key", type=Path, required=True, help="ed25519 private key (PEM)")
    sign.add_argument("--out", type=Path, default=None, help="where to write the envelope")
    sign.set_defaults(handler=_provenance_sign, parser=sign)


def _verify(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.audit.rebuild import DEFAULT_TARGETS, RebuildError
    from sparkseal.audit.verify_build import render, verify

    targets = args.targets or list(DEFAULT_TARGETS)
    if args.against and len(targets) != 1:
        parser.error(
            f"--against compares one target's digest, got {len(targets)} targets: {' '.join(targets)}"
        )
    if args.against and not re.fullmatch(r"sha256:[0-9a-f]{64}", args.against):
        parser.error(f"--against {args.against}: expected sha256:<64 hex digits>")
    workspace = args.workspace.resolve()
    if not (workspace / "WORKSPACE").is_file():
        parser.error(f"--workspace {workspace}: expected a Bazel workspace (no WORKSPACE file there)")
    report_dir = args.report_dir or workspace / "bazel-verify"
    try:
        result = verify(workspace, targets, args.against, report_dir.resolve(), args.keep, args.scratch)
    except RebuildError as error:
        print(f"sparkseal verify: {error}", file=sys.stderr)
        return 2
    print(render(result, args.json))
    return 0 if result.ok else 1


def _add_verify(commands: argparse._SubParsersAction) -> None:
    from sparkseal.audit.rebuild import DEFAULT_TARGETS, SECOND_LOCALE, SECOND_TZ

    verify = commands.add_parser(
        "verify",
        help="rebuild targets in a varied environment and compare with the first build",
        description="Build TARGETS in the checkout (the first build), then again in a fresh copy of the "
        "checkout at another path with a clean output base, files created in reverse order, HOME empty, "
        f"TZ={SECOND_TZ}, LANG/LC_ALL={SECOND_LOCALE} and the umask's group-write bit flipped; disk and "
        "remote caches off, downloads shared through the sha256-verified repository cache. Every output "
        "is compared; an OCI image down to the layer and the file. Differences are findings (exit 1), "
        "each with a diffoscope report; a failed build is exit 2.",
    )
    verify.add_argument(
        "targets", nargs="*", metavar="TARGET", help=f"Bazel targets (default: {' '.join(DEFAULT_TARGETS)})"
    )
    verify.add_argument(
        "--against",
        metavar="DIGEST",
        help="skip the first build: compare the rebuilt target's digest (image or PEX .digest output, else "
        "its one file's sha256) with this published sha256:... digest",
    )
    verify.add_argument("--workspace", type=Path, default=Path.cwd(), help="the checkout (default: .)")
    verify.add_argument(
        "--report-dir", type=Path, help="where diffoscope reports go (default: WORKSPACE/bazel-verify)"
    )
    verify.add_argument("--scratch", type=Path, help="parent of the rebuild's temporary directory")
    verify.add_argument("--keep", action="store_true", help="keep the rebuild's checkout and output base")
    verify.add_argument("--json", action="store_true", help="print a JSON report")
    verify.set_defaults(handler=_verify, parser=verify)


def _options(module: str) -> Callable[[argparse._SubParsersAction], None]:
    """The ``add_commands`` of a package's options module (its commands' options live beside the code
    they configure), imported only when the parser is built with that package installed."""

    def add(commands: argparse._SubParsersAction) -> None:
        importlib.import_module(module).add_commands(commands)

    return add


# Each command and the package that implements it. The image's sparkseal wheel ships sparkseal.core and
# the packages that run in the image only (sparkseal/BUILD), so there the commands of the others are not
# offered.
_COMMANDS = (
    ("sparkseal.fetch", _add_lock),
    ("sparkseal.audit", _add_verify),
    ("sparkseal.integrity", _options("sparkseal.integrity.options")),
    ("sparkseal.core", _add_scan),
    ("sparkseal.audit", _add_nccl_diff),
    ("sparkseal.live_check", _options("sparkseal.live_check.options")),
    ("sparkseal.audit", _add_provenance),
)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the ``sparkseal`` command with all its subcommands."""
    parser = argparse.ArgumentParser(
        prog="sparkseal", description="Hermetic, bit-reproducible build of a DSpark-enabled vLLM."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for package, add in _COMMANDS:
        if importlib.util.find_spec(package) is not None:
            add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``sparkseal`` command; return its exit status."""
    args = build_parser().parse_args(argv)
    return args.handler(args, args.parser)


if __name__ == "__main__":
    sys.exit(main())
