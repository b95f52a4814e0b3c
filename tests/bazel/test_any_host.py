"""Any host from a cold cache: the Debian base layer fetched on Debian sid (Bazel 7.7.1, WORKSPACE mode and
bzlmod) from empty repository caches equals the bookworm/Bazel 4.2.3 build's, and a build whose repository
cache is bind-mounted from elsewhere runs with no network at all.

The sid root's apt sources carry sid, not bookworm, and its apt would refuse bookworm's Release files: the
.debs can only come through their locked archive paths (sparkseal.fetch.debian_archive, the base URL read
from those sources as text) and Bazel's downloader. Only the package registries are reached: the Debian
archive the root's sources name and the configured pip index (for the secret scanner the layer runs).

The offline build mounts the first sid build's cache at the repository cache path of .bazelrc, a mount
point of its own, with the output base on another: Bazel cannot hard-link a hit there, so each one is
copied from the cache (link count 1). With the cache on the output base's own mount the hits are hard
links. The fetch told to look for the cache elsewhere (SPARKSEAL_REPOSITORY_CACHE) goes to the network and
fails: the copy is what serves the hits across mounts. The copy is no download: the same offline build
with `--repository_disable_download`, as a new user on a CI volume would run it, passes too (the secret
scanner's wheel included), and told to look elsewhere it fails naming the real cause (downloads off, the
cache that lacks the file), not the network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkseal.fetch.index import index_url
from tests.bazel_util import REPO, Workspace, copy_checkout, remove_tree
from tests.sid_root import SID_ROOT, available, run_in_sid

pytestmark = pytest.mark.bazel

CACHE = Path.home() / ".cache" / "sparkseal"
TARGET = "//:layer_base_linux_aarch64"
DESCRIPTOR = "layer_base_linux_aarch64.json"
DEBS = "external/debian_linux_aarch64/debs"

# Each step keeps its output and "exit-status start end" in $OUT/<step>.*; a failed step does not stop
# the others. No `bazel shutdown`: the servers die with run_in_sid's pid namespace.
STEP = """\
set -u
step() {{
    name=$1
    shift
    start=$EPOCHREALTIME
    "$@" >"$OUT/$name.out" 2>&1
    echo "$? $start $EPOCHREALTIME" >"$OUT/$name.rc"
}}
OUT={out}
cd {ws}
"""
COLD = """\
for mode in bazel7 bzlmod; do
    base={scratch}/output-$mode
    cache={scratch}/cache-$mode
    step "$mode" bazel --output_base="$base" build --config="$mode" --repository_cache="$cache" \\
        --repo_env=SPARKSEAL_REPOSITORY_CACHE="$cache" {target}
    bin=$(bazel --output_base="$base" info --config="$mode" bazel-bin 2>/dev/null)
    cp "$bin/{descriptor}" "$OUT/$mode.json"
