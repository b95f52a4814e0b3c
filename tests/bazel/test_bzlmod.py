"""Bazel 7.7.1 with bzlmod (MODULE.bazel), offline, in the Debian sid root: the same bytes as WORKSPACE mode.

Two workspaces build in the root with Bazel 7.7.1's defaults plus our .bazelrc (bzlmod on, no
``--config=bazel7``): a fixture workspace (its MODULE.bazel is the repository's with the sparkseal
extension's per-repository tags) and the repository itself (``sparkseal.repositories()``). Each wheel must
equal the one Bazel 4.2.3 builds from WORKSPACE on this host. Neither may reach a network: the fixture's
files are in its own repository cache and no index is configured in the root, the real build's are in
the user's repository cache, and every module bazel_tools asks for is overridden locally.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import zipfile
from pathlib import Path

import pytest

from tests.bazel_util import (
    FIXTURE_MODULE_TAGS,
    REPO,
    Workspace,
    base_env,
    copy_checkout,
    fixture_module,
    make_fixture_workspace,
    remove_tree,
)
from tests.fixtures_vllm import make_patch, make_sdist, make_wheel
from tests.sid_root import SID_ROOT, available, run_in_sid

pytestmark = pytest.mark.bazel

CACHE = Path.home() / ".cache" / "sparkseal"
TARGET = "//third_party/vllm:wheel_linux_x86_64"
REAL_WHEEL = "third_party/vllm/wheel_linux_x86_64/vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl"

# The fixture: a tiny vLLM whose one patch changes one file.
VERSION = "0.25.1"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SOURCES = {"vllm/__init__.py": b'"""fixture vllm"""\n', "vllm/spec.py": b"def mapping():\n    return 0\n"}
PATCH = """\
--- a/vllm/spec.py
+++ b/vllm/spec.py
@@ -1,2 +1,2 @@
 def mapping():
-    return 0
+    return -1
"""
FIXTURE_WHEELS = {
    p: f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_{p[len('linux_') :]}.whl"
    for p in ("linux_aarch64", "linux_x86_64")
}
FIXTURE_WHEEL = f"third_party/vllm/wheel_linux_x86_64/{FIXTURE_WHEELS['linux_x86_64']}"

# The modules bazel_tools' MODULE.bazel asks for that Debian does not install, each a local stand-in.
STAND_INS = ("apple_support", "buildozer", "protobuf", "zlib")

# Runs in the root. Each step keeps its output, exit status and wall time in $OUT/<step>.*; a failed step
# does not stop the others, so that one run reports everything. No `bazel shutdown`: the servers die
# with the pid namespace of run_in_sid.
SID_SCRIPT = """\
set -u
step() {{
    name=$1
    shift
    start=$EPOCHREALTIME
    "$@" >"$OUT/$name.out" 2>&1
    echo "$? $start $EPOCHREALTIME" >"$OUT/$name.rc"
}}
OUT={out}
cd {fixture}
step fixture_build bazel --output_base={fixture_base} build --config=bzlmod --symlink_prefix=/ \\
    --repository_cache={fixture_cache} {target}
step fixture_bin bazel --output_base={fixture_base} info --config=bzlmod bazel-bin
cp MODULE.twice MODULE.bazel
step fixture_twice bazel --output_base={fixture_base} query --config=bzlmod //third_party/vllm:all
cp MODULE.broken MODULE.bazel
step fixture_broken bazel --output_base={fixture_base} query --config=bzlmod //third_party/vllm:all
cd {real}
step real_build bazel --output_base={real_base} build {target}
step real_bin bazel --output_base={real_base} info bazel-bin
expr='[[p.release, p.inferred, p.declared] for k, p in providers(target).items()'
expr="$expr"' if k.endswith("%BazelInfo")]'
step real_release bazel --output_base={real_base} cquery --output=starlark --starlark:expr="$expr" \\
    //rules:bazel_version
