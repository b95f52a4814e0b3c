"""Benchmark: what a sparkseal build costs, cold, warm, incremental, from a shared cache and remotely.

    python3 bench/build.py [--runs 3] [--images linux_x86_64 linux_aarch64] [--out bench/results/build.md]

Every row is a wall-clock time (Bazel server start included where the output base is new), the median of
``--runs`` runs where a scenario repeats (``--image-runs`` for the images, which take minutes each). Each
run works in a fresh copy of the checkout with its own output base, deleted afterwards.

Scenarios, for our vLLM wheel and for each image:

* cold, empty download cache: a new repository cache, so the locked files come from the configured index;
* cold, warm download cache: a new output base, the user's repository cache;
* no-op: the same build again;
* one patch edited: a line of the first patch's description changed; the row counts the actions that ran
  and, for an image, the layers that changed and their bytes against the image's total;
* clone from the HTTP cache / the gRPC cache: clone A builds with nginx (WebDAV) or BuildGrid as a
  read-write remote cache, clone B at another path with an empty output base builds from it; the row is B's
  time and its hit rate (remote cache hits over all non-internal actions).

The ``zstd`` section builds each image cold twice, in fresh clones with the warm download cache: with gzip
layers (the default) and with zstd layers (``--config=zstd``); each row gives the compressed image and the
physical limit of its own blobs (decompressed by ``gzip -dc`` or ``zstd -dc`` into ``sha256sum``), and the
zstd image must hold the gzip image's tars (the same diff_ids).

For an image (``--image-caches``), the cache row is the HTTP cache's with clone B building with
``--remote_download_toplevel`` (builds without the bytes), and it also gives what the cache holds after
clone A's build and what clone B downloaded (from nginx's access log), against the compressed image. Clone
B then pushes the image to a loopback ``docker-registry`` twice with ``--blob-cache`` (the layers stream
from the cache): the second push must upload nothing. A goals table closes the image section.

Remote execution runs on the fixture workspace (a small fake vLLM release served from loopback) with one
and with two bots of the test harness. The physical limit beside each target is the least work its bytes
need on this machine: for the wheel, reading the upstream wheel, hashing it and writing it back; for an
image, every layer blob decompressed into ``sha256sum`` (the image's files, as tar streams, hashed once;
no build keeps installed trees to ``tar`` any more). The cold rows also give the output base's size on
disk, without the files it shares with the repository cache through hard links, against the compressed
image.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the servers and bots of the test harness

from sparkseal.core.oci import blob_path, read_image  # noqa: E402
from tests.bazel_remote import clone_repo, fixture_source  # noqa: E402
from tests.bazel_util import Workspace, base_env, process_summary, remove_tree  # noqa: E402
from tests.servers.buildgrid_server import bots, buildgrid, postgres  # noqa: E402
from tests.servers.nginx_cache import NginxCache  # noqa: E402
from tests.servers.registry_server import Registry  # noqa: E402

SHARED_CACHE = Path.home() / ".cache" / "sparkseal" / "repository"
PATCH_EDIT = ("Reason:", "Reason: (edited by the benchmark)")
SECTIONS = ("wheel", "caches", "remote-execution", "images", "zstd")


@dataclass
class Row:
    """One scenario: its times, and notes (actions run, hit rate, changed bytes)."""

    times: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


@dataclass
class Build:
    """One timed Bazel build: seconds and the process summary."""

    seconds: float
    processes: dict[str, int]


def bazel(workspace: Workspace, *args: str, timeout: float = 3600) -> Build:
    """Run and time one Bazel command; exit with its output on failure."""
    start = time.monotonic()
    result = workspace.bazel(*args, timeout=timeout)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        sys.exit(f"bench: bazel {' '.join(args)} in {workspace.root} failed:\n{result.output[-4000:]}")
    return Build(seconds, process_summary(result.output) if args[0] == "build" else {})


def executed(processes: dict[str, int]) -> int:
    """Actions that ran (anything but internal ones and cache hits)."""
    return sum(n for kind, n in processes.items() if kind != "internal" and "cache hit" not in kind)


def hit_rate(processes: dict[str, int]) -> str:
    hits = sum(n for kind, n in processes.items() if "cache hit" in kind)
    total = sum(n for kind, n in processes.items() if kind != "internal")
    return f"hit rate {hits}/{total}"


@contextmanager
def clone(scratch: Path, name: str, cache: Path = SHARED_CACHE) -> Iterator[Workspace]:
    """A fresh copy of the checkout with its own output base; both removed afterwards."""
    root = clone_repo(scratch / name / "sparkseal")
    workspace = Workspace(root, scratch / name / "output-base", cache, base_env())
    try:
        yield workspace
    finally:
        workspace.shutdown()
        remove_tree(scratch / name)


def bin_dir(workspace: Workspace) -> Path:
    return workspace.output_base / "execroot" / "sparkseal" / "bazel-out" / "k8-fastbuild" / "bin"


def layers(workspace: Workspace, image: str) -> dict[str, int]:
    """``{layer digest: size}`` of an image's OCI layout in a workspace."""
    manifest = read_image(bin_dir(workspace) / image).manifest
    return {layer["digest"]: layer["size"] for layer in manifest["layers"]}


