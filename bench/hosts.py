"""Benchmark: the same image from Debian bookworm with Bazel 4.2.3 and from Debian sid with Bazel 7.7.1,
in WORKSPACE mode (``--config=bazel7``) and with bzlmod (``--config=bzlmod``), in the root
``.ci/setup-sid`` makes.

    python3 bench/hosts.py [--platforms linux_aarch64 linux_x86_64] [--hosts bookworm sid sid-bzlmod]
        [--cold] [--base-layers] [--out bench/results/hosts.md]

Each host builds, cold in a fresh copy of the checkout with its own output base (the user's repository
cache, so no download is timed), both images and everything the provenance names: ``//:image`` and
``//:image_linux_x86_64`` (gzip layers), both PEXes, module manifests, SBOMs and provenances, with an
execution log. ``--cold`` gives each host an empty repository cache of its own instead (every download
timed: the Debian packages by their locked archive paths, the wheels from the pip index), which only the
package registries fill; ``--base-layers`` builds only the Debian base layer of each image
(``//:layer_base_<platform>``, the layer whose .debs a non-bookworm host could not fetch before).
The table gives each top-level artifact's sha256 from each host. The provenance differs by
design: its record of the Bazel that ran says what each Bazel's Starlark tells (< 6.2 on 4.2.3, >= 6.2 on
7.7.1). The action comparison pairs every action of the first host's log with each other's by mnemonic and
outputs and counts those whose inputs (path and digest) differ. Paths are compared as WORKSPACE mode names
them: Bazel 7 names its exec configuration differently, so ``bazel-out/<config>/`` is cut from paths, and
bzlmod's canonical repository names (``external/_main~sparkseal~python_deps/...``) are read as the apparent
ones (``external/python_deps/...``, ``sparkseal.core.repo_names``), so external inputs are compared too.
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

from sparkseal.core.repo_names import apparent_text  # noqa: E402
from sparkseal.fetch.index import index_url  # noqa: E402
from tests.bazel_util import copy_checkout, remove_tree  # noqa: E402
from tests.sid_root import SID_ROOT, available, run_in_sid  # noqa: E402

CACHE = Path.home() / ".cache" / "sparkseal"
PLATFORMS = ("linux_aarch64", "linux_x86_64")
# The Debian base layers (--base-layers): (platform, what, descriptor path, how to read its digest).
BASE_LAYERS = [(p, f"Debian base layer {p}", f"layer_base_{p}.json", "descriptor") for p in PLATFORMS]
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
# The main repository's runfiles directory: `_main` under bzlmod, the workspace's name in WORKSPACE mode.
_MAIN_RUNFILES = re.compile(r"\.runfiles/_main/")
WORKSPACE_NAME = "sparkseal"
# Inputs Bazel writes that list paths, configuration directories among them.
BAZEL_PATH_LISTS = (".params", "MANIFEST", "_repo_mapping")


def digest(bin_dir: Path, rel: str, kind: str) -> str:
    """The artifact's sha256 as its digest file says, or of the file (the one wheel in a folder)."""
    path = bin_dir / rel
    if kind == "descriptor":
        return str(json.loads(path.read_text())["digest"]).removeprefix("sha256:")
    if kind == "text":
        return path.read_text().strip().removeprefix("sha256:")
    if kind == "whl":
        [path] = sorted(path.glob("*.whl"))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def workspace_path(path: str) -> str:
    """``path`` as WORKSPACE mode names it: no configuration directory, apparent repository names, the
    main repository's runfiles under the workspace's name."""
    path = apparent_text(_CONFIG.sub("bazel-out/", path))
    return _MAIN_RUNFILES.sub(f".runfiles/{WORKSPACE_NAME}/", path)


