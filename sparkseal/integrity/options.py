"""The command-line options of verify-modules and serve, beside the module verification they run."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkseal.integrity.verify import ModuleResult

# What the check covers when no --modules is given; one sentence for both commands' help.
COVERS = (
    "every distribution of the site-packages directory (each file its RECORD names), every *.dist-info "
    "the manifest does not list, and every file there that no RECORD names"
)


def _modules_arg(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(","))
    if not all(name.isidentifier() for name in names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated top-level module names such as vllm,torch, got {value!r}"
        )
    return names


def _jobs_arg(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of threads of at least 1, got {value!r}")
    return int(value)


def _add_scope(command: argparse.ArgumentParser) -> None:
    """--modules, --site-packages and --jobs: what is checked, where, and by how many threads."""
    command.add_argument(
        "--modules",
        type=_modules_arg,
        default=None,
        help="comma-separated top-level modules to check instead (each found by the import system, "
        f"without importing it); default: {COVERS}",
    )
    command.add_argument(
        "--site-packages",
        type=Path,
        default=None,
        help="site-packages directory to check (default: the running interpreter's, in the image "
        "/opt/venv/lib/python3.11/site-packages, where `vllm serve` imports from)",
    )
    command.add_argument(
        "--jobs",
        type=_jobs_arg,
        default=None,
        help="threads that hash files (default: every CPU this process may use; 1: one after another)",
    )


def _results(args: argparse.Namespace, manifest: Mapping[str, Any]) -> list[ModuleResult]:
    """Every distribution of the site-packages directory, or the modules ``--modules`` names."""
    from sparkseal.integrity.verify import verify_module, verify_site

    if args.modules is None:
        return verify_site(manifest, args.manifest, args.site_packages, args.jobs)
    search_path = None if args.site_packages is None else [str(args.site_packages)]
    return [verify_module(manifest, args.manifest, m, search_path, args.jobs) for m in args.modules]


def _verify_modules(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.core.manifest import ManifestError, load_manifest
    from sparkseal.integrity.verify import render

    try:
        manifest = load_manifest(args.manifest)
    except ManifestError as error:
        parser.error(str(error))
    results = _results(args, manifest)
    print(render(results, args.manifest, args.json))
    return 0 if all(result.ok for result in results) else 1


def add_verify_modules(commands: argparse._SubParsersAction) -> None:
    from sparkseal.core.manifest import IMAGE_MANIFEST_PATH

    verify = commands.add_parser(
        "verify-modules",
        help="compare the installed files of the site-packages directory with the image's module manifest",
        description=f"Hash {COVERS}, without importing anything, and compare with the manifest: missing, "
        "extra and changed files, and distributions installed or missing against it, are findings (exit 1).",
    )
    verify.add_argument(
        "--manifest",
        type=Path,
        default=IMAGE_MANIFEST_PATH,
        help=f"module manifest (default: {IMAGE_MANIFEST_PATH}, where the image carries it)",
    )
    _add_scope(verify)
    verify.add_argument("--json", action="store_true", help="print a JSON report")
    verify.set_defaults(handler=_verify_modules, parser=verify)


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from sparkseal.core.manifest import ManifestError
    from sparkseal.integrity.serve import serve

    vllm_args = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
    try:
        return serve(vllm_args, args.manifest, args.modules, args.site_packages, args.jobs)
    except ManifestError as error:
        parser.error(str(error))


def add_serve(commands: argparse._SubParsersAction) -> None:
    from sparkseal.core.manifest import IMAGE_MANIFEST_PATH

    serve = commands.add_parser(
        "serve",
        help="verify the installed modules against the image's manifest, then exec `vllm serve ARGS`",
        description="The image's entrypoint: run the verify-modules check and, only when it finds nothing, "
        "replace this process with `vllm serve` and the remaining arguments.",
    )
    serve.add_argument("--manifest", type=Path, default=IMAGE_MANIFEST_PATH, help="module manifest")
    _add_scope(serve)
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER, help="arguments for `vllm serve`")
    serve.set_defaults(handler=_serve, parser=serve)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """verify-modules and serve, the commands of module verification."""
    add_verify_modules(commands)
    add_serve(commands)
