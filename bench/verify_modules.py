"""Time of the module check over a whole virtual environment (``verify-modules``), serial and parallel.

The check's default covers every distribution of site-packages, so its cost grows with the venv, not with
vllm, torch and sparkseal alone. This program runs the command as the image's entrypoint does (a fresh
interpreter, the default scope) with ``--jobs 1`` (one file after another) and with the default (a thread
per CPU this process may use), alternating, after one warm-up run that fills the page cache; it reports
the median wall seconds and the CPU seconds of each run, and the size of what was checked.

Without ``--manifest``, it first writes the venv's manifest with the ``module_manifest`` action's own code
(``--tree / --prefix VENV``), as the image build writes ``/opt/sparkseal/manifest.json`` of ``/opt/venv``.
Inside the image, give the image's own manifest:

    ~/.cache/sparkseal/venv/bin/python bench/verify_modules.py --venv ~/.cache/sparkseal/venv --runs 3
    /opt/venv/bin/python3 bench/verify_modules.py --venv /opt/venv --manifest /opt/sparkseal/manifest.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparkseal.actions import module_manifest
from sparkseal.core.digests import usable_cpus
from sparkseal.core.manifest import UNOWNED, find_site_packages, load_manifest

REPO = Path(__file__).resolve().parent.parent


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def check(manifest: Path, site: Path, jobs: int | None) -> tuple[float, float]:
    """One ``verify-modules`` run: (wall seconds, CPU seconds); exits on any finding."""
    command = [sys.executable, "-m", "sparkseal", "verify-modules", "--manifest", str(manifest)]
    command += ["--site-packages", str(site), *(["--jobs", str(jobs)] if jobs else [])]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    cpu, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(
            f"verify_modules: {' '.join(command)}: exit {done.returncode}\n{done.stdout[-3000:]}"
        )
    return wall, _children_cpu() - cpu


def sizes(manifest_path: Path, site: Path) -> tuple[int, int, int]:
    """(distributions, files, bytes) of what the manifest lists, measured on disk."""
    manifest = load_manifest(manifest_path)
    keys = [
        k for entry in manifest["distributions"].values() for k in (*entry["files"], *entry["install_files"])
    ]
    named = len(set(manifest["distributions"]) - {UNOWNED})
    return named, len(keys), sum((site / key).stat().st_size for key in keys)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, required=True, help="the virtual environment to check")
    parser.add_argument("--manifest", type=Path, help="its manifest (default: written here first)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each variant")
    args = parser.parse_args()
    venv = args.venv.resolve()
    site = find_site_packages(venv)
    with tempfile.TemporaryDirectory(prefix="verify-modules-bench-") as scratch:
        manifest = args.manifest
        if manifest is None:
            manifest = Path(scratch) / "manifest.json"
            start = time.perf_counter()
            if module_manifest.main(["--tree", "/", "--prefix", str(venv), "--out", str(manifest)]) != 0:
                raise SystemExit("verify_modules: the manifest could not be written")
            print(f"manifest written in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        distributions, files, size = sizes(manifest, site)
        load = [os.getloadavg()[0]]
        check(manifest, site, None)  # warm-up: the page cache holds the files for every timed run
        variants: dict[str, list[tuple[float, float]]] = {"--jobs 1": [], f"default ({usable_cpus()})": []}
        for _ in range(args.runs):
            for name, jobs in zip(variants, (1, None), strict=True):
                variants[name].append(check(manifest, site, jobs))
                print(name, variants[name][-1], file=sys.stderr, flush=True)
        load.append(os.getloadavg()[0])
    lines = [
        f"Checked: {venv} ({site.relative_to(venv)}): {distributions} distributions, {files:,} files, "
        f"{size:,} bytes. Machine: {platform.machine()}, {usable_cpus()} CPUs; "
        f"{datetime.date.today().isoformat()}; load average {load[0]:.1f} before, {load[1]:.1f} after.",
        "",
        "| threads | median wall s | runs wall s | runs CPU s |",
        "|---|---:|---|---|",
    ]
    for name, runs in variants.items():
        walls = ", ".join(f"{wall:.2f}" for wall, _ in runs)
        cpus = ", ".join(f"{cpu:.2f}" for _, cpu in runs)
        lines.append(f"| {name} | {statistics.median(w for w, _ in runs):.2f} | {walls} | {cpus} |")
    print("\n".join(lines))
    print(json.dumps({"distributions": distributions, "files": files, "bytes": size}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
