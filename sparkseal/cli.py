"""The ``sparkseal`` command: argument parsing only; the work is done by the sparkseal packages.

Exit status: 0 all good, 1 a finding (or a failed fetch), 2 a usage error.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
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


def _modules_arg(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(","))
    if not all(name.isidentifier() for name in names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated top-level module names such as vllm,torch, got {value!r}"
        )
    return names


def _verify_modules(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.core.manifest import ManifestError, load_manifest
    from sparkseal.integrity.verify import render, verify_module

    try:
        manifest = load_manifest(args.manifest)
    except ManifestError as error:
        parser.error(str(error))
    results = [verify_module(manifest, args.manifest, module) for module in args.modules]
    print(render(results, args.manifest, args.json))
    return 0 if all(result.ok for result in results) else 1


def _add_verify_modules(commands: argparse._SubParsersAction) -> None:
    from sparkseal.core.manifest import IMAGE_MANIFEST_PATH
    from sparkseal.integrity.verify import DEFAULT_MODULES

    verify = commands.add_parser(
        "verify-modules",
        help="compare the installed files of modules with the image's module manifest",
        description="Find the distribution of each module without importing it, hash every file its "
        "RECORD names and every other file under its directories, and compare with the manifest: "
        "missing, extra and changed files are findings (exit 1).",
    )
    verify.add_argument(
        "--manifest",
        type=Path,
        default=IMAGE_MANIFEST_PATH,
        help=f"module manifest (default: {IMAGE_MANIFEST_PATH}, where the image carries it)",
    )
    verify.add_argument(
        "--modules",
        type=_modules_arg,
        default=DEFAULT_MODULES,
        help=f"comma-separated top-level modules (default: {','.join(DEFAULT_MODULES)})",
    )
    verify.add_argument("--json", action="store_true", help="print a JSON report")
    verify.set_defaults(handler=_verify_modules, parser=verify)


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.core.manifest import ManifestError
    from sparkseal.integrity.serve import serve

    vllm_args = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
    try:
        return serve(vllm_args, args.manifest, args.modules)
    except ManifestError as error:
        parser.error(str(error))


def _add_serve(commands: argparse._SubParsersAction) -> None:
    from sparkseal.core.manifest import IMAGE_MANIFEST_PATH
    from sparkseal.integrity.verify import DEFAULT_MODULES

    serve = commands.add_parser(
        "serve",
        help="verify the modules against the image's manifest, then exec `vllm serve ARGS`",
        description="The image's entrypoint: run the verify-modules check and, only when every module "
        "matches the manifest, replace this process with `vllm serve` and the remaining arguments.",
    )
    serve.add_argument("--manifest", type=Path, default=IMAGE_MANIFEST_PATH, help="module manifest")
    serve.add_argument(
        "--modules", type=_modules_arg, default=DEFAULT_MODULES, help="comma-separated top-level modules"
    )
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER, help="arguments for `vllm serve`")
    serve.set_defaults(handler=_serve, parser=serve)


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


# live-check options that a --profile may set: their parsers default to None, so that what a user gives
# wins over the profile, and the profile over the plain default (sparkseal.live_check.config.options_for).
_PROFILED = (
    "soak",
    "max_tokens",
    "concurrency",
    "long_prompt_tokens",
    "speculation",
    "require_cache_hit",
    "context_tokens",
    "min_max_model_len",
)


def _live_check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.live_check.client import Unreachable
    from sparkseal.live_check.config import UsageError, options_for
    from sparkseal.live_check.report import render
    from sparkseal.live_check.run import run

    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        parser.error(f"--api-key-env {args.api_key_env}: the variable is not set")
    given = {name: getattr(args, name) for name in _PROFILED if getattr(args, name) is not None}
    try:
        options = options_for(
            args.profile,
            args.url,
            **given,
            model=args.model,
            timeout=args.timeout,
            first_timeout=args.first_timeout,
            prompt_tokens=args.prompt_tokens,
            vocab_low=args.vocab[0],
            vocab_high=args.vocab[1],
            seed=args.seed,
            tie_margin=args.tie_margin,
            top_logprobs=args.top_logprobs,
            record=args.record,
            against=args.against,
            log=args.log,
            api_key=api_key,
            nccl_logs=args.nccl_logs,
            require_module_check=args.require_module_check,
            prompts=args.prompts,
            min_acceptance=args.min_acceptance,
            min_accepted_length=args.min_accepted_length,
            min_request_accepted_length=args.min_request_accepted_length,
            context_timeout=args.context_timeout,
            teardown_pid=args.teardown_pid,
            teardown_timeout=args.teardown_timeout,
            idle_memory_mib=args.idle_memory_mib,
            idle_utilization=args.idle_utilization,
            idle_timeout=args.idle_timeout,
            progress_interval=args.progress_interval,
            wait=args.wait,
        )
        # Progress goes to stderr, --json or not: the report alone is on stdout.
        report = run(options, lambda line: print(f"live-check: {line}", file=sys.stderr, flush=True))
    except UsageError as error:
        parser.error(str(error))
    except Unreachable as error:
        print(f"sparkseal live-check: server unreachable: {error}", file=sys.stderr)
        return 2
    print(render(report, args.json))
    return 0 if report.ok else 1


def _vocab_arg(value: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+):(\d+)", value)
    if not match or int(match.group(1)) >= int(match.group(2)):
        raise argparse.ArgumentTypeError(f"expected LOW:HIGH with LOW < HIGH (token ids), got {value!r}")
    return int(match.group(1)), int(match.group(2))


def _positive(kind: type) -> object:
    def parse(value: str) -> object:
        number = kind(value)
        if number <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
        return number

    return parse


def _add_live_check(commands: argparse._SubParsersAction) -> None:
    from sparkseal.live_check.config import PROFILES, TOP_LOGPROBS, default

    def defaults(name: str) -> str:
        """'default: X' and, where a profile sets the option, 'reference: Y' (from live_check, not here)."""
        shown = [f"default: {default(name)}"]
        shown += [f"--profile {p}: {default(name, p)}" for p in sorted(PROFILES) if name in PROFILES[p]]
        return "; ".join(shown)

    live = commands.add_parser(
        "live-check",
        help="validate a running vLLM server (first request, soak, prefix cache, DSpark, lossless, log)",
        description="Validate a running vLLM OpenAI-compatible server before taking DSpark into service: "
        "a first request with a deadline, a soak of greedy requests, a long prompt cold and then from the "
        "prefix cache (both must answer alike up to a near-tie flip), drafted and accepted tokens from "
        "/metrics, the soak's completions against a reference recorded without speculation, and the server "
        "log scanned for tracebacks, dead engines, RPC timeouts, NCCL errors, illegal memory accesses and "
        "out-of-memory. Prompts are token ids, so servers started with --skip-tokenizer-init work. "
        "--profile reference runs the reference validation of DSpark on GB10s with its counts as defaults: a "
        "660,000-token cold prompt on a server of at least 1,048,576 tokens of context among them. Progress "
        "goes to stderr. Exit 0 pass, 1 a finding, 2 a usage error or an unreachable server.",
    )
    live.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    live.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    live.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the server to answer /v1/models before the checks (a server started a "
        "moment ago refuses connections while it loads its model); past it, the server is unreachable "
        "(exit 2) (default: 0, no wait)",
    )
    live.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        help="a validation sequence's counts as defaults, each still overridable: reference: 120 serial "
        "requests of 64 tokens, a 28,820-token prompt cold then cached (it must hit the prefix cache), a "
        "660,000-token cold prompt, speculation required",
    )
    live.add_argument("--soak", type=_positive(int), help=f"soak requests ({defaults('soak')})")
    live.add_argument(
        "--max-tokens", type=_positive(int), help=f"tokens per completion ({defaults('max_tokens')})"
    )
    live.add_argument(
        "--concurrency",
        type=_positive(int),
        help=f"concurrent clients in the soak ({defaults('concurrency')})",
    )
    live.add_argument(
        "--prompt-tokens", type=_positive(int), default=64, help="soak prompt length (default: 64)"
    )
    live.add_argument(
        "--long-prompt-tokens",
        type=_positive(int),
        help=f"the prompt served cold then from the prefix cache ({defaults('long_prompt_tokens')})",
    )
    live.add_argument(
        "--require-cache-hit",
        action=argparse.BooleanOptionalAction,
        help="the cached long prompt must hit the prefix cache, by usage.prompt_tokens_details or /metrics "
        f"({defaults('require_cache_hit')})",
    )
    context = live.add_argument_group(
        "long context",
        "one cold prompt at the server's long context: HTTP 200, tokens generated, and the drafted and "
        "accepted tokens of that request alone, from /metrics around it (run no other client meanwhile)",
    )
    context.add_argument(
        "--context-tokens",
        type=_positive(int),
        metavar="N",
        help=f"the cold prompt's length ({defaults('context_tokens')}: off)",
    )
    context.add_argument(
        "--min-max-model-len",
        type=_positive(int),
        metavar="N",
        help="the max_model_len /v1/models must list, else a finding naming both (default: the prompt "
        f"plus --max-tokens; --profile reference: {default('min_max_model_len', 'reference')})",
    )
    context.add_argument(
        "--context-timeout",
        type=_positive(float),
        default=default("context_timeout"),
        metavar="S",
        help=f"seconds for that request (default: {default('context_timeout'):g})",
    )
    teardown = live.add_argument_group(
        "teardown",
        "live-check stops the server only when given its pid (SIGTERM, never a kill), after every request, "
        "then polls nvidia-smi until every GPU is idle; without nvidia-smi that step is skipped and says so",
    )
    teardown.add_argument(
        "--teardown-pid",
        type=_positive(int),
        metavar="PID",
        help="the server's process (e.g. $! of the shell that started vllm serve or podman run)",
    )
    teardown.add_argument(
        "--teardown-timeout",
        type=_positive(float),
        default=default("teardown_timeout"),
        metavar="S",
        help=f"seconds for it to exit after SIGTERM (default: {default('teardown_timeout'):g})",
    )
    teardown.add_argument(
        "--idle-memory-mib",
        type=float,
        default=default("idle_memory_mib"),
        metavar="MIB",
        help=f"idle: memory.used at most this (default: {default('idle_memory_mib'):g})",
    )
    teardown.add_argument(
        "--idle-utilization",
        type=float,
        default=default("idle_utilization"),
        metavar="PCT",
        help=f"idle: utilization.gpu at most this (default: {default('idle_utilization'):g})",
    )
    teardown.add_argument(
        "--idle-timeout",
        type=_positive(float),
        default=default("idle_timeout"),
        metavar="S",
        help=f"seconds to wait for idle GPUs (default: {default('idle_timeout'):g})",
    )
    live.add_argument(
        "--vocab",
        type=_vocab_arg,
        default=(100, 1000),
        metavar="LOW:HIGH",
        help="token ids of prompts (default: 100:1000)",
    )
    live.add_argument("--seed", type=int, default=0, help="seed of the soak prompts (default: 0)")
    live.add_argument(
        "--timeout", type=_positive(float), default=60.0, help="seconds per request (default: 60)"
    )
    live.add_argument(
        "--first-timeout",
        type=_positive(float),
        default=300.0,
        help="seconds for the first request and the long prompt (default: 300)",
    )
    live.add_argument(
        "--speculation",
        choices=("auto", "required", "off"),
        help="auto: if the server exports speculative-decoding metrics, something must be drafted; "
        f"required: it must export them too; off: no check ({defaults('speculation')})",
    )
    live.add_argument(
        "--tie-margin",
        type=float,
        default=0.1,
        help="a first difference from the reference, or of the cached long prompt from the cold one, where "
        "the token the server chose was this close in log-probability to the best token recorded there "
        "(whatever its rank among the --top-logprobs recorded) is a near-tie flip, not a finding; a token "
        "beyond it or not recorded at all is (default: 0.1; 0: exact match)",
    )
    live.add_argument(
        "--top-logprobs",
        type=_positive(int),
        default=TOP_LOGPROBS,
        metavar="K",
        help="log-probabilities recorded per position by --record and asked for the long prompt, cold and "
        f"cached; at most the server's --max-logprobs (default: {TOP_LOGPROBS})",
    )
    reference = live.add_mutually_exclusive_group()
    reference.add_argument(
        "--record", type=Path, help="write the soak's prompts and completions as the reference"
    )
    reference.add_argument(
        "--against", type=Path, help="compare the soak's completions with a recorded reference"
    )
    live.add_argument(
        "--prompts",
        type=Path,
        metavar="FILE",
        help='soak prompts as token ids (JSON: {"format": "sparkseal-prompts/1", "prompts": [[id, ...], '
        "...]}, as bench/live/train_dspark.py writes held-out text), the first --soak of them, instead of "
        "random ids; --record keeps them in the reference",
    )
    floors = live.add_argument_group(
        "acceptance floors",
        "a speculating server whose drafts are mostly rejected decodes slower than one without speculation; "
        "each floor below makes that a finding (and implies --speculation required)",
    )
    floors.add_argument(
        "--min-acceptance",
        type=float,
        metavar="RATE",
        help="accepted over drafted tokens during the check, 0 to 1",
    )
    floors.add_argument(
        "--min-accepted-length",
        type=float,
        metavar="TOKENS",
        help="accepted draft tokens per draft step during the check, the bonus token not counted (of "
        "num_speculative_tokens; vLLM's 'mean acceptance length' is this plus one)",
    )
    floors.add_argument(
        "--min-request-accepted-length",
        type=float,
        metavar="TOKENS",
        help="the same for every soak request alone, read from /metrics before and after each request (needs "
        "--concurrency 1): an average can hide a few requests whose drafts go wrong",
    )
    live.add_argument("--log", type=Path, help="the server's log, scanned for failures")
    live.add_argument(
        "--nccl-logs",
        type=Path,
        metavar="DIR",
        help="the per-rank NCCL_DEBUG_FILE logs (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,COLL): every rank's "
        "collective sequence must be the same; implies --require-module-check",
    )
    live.add_argument(
        "--require-module-check",
        action="store_true",
        help="the server log must show the sparkseal plugin's cross-rank module check for every rank",
    )
    live.add_argument(
        "--api-key-env", metavar="VAR", help="environment variable holding the server's API key"
    )
    live.add_argument(
        "--progress-interval",
        type=_positive(float),
        default=default("progress_interval"),
        metavar="S",
        help="seconds between progress lines on stderr while one request runs "
        f"(default: {default('progress_interval'):g})",
    )
    live.add_argument("--json", action="store_true", help="print a JSON report")
    live.set_defaults(handler=_live_check, parser=live)


# Each command and the package that implements it. The image's sparkseal wheel ships sparkseal.core and
# the packages that run in the image only (sparkseal/BUILD), so there the commands of the others are not
# offered.
_COMMANDS = (
    ("sparkseal.fetch", _add_lock),
    ("sparkseal.audit", _add_verify),
    ("sparkseal.integrity", _add_verify_modules),
    ("sparkseal.integrity", _add_serve),
    ("sparkseal.core", _add_scan),
    ("sparkseal.audit", _add_nccl_diff),
    ("sparkseal.live_check", _add_live_check),
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
