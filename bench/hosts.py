"""Benchmark: the same image from two Linux hosts, Debian bookworm with Bazel 4.2.3 and Debian sid with
Bazel 7.7.1 (WORKSPACE mode, ``--config=bazel7``), in the root ``.ci/setup-sid`` makes.

    python3 bench/hosts.py [--platforms linux_aarch64 linux_x86_64] [--out bench/results/hosts.md]

Each host builds, cold in a fresh copy of the checkout with its own output base (the user's repository
cache, so no download is timed), both images and everything the provenance names: ``//:image`` and
``//:image_linux_x86_64`` (gzip layers), both PEXes, module manifests, SBOMs and provenances, with an
execution log. The table gives each top-level artifact's sha256 from each host. The provenance differs by
design: its builder records the Bazel release. The action comparison pairs every action of the two logs
by mnemonic and outputs (Bazel 7 names its exec configuration differently, so ``bazel-out/<config>/`` is
cut from paths) and counts those whose inputs (path and digest) are not the same on both hosts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the sid-root runner of the test harness

from tests.bazel_util import copy_checkout, remove_tree  # noqa: E402
from tests.sid_root import SID_ROOT, available, run_in_sid  # noqa: E402

CACHE = Path.home() / ".cache" / "sparkseal"
PLATFORMS = ("linux_aarch64", "linux_x86_64")
# Top-level artifacts below bazel-bin: (platform, what, path, how to read its digest).
ARTIFACTS = [
    (p, f"{what} {p}", path.format(p=p), kind)
    for p in PLATFORMS
    for what, path, kind in (
        ("image", "image_{p}.digest", "text"),
        ("vLLM wheel", "third_party/vllm/wheel_{p}", "whl"),
        ("kernels wheel", "kernels_sm121/wheel_{p}", "whl"),
        ("PEX", "pex_{p}.pex.digest", "text"),
        ("module manifest", "manifest_{p}.json", "file"),
        ("SBOM", "sbom_{p}.spdx.json", "file"),
        ("provenance", "provenance_{p}.intoto.json", "file"),
    )
]
_CONFIG = re.compile(r"bazel-out/[^/]+/")


def digest(bin_dir: Path, rel: str, kind: str) -> str:
    """The artifact's sha256 as its digest file says, or of the file (the one wheel in a folder)."""
    path = bin_dir / rel
    if kind == "text":
        return path.read_text().strip().removeprefix("sha256:")
    if kind == "whl":
        [path] = sorted(path.glob("*.whl"))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def spawns(log: Path) -> dict[tuple[str, tuple[str, ...]], dict[str, str]]:
    """(mnemonic, outputs) -> {input path: digest} of every spawn of a JSON execution log."""
    text, decoder, index, found = log.read_text(), json.JSONDecoder(), 0, {}
    while index < len(text):
        if text[index].isspace():
            index += 1
            continue
        spawn, index = decoder.raw_decode(text, index)
        outputs = tuple(sorted(_CONFIG.sub("bazel-out/", o["path"]) for o in spawn.get("actualOutputs", [])))
        inputs = {_CONFIG.sub("bazel-out/", i["path"]): i["digest"]["hash"] for i in spawn.get("inputs", [])}
        found[(spawn.get("mnemonic", ""), outputs)] = inputs
    return found


def targets(platforms: tuple[str, ...]) -> list[str]:
    """The image and the provenance (which needs the PEX, manifest and SBOM) of each platform."""
    return [f"//:{kind}_{p}" for p in platforms for kind in ("image", "provenance")]


def collect(bin_dir: Path, platforms: tuple[str, ...]) -> dict[str, str]:
    """what -> sha256 of every top-level artifact of ``platforms``; for each provenance also
    ``what (without the Bazel release)``: the sha256 of the statement with the builder's Bazel release
    blanked, which the two hosts record differently by design."""
    found = {what: digest(bin_dir, rel, kind) for p, what, rel, kind in ARTIFACTS if p in platforms}
    for p, what, rel, _ in ARTIFACTS:
        if p in platforms and what.startswith("provenance"):
            statement = json.loads((bin_dir / rel).read_text())
            statement["predicate"]["runDetails"]["builder"]["version"]["bazel"] = ""
            text = json.dumps(statement, sort_keys=True).encode()
            found[f"{what} (without the Bazel release)"] = hashlib.sha256(text).hexdigest()
    return found


def build_here(scratch: Path, platforms: tuple[str, ...]) -> tuple[dict[str, str], Path, float]:
    """Bookworm, Bazel 4.2.3: the artifacts' digests, the execution log and the seconds the build took.
    The output base goes afterwards, so the two hosts' builds never hold the disk together."""
    ws = copy_checkout(REPO, scratch / "bookworm" / "sparkseal")
    base, log = scratch / "bookworm" / "output-base", scratch / "bookworm.exec.json"
    start = time.monotonic()
    build = [f"--execution_log_json_file={log}", *targets(platforms)]
    subprocess.run(["bazel", f"--output_base={base}", "build", *build], cwd=ws, check=True)
    seconds = time.monotonic() - start
    info = subprocess.run(
        ["bazel", f"--output_base={base}", "info", "bazel-bin"],
        cwd=ws,
        check=True,
        capture_output=True,
        text=True,
    )
    found = collect(Path(info.stdout.strip()), platforms)
    subprocess.run(["bazel", f"--output_base={base}", "shutdown"], cwd=ws, check=False)
    remove_tree(scratch / "bookworm")
    return found, log, seconds


