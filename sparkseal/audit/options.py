"""The command-line options of verify, nccl-diff and provenance, beside the auditors they run."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


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


def add_nccl_diff(commands: argparse._SubParsersAction) -> None:
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
        report = check(args.provenance, args.artifacts, args.root, args.pubkey, args.only)
    except CheckInputError as error:
        parser.error(str(error))
    except SignatureError as error:
        print(f"sparkseal provenance check: FAILED: {error}", file=sys.stderr)
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


def add_provenance(commands: argparse._SubParsersAction) -> None:
    from sparkseal.core.slsa import SUBJECT_KINDS

    provenance = commands.add_parser("provenance", help="sign or check a build's SLSA provenance")
    actions = provenance.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="re-derive the subjects of a provenance statement from the artifacts on disk",
        description="Read PROVENANCE (bazel-bin/provenance_<platform>.intoto.json, from "
        "`bazel build //:provenance`) and re-derive each subject's digest: the image manifest of the OCI "
        "layout (and every blob it names), the PEX tree digest, the sha256 of the module manifest and of "
        "each SBOM (SPDX, CycloneDX). Each artifact is found at the subject's name below --root, unless an "
        "ARTIFACT of that kind is given (an OCI layout directory, a PEX directory, a module manifest, an "
        "SPDX or a CycloneDX file, told apart by content). A digest that differs is a finding (exit 1); a "
        "missing or unreadable artifact is a usage error (exit 2). PROVENANCE and the ARTIFACTs go last, "
        "after the options.",
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
    check.add_argument(
        "--only",
        action="append",
        default=[],
        choices=SUBJECT_KINDS,
        metavar="KIND",
        help=f"check only the subjects of KIND ({', '.join(SUBJECT_KINDS)}; repeat for more), e.g. "
        "--only oci-image for an image copied from a registry; the others are named as not checked",
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
    if args.key is not None:
        # The key is read before hours of building, not after.
        from sparkseal.audit.provenance_sign import load_private_key
        from sparkseal.core.dsse import SigningInputError

        try:
            load_private_key(args.key)
        except SigningInputError as error:
            parser.error(f"--key: {error}")
    try:
        result = verify(
            workspace,
            targets,
            args.against,
            report_dir.resolve(),
            args.keep,
            args.scratch,
            args.bazel_arg,
            args.key,
        )
    except RebuildError as error:
        print(f"sparkseal verify: no verdict: {error}", file=sys.stderr)
        return 2
    print(render(result, args.json))
    return 0 if result.ok else 1


def add_verify(commands: argparse._SubParsersAction) -> None:
    from sparkseal.audit.rebuild import DEFAULT_TARGETS, SECOND_LOCALE, SECOND_TZ

    verify = commands.add_parser(
        "verify",
        help="rebuild targets in a varied environment and compare with the first build",
        description="Build TARGETS in the checkout (the first build), then again in a fresh copy of the "
        "checkout at another path with a clean output base, files created in reverse order, HOME empty, "
        f"TZ={SECOND_TZ}, LANG/LC_ALL={SECOND_LOCALE} (else another installed UTF-8 locale, else C.UTF-8) "
        "and the umask's group-write bit flipped; disk and "
        "remote caches off, downloads shared through the sha256-verified repository cache. Every output "
        "is compared; an OCI image down to the layer and the file. The last line is the verdict: PASSED "
        "(exit 0) or FAILED (exit 1, each difference with a diffoscope report); a failed build gives no "
        "verdict (exit 2). Each target's verdict is also written as a SLSA Verification Summary "
        "Attestation (REPORT_DIR/<target>.vsa.intoto.json), DSSE-signed with --key.",
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
    verify.add_argument(
        "--bazel-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a Bazel build argument for both builds, written --bazel-arg=ARG (--bazel-arg=--config=bazel7); "
        "repeat for more",
    )
    verify.add_argument(
        "--key",
        type=Path,
        default=None,
        help="ed25519 private key (PEM): sign each verification summary (a DSSE envelope beside it)",
    )
    verify.add_argument("--workspace", type=Path, default=Path.cwd(), help="the checkout (default: .)")
    verify.add_argument(
        "--report-dir",
        type=Path,
        help="where diffoscope reports and verification summaries go (default: WORKSPACE/bazel-verify)",
    )
    verify.add_argument("--scratch", type=Path, help="parent of the rebuild's temporary directory")
    verify.add_argument("--keep", action="store_true", help="keep the rebuild's checkout and output base")
    verify.add_argument("--json", action="store_true", help="print a JSON report")
    verify.set_defaults(handler=_verify, parser=verify)
