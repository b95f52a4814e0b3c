"""The image's entrypoint: check the installed modules against the image's manifest, then ``vllm serve``."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from sparkseal.core.manifest import load_manifest
from sparkseal.integrity.verify import render, verify_module, verify_site


def serve(
    vllm_args: Sequence[str],
    manifest_path: Path,
    modules: Sequence[str] | None = None,
    site: Path | None = None,
    jobs: int | None = None,
) -> int:
    """Verify the installed modules against ``manifest_path``; on success become ``vllm serve``.

    ``modules=None`` checks every distribution of ``site`` (``verify_site``, the image's default); named
    modules are checked alone (``verify_module``). Returns 1 (after printing the findings) when anything
    differs from the manifest; never returns on success. Raises ``ManifestError`` for an unreadable manifest.
    """
    manifest = load_manifest(manifest_path)
    if modules is None:
        results = verify_site(manifest, manifest_path, site, jobs)
        files = sum(result.checked for result in results)
        what = (
            f"the {len(results) - 1} distributions of {results[0].site} and its files no RECORD names "
            f"({files} files)"
        )
    else:
        search_path = None if site is None else [str(site)]
        results = [verify_module(manifest, manifest_path, m, search_path, jobs) for m in modules]
        what = ", ".join(modules)
    if not all(result.ok for result in results):
        print(render(results, manifest_path, as_json=False), file=sys.stderr)
        print("sparkseal: refusing to serve: the installed modules differ from the image", file=sys.stderr)
        return 1
    vllm = shutil.which("vllm")
    if vllm is None:
        print("sparkseal: no `vllm` executable on PATH", file=sys.stderr)
        return 1
    print(f"sparkseal: {what} match {manifest_path}; starting vllm serve", file=sys.stderr)
    sys.stderr.flush()
    os.execv(vllm, ["vllm", "serve", *vllm_args])
    return 1  # not reached: execv replaces the process