done
"""
# The cache of the cold WORKSPACE build, bind-mounted at .bazelrc's repository cache path.
OFFLINE = """\
mkdir -p /root/.cache/sparkseal/repository
mount --bind {scratch}/cache-bazel7 /root/.cache/sparkseal/repository
step offline bazel --output_base={scratch}/output-offline build --config=bazel7 {target}
bin=$(bazel --output_base={scratch}/output-offline info --config=bazel7 bazel-bin 2>/dev/null)
cp "$bin/{descriptor}" "$OUT/offline.json"
stat -c %h {scratch}/output-offline/{debs}/*.deb | sort -u >"$OUT/offline.links"
# The same cache on the output base's own mount: hits are hard links.
step same_mount bazel --output_base={scratch}/output-same build --config=bazel7 \\
    --repository_cache={scratch}/cache-bazel7 --repo_env=SPARKSEAL_REPOSITORY_CACHE={scratch}/cache-bazel7 \\
    @debian_linux_aarch64//:debs
stat -c %h {scratch}/output-same/{debs}/*.deb | sort -u >"$OUT/same_mount.links"
step elsewhere bazel --output_base={scratch}/output-elsewhere build --config=bazel7 \\
    --repo_env=SPARKSEAL_REPOSITORY_CACHE=/nonexistent @debian_linux_aarch64//:debs
# Downloads off: the hits across the mount are still served (copies are no downloads).
step no_download bazel --output_base={scratch}/output-no-download build --config=bazel7 \\
    --repository_disable_download {target}
bin=$(bazel --output_base={scratch}/output-no-download info --config=bazel7 bazel-bin 2>/dev/null)
cp "$bin/{descriptor}" "$OUT/no_download.json"
step no_download_elsewhere bazel --output_base={scratch}/output-no-download-elsewhere build --config=bazel7 \\
    --repository_disable_download --repo_env=SPARKSEAL_REPOSITORY_CACHE=/nonexistent {target}
"""


def _step(out: Path, name: str) -> tuple[int, float, str]:
    """Exit status, seconds and output of one step of the script."""
    status, start, end = (out / f"{name}.rc").read_text().split()
    return int(status), float(end) - float(start), (out / f"{name}.out").read_text()


def _layer_digest(path: Path) -> str:
    return str(json.loads(path.read_text())["digest"])


@pytest.mark.skipif(
    not available() and not os.environ.get("CI"),
    reason=f"no Debian sid root at {SID_ROOT}: run .ci/setup-sid",
)
def test_sid_fetches_the_bookworm_base_layer_cold_and_a_mounted_cache_builds_offline(
    real_workspace: Workspace,
) -> None:
    assert available(), f"{SID_ROOT}: expected the sid root of .ci/setup-sid (CI makes it), found none"
    host = real_workspace.bazel("build", TARGET)
    assert host.returncode == 0, host.output
    want = _layer_digest(real_workspace.bin_path(DESCRIPTOR))

    # Not under the user's repository cache: the sid builds must not see it.
    scratch = CACHE / "any-host-test"
    remove_tree(scratch)
    out = scratch / "out"
    out.mkdir(parents=True)
    try:
        ws = copy_checkout(REPO, scratch / "sparkseal")
        fields = {"out": out, "ws": ws, "scratch": scratch, "target": TARGET, "descriptor": DESCRIPTOR}
        fields["debs"] = DEBS
        env = {"PIP_INDEX_URL": index_url()}
        result = run_in_sid(STEP.format(**fields) + COLD.format(**fields), [scratch], env, timeout=1800)
        assert result.returncode == 0, result.stdout + result.stderr
        for mode in ("bazel7", "bzlmod"):
            status, seconds, output = _step(out, mode)
            assert status == 0, f"sid {mode} build from an empty repository cache failed:\n{output}"
            got = _layer_digest(out / f"{mode}.json")
            assert got == want, f"sid {mode}: base layer {got}, expected the bookworm build's {want}"
            print(f"sid {mode} cold: {seconds:.0f} s, {got}")

        result = run_in_sid(
            STEP.format(**fields) + OFFLINE.format(**fields), [scratch], {}, timeout=1200, network=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
        status, seconds, output = _step(out, "offline")
        assert status == 0, f"offline build with the bind-mounted repository cache failed:\n{output}"
        assert _layer_digest(out / "offline.json") == want
        # Across mount points no hard link can be made: each .deb is a copy of the cache's file.
        assert (out / "offline.links").read_text().split() == ["1"]
        print(f"sid offline, cache bind-mounted: {seconds:.0f} s")
        status, _, output = _step(out, "same_mount")
        assert status == 0, output
        # Cache and output base on one mount: every .deb is a hard link of the cache's file.
        links = (out / "same_mount.links").read_text().split()
        assert links and all(int(n) >= 2 for n in links), f"link counts on one mount: {links}"
        status, _, output = _step(out, "elsewhere")
        assert status != 0, "without the cache's copies the offline build should have needed the network"
        assert "failed (expected sha256 " in output, output
        status, _, output = _step(out, "no_download")
        assert status == 0, f"offline build with downloads off and the bind-mounted cache failed:\n{output}"
        assert _layer_digest(out / "no_download.json") == want
        status, _, output = _step(out, "no_download_elsewhere")
        assert status != 0, "with downloads off and no cache that holds the files, the build should fail"
        assert (
            "Bazel may not download (--repository_disable_download) and the repository cache at /nonexistent"
            in (output)
        ), output
        assert "a proxy, TLS" not in output, output
    finally:
        remove_tree(scratch)