def disk_note(workspace: Workspace, image: str) -> str:
    """The output base on disk (files shared with the repository cache counted once, there) vs the image."""
    sizes = subprocess.run(
        ["du", "-s", "--block-size=1", str(workspace.repository_cache), str(workspace.output_base)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    own = int(sizes[-1].split()[0])
    compressed = sum(layers(workspace, image).values())
    ratio = own / compressed
    return f"output base {own / 1e9:.1f} GB on disk = {ratio:.2f}x the {compressed / 1e9:.2f} GB image"


def edit_patch(root: Path) -> None:
    patch = sorted((root / "patches/vllm").glob("*.patch"))[0]
    patch.write_text(patch.read_text().replace(*PATCH_EDIT, 1))


def local_scenarios(
    scratch: Path, target: str, runs: int, image: str | None, last: Callable[[Workspace], Row] | None = None
) -> dict[str, Row]:
    """Cold (empty and warm download cache), no-op and one-patch-edited rows for ``target``.

    ``last``, if given, measures one more row on the last run's workspace before it is removed.
    """
    rows: dict[str, Row] = {}
    for run in range(runs):
        empty = run == 0
        cache = scratch / "empty-repository-cache" if empty else SHARED_CACHE
        with clone(scratch, f"local{run}", cache) as ws:
            key = "cold, empty download cache" if empty else "cold, warm download cache"
            rows.setdefault(key, Row()).times.append(bazel(ws, "build", target).seconds)
            if image:
                rows[key].notes.append(disk_note(ws, image))
            rows.setdefault("no-op", Row()).times.append(bazel(ws, "build", target).seconds)
            before = layers(ws, image) if image else {}
            edit_patch(ws.root)
            edited = bazel(ws, "build", target)
            row = rows.setdefault("one patch edited", Row())
            row.times.append(edited.seconds)
            note = f"{executed(edited.processes)} actions ran"
            if image:
                after = layers(ws, image)
                changed = sum(size for digest, size in after.items() if digest not in before)
                note += (
                    f", {sum(d not in before for d in after)}/{len(after)} layers changed, "
                    f"{changed / 1e6:.0f} MB of {sum(after.values()) / 1e6:.0f} MB"
                )
            row.notes.append(note)
            if last is not None and run == runs - 1:
                rows["physical limit (every layer decompressed into sha256sum)"] = last(ws)
        if empty:
            remove_tree(cache)
    return rows


def cache_scenario(scratch: Path, target: str, flags: Callable[[], list[str]], name: str) -> Row:
    """Clone A fills the remote cache, clone B builds from it: B's time and hit rate."""
    row = Row()
    with clone(scratch, f"{name}-a") as first:
        bazel(first, "build", *flags(), target)
    with clone(scratch, f"{name}-b") as second:
        result = bazel(second, "build", *flags(), target)
    row.times.append(result.seconds)
    row.notes.append(f"{hit_rate(result.processes)}, {executed(result.processes)} ran locally")
    return row


def cache_rows(scratch: Path, target: str) -> dict[str, Row]:
    """The HTTP (nginx WebDAV) and gRPC (BuildGrid) cache rows for ``target``."""
    rows = {}
    with NginxCache() as nginx:  # under /tmp: nginx's workers (nobody) cannot enter a 0700 scratch dir
        rows["clone from the HTTP cache"] = cache_scenario(
            scratch, target, lambda: ["--config=remote-cache", f"--remote_cache={nginx.url}"], "http"
        )
    with buildgrid(scratch / "buildgrid") as grid:
        rows["clone from the gRPC cache"] = cache_scenario(
            scratch,
            target,
            lambda: [
                "--config=remote-cache",
                f"--remote_cache={grid.url}",
                f"--remote_instance_name={grid.instance}",
            ],
            "grpc",
        )
    return rows


def _served_bytes(cache: NginxCache, since: int) -> int:
    """Bytes nginx sent in answers to GET requests logged after the first ``since`` lines."""
    log = (cache.root.parent / "state" / "access.log").read_text().splitlines()[since:]
    sent = 0
    for line in log:
        parts = line.split('"')
        if len(parts) > 2 and parts[1].startswith("GET "):
            status, size = parts[2].split()[:2]
            sent += int(size) if status == "200" else 0
    return sent


def _stored_bytes(cache: NginxCache) -> int:
    sizes = subprocess.run(
        ["du", "-s", "--block-size=1", "--apparent-size", str(cache.root)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(sizes.stdout.split()[0])


def image_cache_rows(scratch: Path, target: str, image: str) -> dict[str, Row]:
    """Clone A fills an HTTP cache; clone B builds the image from it without the bytes, then pushes it."""
    rows: dict[str, Row] = {}
    flags = ["--config=remote-cache"]
    with NginxCache() as nginx:  # under /tmp: nginx's workers (nobody) cannot enter a 0700 scratch dir
        flags.append(f"--remote_cache={nginx.url}")
        with clone(scratch, "http-a") as first:
            bazel(first, "build", *flags, target)
            compressed = sum(layers(first, image).values())
        stored = _stored_bytes(nginx)
        logged = len((nginx.root.parent / "state" / "access.log").read_text().splitlines())
        with clone(scratch, "http-b") as second:
            result = bazel(second, "build", *flags, "--remote_download_toplevel", target)
            downloaded = _served_bytes(nginx, logged)
            row = rows.setdefault("clone from the HTTP cache, --remote_download_toplevel", Row())
            row.times.append(result.seconds)
            row.notes += [
                f"{hit_rate(result.processes)}, {executed(result.processes)} ran locally",
                f"downloaded {downloaded / 1e6:.2f} MB = {100 * downloaded / compressed:.3f}% of the "
                f"{compressed / 1e9:.2f} GB image",
                f"the cache holds {stored / 1e9:.2f} GB = {stored / compressed:.2f}x the image",
            ]
            with Registry(scratch / "registry") as registry:
                for attempt in ("first", "second"):
                    logged = len((nginx.root.parent / "state" / "access.log").read_text().splitlines())
                    args = ["--blob-cache", nginx.url, f"{registry.host}/sparkseal/bench", "--json"]
                    start = time.monotonic()
                    pushed = second.bazel(
                        "run", *flags, "--remote_download_toplevel", f"{target}.push", "--", *args
                    )
                    seconds = time.monotonic() - start
                    if pushed.returncode != 0:
                        sys.exit(f"bench: {target}.push failed:\n{pushed.output[-4000:]}")
                    report = json.loads(pushed.output.strip().splitlines()[-1])
                    push_row = rows.setdefault(f"push to a loopback registry, {attempt} time", Row())
                    push_row.times.append(seconds)
                    uploaded = report["uploaded_bytes"] / 1e6
                    push_row.notes.append(
                        f"{len(report['uploaded'])} blobs uploaded ({uploaded:.1f} MB), "
                        f"{len(report['skipped'])} already there; "
                        f"{_served_bytes(nginx, logged) / 1e6:.1f} MB read from the cache"
                    )
    return rows


def goals(rows: dict[str, Row]) -> list[str]:
    """The image goals of the build-scale work, from this run's rows."""
    cold = rows["cold, warm download cache"].median
    limit = rows["physical limit (every layer decompressed into sha256sum)"].median
    edited = rows["one patch edited"]
    lines = [
        "### Goals",
        "",
        "| figure | goal | measured |",
        "|---|---|---|",
        f"| cold image / physical limit | <= 3x | {cold / limit:.1f}x ({cold:.0f} s / {limit:.0f} s) |",
        f"| one patch edited / cold; image bytes rewritten | <= 0.10; <= 2% | {edited.median / cold:.2f}; "
        f"{'; '.join(sorted(set(edited.notes)))} |",
    ]
    hit = rows.get("clone from the HTTP cache, --remote_download_toplevel")
    if hit is not None:
        lines.append(
            f"| cache-hit clean clone / cold; bytes downloaded / image bytes | <= 0.15; <= 1% | "
            f"{hit.median / cold:.2f}; {'; '.join(hit.notes[1:2])} |"
        )
        lines.append(
            f"| remote-cache bytes stored per image build / compressed image | <= 1.1x | {hit.notes[2]} |"
        )
    second = rows.get("push to a loopback registry, second time")
    if second is not None:
        lines.append(
            f"| push of an image whose layers the registry has | only manifest + config | {second.notes[0]} |"
        )
    disk = [n for n in rows["cold, warm download cache"].notes if n.startswith("output base")]
    lines.append(f"| output base after an image build / compressed image | <= 2x | {'; '.join(disk)} |")
    return [*lines, ""]


def remote_execution_rows(scratch: Path, runs: int) -> dict[str, Row]:
    """The fixture workspace's two wheels built with --config=rbe on one and on two bots."""
    rows: dict[str, Row] = {}
    targets = ["//third_party/vllm:wheel_linux_aarch64", "//third_party/vllm:wheel_linux_x86_64"]
    (scratch / "fixture").mkdir()
    with fixture_source(scratch / "fixture") as source, postgres() as database:
        for count in (1, 2):
            row = rows.setdefault(f"fixture workspace, remote execution, {count} bot(s)", Row())
            with (
                buildgrid(scratch / f"re{count}", database=database) as grid,
                bots(grid, scratch / f"bots{count}", count=count),
            ):
                for run in range(runs):
                    fixture = source.clone(scratch / f"re{count}-{run}")
                    ws = fixture.ws
                    flags = [
                        "--config=rbe",
                        f"--remote_executor={grid.url}",
                        f"--remote_instance_name={grid.instance}",
                        "--noremote_accept_cached",  # every run executes, none is an action-cache hit
                    ]
                    result = bazel(ws, "build", *flags, *targets, timeout=600)
                    row.times.append(result.seconds)
                    row.notes.append(f"{result.processes.get('remote', 0)} remote")
                    ws.shutdown()
                    remove_tree(scratch / f"re{count}-{run}")
    return rows


def physical_limit_wheel(wheel: Path, runs: int) -> Row:
    row = Row()
    for _ in range(runs):
        start = time.monotonic()
        data = wheel.read_bytes()
        subprocess.run(["sha256sum"], input=data, capture_output=True, check=True)
        with tempfile.NamedTemporaryFile() as out:
            out.write(data)
            out.flush()
        row.times.append(time.monotonic() - start)
    return row


def physical_limit_image(
    platform_name: str, runs: int, decompress: str = "gzip"
) -> Callable[[Workspace], Row]:
    """Every layer blob of the image decompressed into sha256sum: its files' bytes, read and hashed once."""

    def measure(ws: Workspace) -> Row:
        row = Row()
        layout = bin_dir(ws) / f"image_{platform_name}"
        blobs = [str(blob_path(layout, digest)) for digest in layers(ws, f"image_{platform_name}")]
        for _ in range(runs):
            start = time.monotonic()
            subprocess.run(
                ["sh", "-c", f'for b in "$@"; do {decompress} -dc "$b"; done | sha256sum', "limit", *blobs],
                capture_output=True,
                check=True,
            )
            row.times.append(time.monotonic() - start)
        sized = subprocess.run(
            ["sh", "-c", f'for b in "$@"; do {decompress} -dc "$b"; done | wc -c', "size", *blobs],
            capture_output=True,
            text=True,
            check=True,
        )
        row.notes.append(f"{int(sized.stdout) / 1e9:.1f} GB of tar in {len(blobs)} layers")
        return row

    return measure


def zstd_rows(scratch: Path, platform_name: str, runs: int) -> dict[str, Row]:
    """Cold builds of one image with gzip and with zstd layers, each with its size and physical limit."""
    rows: dict[str, Row] = {}
    image = f"image_{platform_name}"
    diff_ids = {}
    for compression, flags in (("gzip", []), ("zstd", ["--config=zstd"])):
        with clone(scratch, f"cold-{compression}") as ws:
            row = rows.setdefault(f"cold, {compression} layers", Row())
            row.times.append(bazel(ws, "build", *flags, f"//:{image}").seconds)
            compressed = sum(layers(ws, image).values())
            row.notes.append(f"{compressed / 1e9:.2f} GB compressed")
            config = read_image(bin_dir(ws) / image).manifest["config"]["digest"]
            diff_ids[compression] = json.loads(blob_path(bin_dir(ws) / image, config).read_text())["rootfs"]
            limit = physical_limit_image(platform_name, runs, compression)(ws)
            rows[f"physical limit, {compression} layers ({compression} -dc into sha256sum)"] = limit
            row.notes.append(f"{row.median / limit.median:.1f}x its physical limit")
    same = diff_ids["gzip"] == diff_ids["zstd"]
    rows["cold, zstd layers"].notes.append(
        "the same tars (diff_ids) as gzip" if same else "OTHER TARS THAN GZIP"
    )
    return rows


def table(title: str, rows: dict[str, Row], cold_key: str = "cold, warm download cache") -> list[str]:
    cold = rows[cold_key].median if cold_key in rows else None
    lines = [
        f"## {title}",
        "",
        "| scenario | median s | runs (s) | vs cold | notes |",
        "|---|---:|---|---:|---|",
    ]
    for key, row in rows.items():
        runs = ", ".join(f"{t:.1f}" for t in row.times)
        ratio = f"{row.median / cold:.3f}" if cold else ""
        notes = "; ".join(sorted(set(row.notes)))
        lines.append(f"| {key} | {row.median:.1f} | {runs} | {ratio} | {notes} |")
    return [*lines, ""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each wheel and fixture scenario")
    parser.add_argument("--image-runs", type=int, default=1, help="runs of each image scenario")
    parser.add_argument(
        "--images", nargs="*", default=["linux_x86_64"], choices=["linux_x86_64", "linux_aarch64"]
    )
    parser.add_argument("--image-caches", action="store_true", help="also the cache rows for images")
    parser.add_argument("--wheel-platform", default="linux_aarch64")
    parser.add_argument(
        "--only",
        nargs="*",
        default=list(SECTIONS),
        choices=SECTIONS,
        help="sections to run (default: all)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "build.md")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sparkseal-bench-"))
    command = " ".join(["python3 bench/build.py", *sys.argv[1:]])
    header = [
        "# What a build costs",
        "",
        f"Command: `{command}`",
        f"Machine: {platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
        f"{platform.freedesktop_os_release().get('PRETTY_NAME', platform.system())}; "
        f"{datetime.now(UTC).date().isoformat()}",
        "",
    ]
    sections: list[str] = []

    def publish(lines: list[str]) -> None:
        # Written after every section, so that a long run keeps what it has measured.
        sections.extend(lines)
        args.out.write_text("\n".join(header + sections))
        print("\n".join(lines), flush=True)

    try:
        wheel_target = f"//third_party/vllm:wheel_{args.wheel_platform}"
        rows = {}
        if "wheel" in args.only:
            rows = local_scenarios(scratch, wheel_target, args.runs, None)
            lock = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
            upstream = lock["wheels"][args.wheel_platform]["sha256"]
            rows["physical limit (read, sha256, write the upstream wheel)"] = physical_limit_wheel(
                SHARED_CACHE / "content_addressable" / "sha256" / upstream / "file", args.runs
            )
        if "caches" in args.only:
            rows.update(cache_rows(scratch, wheel_target))
        if rows:
            publish(table(f"Our vLLM wheel ({wheel_target})", rows))
        if "remote-execution" in args.only:
            rows = remote_execution_rows(scratch, args.runs)
            one_bot = "fixture workspace, remote execution, 1 bot(s)"
            publish(table("Remote execution (fixture workspace, two wheels)", rows, one_bot))
        for name in args.images if "images" in args.only else []:
            target = f"//:image_{name}"
            limit = physical_limit_image(name, args.runs)
            rows = local_scenarios(scratch, target, max(args.image_runs, 2), f"image_{name}", limit)
            publish(table(f"The image ({target})", rows))
            if args.image_caches:
                cached = image_cache_rows(scratch, target, f"image_{name}")
                rows.update(cached)
                publish(table(f"The image ({target}) from a remote cache", cached, ""))
            publish(goals(rows))
        for name in args.images if "zstd" in args.only else []:
            rows = zstd_rows(scratch, name, args.runs)
            publish(
                table(
                    f"The image (//:image_{name}) with gzip and with zstd layers", rows, "cold, gzip layers"
                )
            )
    finally:
        remove_tree(scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