def build_in_sid(scratch: Path, platforms: tuple[str, ...]) -> tuple[dict[str, str], Path, float]:
    """Sid, Bazel 7.7.1: the same, in the sid root (the checkout copy at the same path there)."""
    ws = copy_checkout(REPO, scratch / "sid" / "sparkseal")
    base, log, where = scratch / "sid" / "output-base", scratch / "sid.exec.json", scratch / "sid.bin"
    script = (
        f"set -eu\ncd {shlex.quote(str(ws))}\nstart=$(date +%s.%N)\n"
        f"bazel --output_base={base} build --config=bazel7 --execution_log_json_file={log} "
        f"{' '.join(targets(platforms))}\n"
        f'end=$(date +%s.%N)\necho "seconds $start $end"\n'
        f"bazel --output_base={base} info --config=bazel7 bazel-bin > {where}\n"
    )
    result = run_in_sid(script, [CACHE], {}, timeout=7200)
    if result.returncode != 0:
        raise SystemExit(f"sid build failed:\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}")
    start, end = next(line for line in result.stdout.splitlines() if line.startswith("seconds ")).split()[1:]
    found = collect(Path(where.read_text().strip()), platforms)
    remove_tree(scratch / "sid")
    return found, log, float(end) - float(start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "hosts.md")
    parser.add_argument("--platforms", nargs="+", choices=PLATFORMS, default=list(PLATFORMS))
    args = parser.parse_args()
    platforms = tuple(args.platforms)
    if not available():
        raise SystemExit(f"{SID_ROOT}: expected the sid root of .ci/setup-sid, found none")
    scratch = CACHE / "bench-hosts"
    remove_tree(scratch)
    scratch.mkdir(parents=True)
    try:
        here, here_log, here_s = build_here(scratch, platforms)
        sid, sid_log, sid_s = build_in_sid(scratch, platforms)
        rows = [(what, here[what], sid[what]) for what in here]
        here_spawns, sid_spawns = spawns(here_log), spawns(sid_log)
        common = sorted(set(here_spawns) & set(sid_spawns))
        differing = [key for key in common if here_spawns[key] != sid_spawns[key]]
        only = len(set(here_spawns) ^ set(sid_spawns))
    finally:
        remove_tree(scratch)
    lines = [
        "# The same image from two Linux hosts",
        "",
        f"- Date: {datetime.now(UTC):%Y-%m-%d}; command: "
        f"`python3 bench/hosts.py --platforms {' '.join(platforms)}` (one run, each host cold in a fresh copy"
        " of the checkout and output base, the user's repository cache shared; each host's output base"
        " deleted before the other's build).",
        f"- Machine: {platform.machine()}, {os.cpu_count()} cores.",
        "- Host A: Debian bookworm (Python 3.11, g++ 12, glibc 2.36), Bazel 4.2.3 (`bazel-bootstrap`), "
        "WORKSPACE.",
        "- Host B: Debian sid root of `.ci/setup-sid` (Python 3.14, g++ 16, glibc 2.43), Bazel 7.7.1+ds-8+b1 "
        "(`bazel-bootstrap`), WORKSPACE (`--config=bazel7`).",
        f"- Targets: `{' '.join(targets(platforms))}` (gzip layers).",
        "",
        "| artifact | bookworm, Bazel 4.2.3 | sid, Bazel 7.7.1 | equal |",
        "|---|---|---|---|",
        *(f"| {what} | `{a}` | `{b}` | {'yes' if a == b else '**no**'} |" for what, a, b in rows),
        "",
        f"Cold build times: bookworm {here_s:.0f} s, sid {sid_s:.0f} s (ratio sid/bookworm "
        f"{sid_s / here_s:.2f}).",
        "",
        "Bazel 4.2.3 and 7.7.1 write their execution logs differently (7.7.1 lists a tool's runfiles as "
        "inputs, 4.2.3 a runfiles middleman; exec configuration names differ), so the count below pairs "
        "actions across releases, not hosts: the artifacts above are the comparison.",
        "",
        f"Actions in both execution logs: {len(common)}; with different inputs (path or digest, "
        f"configuration names cut): {len(differing)}"
        + (f" ({', '.join(sorted({k[0] for k in differing}))})" if differing else "")
        + f"; actions in one log only: {only}.",
        "",
        'The provenance records the Bazel release (4.2.3 against 7.7.1) by design; the row "without the '
        'Bazel release" compares the statements with that field blanked.',
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