def spawns(log: Path) -> dict[tuple[str, tuple[str, ...]], dict[str, str]]:
    """(mnemonic, outputs) -> {input path: digest} of every spawn of a JSON execution log, each path as
    :func:`workspace_path` writes it."""
    text, decoder, index, found = log.read_text(), json.JSONDecoder(), 0, {}
    while index < len(text):
        if text[index].isspace():
            index += 1
            continue
        spawn, index = decoder.raw_decode(text, index)
        outputs = tuple(sorted(workspace_path(o["path"]) for o in spawn.get("actualOutputs", [])))
        inputs = {workspace_path(i["path"]): i["digest"]["hash"] for i in spawn.get("inputs", [])}
        found[(spawn.get("mnemonic", ""), outputs)] = inputs
    return found


def compare(
    a: dict[tuple[str, tuple[str, ...]], dict[str, str]], b: dict[tuple[str, tuple[str, ...]], dict[str, str]]
) -> str:
    """One sentence on two hosts' actions (:func:`spawns` of each log): how many pair up, how many list
    other inputs, and, of the inputs both logs name, which have another digest.

    A host that leaked into an action would show as the same path with another digest, whatever each
    Bazel release lists besides. Files that spell out paths (param files, runfiles manifests and
    repository mappings) name each release's configuration directories, so they are left out.
    """
    common = sorted(set(a) & set(b))
    other_lists = [key for key in common if a[key] != b[key]]
    shared = [
        (key, path)
        for key in common
        for path in sorted(set(a[key]) & set(b[key]))
        if not path.endswith(BAZEL_PATH_LISTS)
    ]
    changed = [(key, path) for key, path in shared if a[key][path] != b[key][path]]
    text = f"{len(common)} actions in both logs, {len(other_lists)} with different input lists"
    if other_lists:
        text += f" ({', '.join(sorted({key[0] for key in other_lists}))})"
    text += f", {len(set(a) ^ set(b))} in one log only; of the {len(shared)} inputs both logs name, "
    text += f"{len(changed)} have another digest"
    if changed:
        paths = sorted({path for _, path in changed})
        more = f" and {len(paths) - 8} more" if len(paths) > 8 else ""
        text += f" ({', '.join(sorted({key[0] for key, _ in changed}))}; files: "
        text += f"{', '.join(f'`{p}`' for p in paths[:8])}{more})"
    return text + "."


# What a run builds: the whole images (the default) or, with --base-layers, only the Debian base layers.
BASE_ONLY = {"value": False}


def targets(platforms: tuple[str, ...]) -> list[str]:
    """The image and the provenance (which needs the PEX, manifest and SBOM) of each platform, or the
    Debian base layers."""
    if BASE_ONLY["value"]:
        return [f"//:layer_base_{p}" for p in platforms]
    return [f"//:{kind}_{p}" for p in platforms for kind in ("image", "provenance")]


def cache_flags(scratch: Path, host: str, cold: bool) -> list[str]:
    """An empty repository cache of the host's own (--cold), named to Bazel and to our rules; else none."""
    if not cold:
        return []
    cache = scratch / f"{host}.repository-cache"
    return [f"--repository_cache={cache}", f"--repo_env=SPARKSEAL_REPOSITORY_CACHE={cache}"]


def without_bazel_record(statement: dict) -> str:
    """The sha256 of a provenance statement with what it records of the Bazel that ran blanked (its
    ``internalParameters.bazel`` and any release its builder names), which hosts record differently by
    design."""
    predicate = statement["predicate"]
    predicate["buildDefinition"]["internalParameters"].pop("bazel", None)
    predicate["runDetails"]["builder"]["version"].pop("bazel", None)
    return hashlib.sha256(json.dumps(statement, sort_keys=True).encode()).hexdigest()


