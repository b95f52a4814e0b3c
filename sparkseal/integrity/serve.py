"""The image's entrypoint: check every module against the embedded manifest, then become ``vllm serve``."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from sparkseal.core.manifest import load_manifest
from sparkseal.integrity.verify import render, verify_module


def serve(vllm_args: Sequence[str], manifest_path: Path, modules: Sequence[str]) -> int:
    """Verify ``modules`` against ``manifest_path``; on success replace this process with ``vllm serve``.

    Returns 1 (after printing the findings) when a module differs from the manifest; never returns on
    success. Raises ``ManifestError`` for an unreadable manifest.
    """
    manifest = load_manifest(manifest_path)
    results = [verify_module(manifest, manifest_path, module) for module in modules]
    if not all(result.ok for result in results):
        print(render(results, manifest_path, as_json=False), file=sys.stderr)
        print("sparkseal: refusing to serve: the installed modules differ from the image", file=sys.stderr)
        return 1
    vllm = shutil.which("vllm")
    if vllm is None:
        print("sparkseal: no `vllm` executable on PATH", file=sys.stderr)
        return 1
    print(f"sparkseal: {', '.join(modules)} match {manifest_path}; starting vllm serve", file=sys.stderr)
    sys.stderr.flush()
    os.execv(vllm, ["vllm", "serve", *vllm_args])
    return 1  # not reached: execv replaces the process
