"""Start-up cost inside the image: ``import torch`` and ``import vllm`` with the shipped bytecode and without.

Each run is a fresh container (``podman run --rm``, as the image tests run it) whose Python times the
import itself (``time.perf_counter`` around ``importlib.import_module``), so the container's own start is
not counted. It also counts the modules compiled from source during the import, split into the venv's
and the rest (Debian's standard library, whose bytecode the image's rootfs action writes as the
interpreter's postinst would).

"without" first removes every ``__pycache__`` below ``/opt/venv`` and ``/usr/lib/python3.11`` inside the
container, outside the timed part: that is what each start did before the image shipped bytecode,
because it runs with ``PYTHONDONTWRITEBYTECODE=1`` and nothing is cached from one start to the next.
``verify-modules`` (the start-up check, which now hashes the pycs too) is timed the same way, with the
bytecode.

    python3 bench/startup.py --image localhost/sparkseal/vllm:0.25.1-linux_x86_64 --runs 3 \\
        --out bench/results/startup.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.bytecode_probe import PROBE

# As tests/image/test_image_e2e.py runs the image: runc and explicit ulimits, what rootful podman needs on
# a CI machine.
PODMAN_RUN = [
    *("podman", "--runtime", "runc", "run", "--rm", "--network=none"),
    *("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"),
]
MODULES = ("torch", "vllm")
TIMED_IMPORT = (
    PROBE
    + """
import importlib, json, sys, time
start = time.perf_counter()
importlib.import_module(sys.argv[1])
seconds = time.perf_counter() - start
venv = sum(p.startswith(sys.prefix + "/") for p in compiled)
print("RESULT " + json.dumps({"s": seconds, "venv": venv, "other": len(compiled) - venv}))
"""
)
TIMED_VERIFY = """
import subprocess, sys, time, json
start = time.perf_counter()
done = subprocess.run(["/opt/venv/bin/sparkseal", "verify-modules"], capture_output=True, text=True)
print("RESULT " + json.dumps({"s": time.perf_counter() - start, "rc": done.returncode}))
"""
# The image has no find(1): its own Python removes the caches, the venv's and the standard library's.
DROP_BYTECODE = (
    "/opt/venv/bin/python3 -c 'import pathlib, shutil\n"
    'for top in ("/opt/venv", "/usr/lib/python3.11"):\n'
    '    for d in list(pathlib.Path(top).rglob("__pycache__")): shutil.rmtree(d)\' && '
)


def run(image: str, shell: str) -> dict[str, float]:
    """One fresh container running ``shell``; the JSON after its RESULT line."""
    done = subprocess.run(
        [*PODMAN_RUN, "--entrypoint", "/bin/sh", image, "-c", shell],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or len(lines) != 1:
        raise SystemExit(f"startup: {shell[:80]}...: exit {done.returncode}: {done.stderr[-2000:]}")
    return dict(json.loads(lines[0].removeprefix("RESULT ")))


def python(script: str, *args: str) -> str:
    quoted = script.replace("'", "'\"'\"'")
    return f"/opt/venv/bin/python3 -c '{quoted}' {' '.join(args)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True, help="the image, loaded into podman")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    rows = []
    for module in MODULES:
        medians = {}
        for variant, prefix in (("with bytecode", ""), ("without", DROP_BYTECODE)):
            results = [run(args.image, prefix + python(TIMED_IMPORT, module)) for _ in range(args.runs)]
            times = [r["s"] for r in results]
            medians[variant] = statistics.median(times)
            compiled = f"{int(results[0]['venv'])} venv, {int(results[0]['other'])} other"
            rows.append((f"import {module}", variant, medians[variant], times, compiled))
            print(rows[-1], file=sys.stderr, flush=True)
        rows.append(
            (f"import {module}", "without / with", medians["without"] / medians["with bytecode"], [], "")
        )
    verify = [run(args.image, python(TIMED_VERIFY)) for _ in range(args.runs)]
    if any(r["rc"] for r in verify):
        raise SystemExit("startup: verify-modules failed inside the image")
    times = [r["s"] for r in verify]
    rows.append(("sparkseal verify-modules", "with bytecode", statistics.median(times), times, ""))

    lines = [
        "# Start-up inside the image: imports with and without the shipped bytecode",
        "",
        f"Command: `python3 bench/startup.py --image {args.image} --runs {args.runs} --out {args.out}`",
        "",
        f"Machine: {platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
        f"{platform.freedesktop_os_release().get('PRETTY_NAME', platform.system())}; "
        f"{datetime.date.today().isoformat()}. One fresh container per run, the image's own Python timing "
        "the import; median of the runs.",
        "",
        "| what | variant | median s | runs (s) | modules compiled from source (first run) |",
        "|---|---|---:|---|---|",
    ]
    for what, variant, value, times, compiled in rows:
        shown = f"{value:.2f}x" if variant == "without / with" else f"{value:.2f}"
        runs = ", ".join(f"{t:.2f}" for t in times)
        lines.append(f"| {what} | {variant} | {shown} | {runs} | {compiled} |")
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