step real_query bazel --output_base={real_base} query --incompatible_disallow_empty_glob --output=build //...
step mod_graph bazel --output_base={real_base} mod graph --include_builtin
step mod_deps bazel --output_base={real_base} mod deps
"""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fixture(root: Path, cache: Path) -> None:
    """A fixture workspace at ``root`` for both entry points, its locked files already in ``cache``."""
    make_fixture_workspace(root, module=fixture_module())
    # The same with one repository declared twice, for the extension's error.
    twice = 'sparkseal.vllm_lock(name = "vllm_lock", lock = "//third_party/vllm:vllm.lock.json")\n'
    (root / "MODULE.twice").write_text(fixture_module(tags=FIXTURE_MODULE_TAGS + twice))
    artifacts = root.parent / "artifacts"
    artifacts.mkdir()
    make_sdist(artifacts / f"vllm-{VERSION}.tar.gz", VERSION, COMMIT[:9], SOURCES)
    for platform, filename in FIXTURE_WHEELS.items():
        compiled = {"vllm/_C.abi3.so": f"ELF for {platform}".encode()}
        make_wheel(artifacts / filename, VERSION, COMMIT[:9], {**SOURCES, **compiled}, platform)
    digests = {}
    for path in artifacts.iterdir():
        digests[path.name] = _sha256(path)
        target = cache / "content_addressable" / "sha256" / digests[path.name] / "file"
        target.parent.mkdir(parents=True)
        target.write_bytes(path.read_bytes())
    lock = {
        "commit": COMMIT,
        "format": 1,
        "name": "vllm",
        "sdist": {"filename": f"vllm-{VERSION}.tar.gz", "sha256": digests[f"vllm-{VERSION}.tar.gz"]},
        "version": VERSION,
        "wheels": {p: {"filename": f, "sha256": digests[f]} for p, f in FIXTURE_WHEELS.items()},
    }
    (root / "third_party/vllm/vllm.lock.json").write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    # The same with a lock that has no sdist, for an error that names the lock and the field.
    (root / "third_party/vllm/broken.lock.json").write_text(
        json.dumps({k: v for k, v in lock.items() if k != "sdist"}) + "\n"
    )
    locked = 'lock = "//third_party/vllm:vllm.lock.json"'
    broken = FIXTURE_MODULE_TAGS.replace(locked, 'lock = "//third_party/vllm:broken.lock.json"')
    assert broken != FIXTURE_MODULE_TAGS, f"FIXTURE_MODULE_TAGS: expected {locked}"
    (root / "MODULE.broken").write_text(fixture_module(tags=broken))
    make_patch(root / "patches/vllm/0001-fix.patch", PATCH)
    (root / "patches/vllm/series").write_text("0001-fix.patch\n")
    (root / "overlay/vllm/vllm").mkdir(parents=True)
    (root / "overlay/vllm/vllm/_downstream.py").write_bytes(b"DOWNSTREAM = True\n")
    manifest = {"files": {"vllm/_downstream.py": "fixture"}, "replaces": {}}
    (root / "overlay/vllm/overlay.json").write_text(json.dumps(manifest, indent=2) + "\n")


class Steps:
    """What the root's script left in its output folder, step by step."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def output(self, step: str) -> str:
        return (self.out / f"{step}.out").read_text()

    def code(self, step: str) -> str:
        """The step's exit status."""
        status = self.out / f"{step}.rc"
        assert status.is_file(), f"sid step {step}: expected it to run, found no {status}"
        return status.read_text().split()[0]

    def ok(self, step: str) -> str:
        """The step's output, after checking that it ran and succeeded."""
        code = self.code(step)
        output = self.output(step)
        assert code == "0", f"sid step {step}: expected exit 0, got {code}:\n{output[-6000:]}"
        return output

    def seconds(self, step: str) -> float:
        _, start, end = (self.out / f"{step}.rc").read_text().split()
        return float(end) - float(start)


