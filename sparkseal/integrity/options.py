"""The command-line options of verify-modules and serve, beside the module verification they run."""

from __future__ import annotations

import argparse
from pathlib import Path


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


def add_verify_modules(commands: argparse._SubParsersAction) -> None:
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


def add_serve(commands: argparse._SubParsersAction) -> None:
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


def add_commands(commands: argparse._SubParsersAction) -> None:
    """verify-modules and serve, the commands of module verification."""
    add_verify_modules(commands)
    add_serve(commands)