def collect(bin_dir: Path, platforms: tuple[str, ...]) -> dict[str, str]:
    """what -> sha256 of every top-level artifact of ``platforms``; for each provenance also
    ``what (without the Bazel record)``: :func:`without_bazel_record`."""
    if BASE_ONLY["value"]:
        return {what: digest(bin_dir, rel, kind) for p, what, rel, kind in BASE_LAYERS if p in platforms}
    found = {what: digest(bin_dir, rel, kind) for p, what, rel, kind in ARTIFACTS if p in platforms}
    for p, what, rel, _ in ARTIFACTS:
        if p in platforms and what.startswith("provenance"):
            statement = json.loads((bin_dir / rel).read_text())
            found[f"{what} (without the Bazel record)"] = without_bazel_record(statement)
    return found


def build_here(scratch: Path, platforms: tuple[str, ...], cold: bool) -> tuple[dict[str, str], Path, float]:
    """Bookworm, Bazel 4.2.3: the artifacts' digests, the execution log and the seconds the build took.
    The output base goes afterwards, so the two hosts' builds never hold the disk together."""
    ws = copy_checkout(REPO, scratch / "bookworm" / "sparkseal")
    base, log = scratch / "bookworm" / "output-base", scratch / "bookworm.exec.json"
    start = time.monotonic()
    build = [f"--execution_log_json_file={log}", *cache_flags(scratch, "bookworm", cold), *targets(platforms)]
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


def build_in_sid(
    scratch: Path, platforms: tuple[str, ...], config: str, cold: bool
) -> tuple[dict[str, str], Path, float]:
    """Sid, Bazel 7.7.1: the same, in the sid root (the checkout copy at the same path there), with
    ``--config=<config>``: ``bazel7`` (WORKSPACE) or ``bzlmod`` (MODULE.bazel). Cold, the root sees
    only the scratch folder (not the user's cache) and the pip index this machine is configured with."""
    ws = copy_checkout(REPO, scratch / config / "sparkseal")
    base, log = scratch / config / "output-base", scratch / f"{config}.exec.json"
    where = scratch / f"{config}.bin"
    script = (
        f"set -eu\ncd {shlex.quote(str(ws))}\nstart=$(date +%s.%N)\n"
        f"bazel --output_base={base} build --config={config} --execution_log_json_file={log} "
        f"{' '.join(cache_flags(scratch, config, cold) + targets(platforms))}\n"
        f'end=$(date +%s.%N)\necho "seconds $start $end"\n'
        f"bazel --output_base={base} info --config={config} bazel-bin > {where}\n"
    )
    env = {"PIP_INDEX_URL": index_url()} if cold else {}
    result = run_in_sid(script, [scratch] if cold else [CACHE], env, timeout=7200)
    if result.returncode != 0:
        raise SystemExit(
            f"sid build (--config={config}) failed:\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
        )
    start, end = next(line for line in result.stdout.splitlines() if line.startswith("seconds ")).split()[1:]
    found = collect(Path(where.read_text().strip()), platforms)
    remove_tree(scratch / config)
    return found, log, float(end) - float(start)