@pytest.mark.skipif(
    not available() and not os.environ.get("CI"),
    reason=f"no Debian sid root at {SID_ROOT}: run .ci/setup-sid",
)
def test_bzlmod_in_bazel_7_builds_the_wheels_of_workspace_mode_offline(real_workspace: Workspace) -> None:
    assert available(), f"{SID_ROOT}: expected the sid root of .ci/setup-sid (CI makes it), found none"
    # Under the user's cache (bound into the root as a whole), so that the repository cache's hard links
    # stay on one mount; removed afterwards.
    scratch = CACHE / "bzlmod-test"
    remove_tree(scratch)
    scratch.mkdir(parents=True)
    try:
        fixture, fixture_cache = scratch / "fixture" / "ws", scratch / "fixture-cache"
        _fixture(fixture, fixture_cache)
        # Bazel 4.2.3 from WORKSPACE, on this host: the fixture, and the real wheel (the shared fixture).
        workspace_mode = Workspace(fixture, scratch / "fixture-base-4", fixture_cache, base_env())
        try:
            host_fixture = workspace_mode.bazel("build", "--symlink_prefix=/", TARGET)
            assert host_fixture.returncode == 0, host_fixture.output
            host_fixture_sha = _sha256(workspace_mode.bin_path(FIXTURE_WHEEL))
        finally:
            workspace_mode.shutdown()
        host_real = real_workspace.bazel("build", TARGET)
        assert host_real.returncode == 0, host_real.output
        host_real_sha = _sha256(real_workspace.bin_path(REAL_WHEEL))

        real = copy_checkout(REPO, scratch / "sparkseal")
        out = scratch / "out"
        out.mkdir()
        script = SID_SCRIPT.format(
            out=out,
            fixture=fixture,
            fixture_base=scratch / "fixture-base-7",
            fixture_cache=fixture_cache,
            real=real,
            real_base=scratch / "real-base-7",
            target=shlex.quote(TARGET),
        )
        result = run_in_sid(script, [CACHE], {}, timeout=2400)
        assert result.returncode == 0, f"sid script failed:\n{result.stdout}\n{result.stderr}"
        steps = Steps(out)

        # The fixture: the extension's tags give the repositories of FIXTURE_WORKSPACE, the same wheel.
        built = steps.ok("fixture_build")
        assert "use_repo" not in built, f"Bazel reports wrong imports of the sparkseal extension:\n{built}"
        fixture_wheel = Path(steps.ok("fixture_bin").strip().splitlines()[-1]) / FIXTURE_WHEEL
        with zipfile.ZipFile(fixture_wheel) as wheel:
            assert wheel.read("vllm/spec.py") == b"def mapping():\n    return -1\n"
            assert wheel.read("vllm/_downstream.py") == b"DOWNSTREAM = True\n"
        assert _sha256(fixture_wheel) == host_fixture_sha, (
            "fixture wheel: bzlmod/7.7.1 differs from WORKSPACE/4.2.3"
        )

        # A repository declared twice is refused, naming it.
        twice = steps.output("fixture_twice")
        assert steps.code("fixture_twice") != "0", twice
        assert (
            """sparkseal: the repository "vllm_lock" is declared twice in MODULE.bazel's sparkseal tags"""
            in twice
        )
        # An error names the lock as MODULE.bazel writes it, not in Bazel 7's canonical spelling
        # (`@@//third_party/...`, `@@_main~sparkseal~name`): rules/private/common.bzl's label_string.
        broken = steps.output("fixture_broken")
        assert steps.code("fixture_broken") != "0", broken
        assert (
            "sparkseal: //third_party/vllm:broken.lock.json: field `sdist`: expected an object, "
            "actual nothing" in broken
        ), broken

        # The repository itself, with no --config at all: what a new user of Bazel 7.7.1 runs.
        built = steps.ok("real_build")
        assert "use_repo" not in built, (
            f"MODULE.bazel's use_repo differs from the extension's repositories:\n{built}"
        )
        real_wheel = Path(steps.ok("real_bin").strip().splitlines()[-1]) / REAL_WHEEL
        assert _sha256(real_wheel) == host_real_sha, "vLLM wheel: bzlmod/7.7.1 differs from WORKSPACE/4.2.3"
        # The provenance records what the running Bazel says: Debian's 7.7.1 reports no release (""), its
        # Starlark tells >= 6.2, and no release is declared without the flag. cquery prints the value (a
        # list) among Bazel's INFO lines.
        release = [line for line in steps.ok("real_release").splitlines() if line.startswith("[[")]
        assert release == ['[["", ">= 6.2", ""]]'], (
            f"//rules:bazel_version under plain bzlmod: expected no reported release, >= 6.2 inferred and "
            f"none declared, got {release}"
        )
        # Every BUILD file loads; the hubs' labels name the extension's repositories (canonical labels, as
        # the main repository imports only the hubs), the installer that rules name themselves is imported.
        query = steps.ok("real_query")
        for label in (
            '"@@_main~sparkseal~python_deps_linux_aarch64_torch//file:file"',
            '"@@_main~sparkseal~vllm_sdist//file:file"',
            'installer = "@python_tools_any_installer//file:file"',
        ):
            assert label in query, f"query --output=build //...: expected {label}"
        # The lockfile Bazel writes is the committed one: resolution records nothing host-specific.
        assert (real / "MODULE.bazel.lock").read_bytes() == (REPO / "MODULE.bazel.lock").read_bytes()

        # The module graph resolves offline: every module not in Bazel or Debian is our stand-in.
        graph = steps.ok("mod_graph")
        assert "<root> (sparkseal@_)" in graph, graph
        for module in STAND_INS:
            assert re.search(rf"\b{module}@_\b", graph), (
                f"mod graph: expected {module}@_ (our override):\n{graph}"
            )
        assert "registry" not in graph.lower(), graph
        deps = steps.ok("mod_deps")
        assert "<root> (sparkseal@_)" in deps and "registry" not in deps.lower(), deps
        print(
            "bzlmod in the sid root: "
            + ", ".join(
                f"{s} {steps.seconds(s):.1f} s"
                for s in ("fixture_build", "real_build", "mod_graph", "mod_deps")
            )
            + f"; vLLM wheel sha256 {host_real_sha} in both modes"
        )
    finally:
        remove_tree(scratch)