# The hosts a run can compare: name -> (column title, how it builds).
HOSTS = {
    "bookworm": ("bookworm, Bazel 4.2.3, WORKSPACE", build_here),
    "sid": (
        "sid, Bazel 7.7.1, WORKSPACE",
        lambda scratch, platforms, cold: build_in_sid(scratch, platforms, "bazel7", cold),
    ),
    "sid-bzlmod": (
        "sid, Bazel 7.7.1, bzlmod",
        lambda scratch, platforms, cold: build_in_sid(scratch, platforms, "bzlmod", cold),
    ),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "hosts.md")
    parser.add_argument("--platforms", nargs="+", choices=PLATFORMS, default=list(PLATFORMS))
    parser.add_argument("--hosts", nargs="+", choices=list(HOSTS), default=list(HOSTS))
    parser.add_argument("--cold", action="store_true", help="each host with an empty repository cache")
    parser.add_argument("--base-layers", action="store_true", help="only the Debian base layers")
    args = parser.parse_args()
    BASE_ONLY["value"] = args.base_layers
    platforms, hosts = tuple(args.platforms), list(dict.fromkeys(args.hosts))
    if len(hosts) < 2:
        raise SystemExit(f"--hosts: expected at least two of {', '.join(HOSTS)}, got {' '.join(hosts)}")
    if not available() and any(h.startswith("sid") for h in hosts):
        raise SystemExit(f"{SID_ROOT}: expected the sid root of .ci/setup-sid, found none")
    scratch = CACHE / "bench-hosts"
    remove_tree(scratch)
    scratch.mkdir(parents=True)
    found, seconds, logs = {}, {}, {}
    try:
        for host in hosts:
            found[host], log, seconds[host] = HOSTS[host][1](scratch, platforms, args.cold)
            # A cold host's cache goes with its output base: one host's downloads on disk at a time.
            for cache in scratch.glob("*.repository-cache"):
                remove_tree(cache)
            logs[host] = spawns(log)
    finally:
        remove_tree(scratch)
    first = hosts[0]
    comparisons = [
        f"- {HOSTS[first][0]} against {HOSTS[h][0]}: {compare(logs[first], logs[h])}" for h in hosts[1:]
    ]
    times = ", ".join(f"{HOSTS[h][0]} {seconds[h]:.0f} s ({seconds[h] / seconds[first]:.2f})" for h in hosts)
    options = (" --cold" if args.cold else "") + (" --base-layers" if args.base_layers else "")
    caches = (
        "an empty repository cache of its own (every download timed, from the package registries only)"
        if args.cold
        else "the user's repository cache shared"
    )
    lines = [
        "# The same image from different Linux hosts and Bazel modes",
        "",
        f"- Date: {datetime.now(UTC):%Y-%m-%d}; command: "
        f"`python3 bench/hosts.py --platforms {' '.join(platforms)} --hosts {' '.join(hosts)}{options}` (one "
        f"run, each host cold in a fresh copy of the checkout and output base, {caches}; each"
        " host's output base deleted before the next one's build).",
        f"- Machine: {platform.machine()}, {os.cpu_count()} cores.",
        "- bookworm: Debian bookworm (Python 3.11, g++ 12, glibc 2.36), Bazel 4.2.3 (`bazel-bootstrap`), "
        "WORKSPACE.",
        "- sid: the Debian sid root of `.ci/setup-sid` (Python 3.14, g++ 16, glibc 2.43), "
        "Bazel 7.7.1+ds-8+b1 (`bazel-bootstrap`): WORKSPACE with `--config=bazel7`, bzlmod (MODULE.bazel) "
        "with `--config=bzlmod`.",
        f"- Targets: `{' '.join(targets(platforms))}` (gzip layers).",
        "",
        "| artifact | " + " | ".join(HOSTS[h][0] for h in hosts) + " | equal |",
        "|---|" + "---|" * len(hosts) + "---|",
        *(
            f"| {what} | "
            + " | ".join(f"`{found[h][what]}`" for h in hosts)
            + f" | {'yes' if len({found[h][what] for h in hosts}) == 1 else '**no**'} |"
            for what in found[first]
        ),
        "",
        f"Cold build times (ratio to the first): {times}.",
        "",
        *(
            []
            if args.base_layers
            else [
                "The provenance records what each Bazel tells of itself by design (no release reported, "
                '< 6.2 inferred on 4.2.3, >= 6.2 on 7.7.1); the row "without the Bazel record" compares the '
                "statements with that record blanked.",
                "",
            ]
        ),
        "Actions paired by mnemonic and outputs across the execution logs, paths as WORKSPACE mode names "
        "them (bzlmod's canonical repository names read as the apparent ones, so external inputs pair up). "
        "Bazel 4.2.3 and 7.7.1 write their logs differently (7.7.1 lists a tool's runfiles as inputs, "
        "4.2.3 a runfiles middleman; exec configuration names differ), so a pair across releases differs in "
        "its inputs' paths whatever the host; the artifacts above are the comparison.",
        "",
        *comparisons,
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
