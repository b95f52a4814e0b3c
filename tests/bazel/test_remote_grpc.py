"""A shared gRPC (REAPI) remote cache: a second clone at another path runs no action itself.

BuildGrid serves CAS, ByteStream and an in-memory action cache on 127.0.0.1. Clone A builds with
``--config=remote-cache`` and uploads every action result; clone B, at another path with an empty output
base, must take every action from the cache and produce byte-identical outputs (it downloads only the
top-level outputs, the wheels).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bazel.test_bazel_fixture import WHEELS, Fixture, _artifacts, _workspace
from tests.bazel_util import BAZEL, REPO, Workspace, base_env, copy_checkout, remove_tree, spawned_processes
from tests.servers.buildgrid_server import (
    BuildGrid,
    buildgrid,
    discard_workspace,
    require_buildgrid,
)
from tests.servers.fixture_index import FixtureIndex

pytestmark = [
    pytest.mark.bazel,
    pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)"),
]

BUILD_TIMEOUT = 600  # seconds; a stuck remote call must fail the test, not hang CI
LOCK = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
REAL_WHEEL = f"third_party/vllm/wheel_linux_x86_64/{LOCK['wheels']['linux_x86_64']['filename']}"


@pytest.fixture(scope="module")
def cache_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuildGrid]:
    """A cache-only BuildGrid (CAS, ByteStream, action cache) for this module."""
    require_buildgrid()
    with buildgrid(tmp_path_factory.mktemp("buildgrid-cache")) as server:
        yield server


def _cache_flags(server: BuildGrid) -> list[str]:
    return [
        "--config=remote-cache",
        f"--remote_cache={server.url}",
        f"--remote_instance_name={server.instance}",
    ]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fixture_second_clone_takes_every_action_from_the_grpc_cache(
    cache_server: BuildGrid, tmp_path: Path
) -> None:
    artifacts = _artifacts(tmp_path)
    targets = [f"//third_party/vllm:wheel_{p}" for p in WHEELS]
    with FixtureIndex(artifacts) as index:
        first = Fixture(_workspace(tmp_path / "a" / "ws", tmp_path / "cache", index), index, artifacts)
        second = Fixture(
            _workspace(tmp_path / "b" / "deeper" / "ws", tmp_path / "cache", index), index, artifacts
        )
        try:
            first.configure()
            result = first.ws.bazel("build", *_cache_flags(cache_server), *targets, timeout=BUILD_TIMEOUT)
            code, output = result.returncode, result.output
            assert code == 0, output
            assert "WARNING: Writing to Remote Cache" not in output, output
            ran = spawned_processes(output)
            assert ran and set(ran) <= {"linux-sandbox", "processwrapper-sandbox", "local"}, output
            wheels = {p: f"third_party/vllm/wheel_{p}/{f}" for p, f in WHEELS.items()}
            digests = {p: _sha(first.ws.bin_path(rel)) for p, rel in wheels.items()}

            second.configure()
            flags = [*_cache_flags(cache_server), "--remote_download_toplevel"]
            result = second.ws.bazel("build", *flags, *targets, timeout=BUILD_TIMEOUT)
            code, output = result.returncode, result.output
            assert code == 0, output
            assert spawned_processes(output) == {"remote cache hit": sum(ran.values())}, output
            assert {p: _sha(second.ws.bin_path(rel)) for p, rel in wheels.items()} == digests
        finally:
            discard_workspace(first.ws)
            discard_workspace(second.ws)


@pytest.mark.network
def test_real_vllm_wheel_from_a_second_clone_is_all_grpc_cache_hits(
    cache_server: BuildGrid, real_workspace: Workspace, tmp_path: Path
) -> None:
    target = "//third_party/vllm:wheel_linux_x86_64"
    # B is copied from A, so both build the same sources even while the checkout changes.
    first_root = copy_checkout(REPO, tmp_path / "a" / "sparkseal")
    roots = [first_root, copy_checkout(first_root, tmp_path / "elsewhere" / "deeper" / "sparkseal")]
    clones = [
        Workspace(
            root=root,
            output_base=tmp_path / f"output-base-{n}",
            repository_cache=real_workspace.repository_cache,
            env=base_env(),
        )
        for n, root in enumerate(roots)
    ]
    try:
        first = clones[0].bazel("build", *_cache_flags(cache_server), target, timeout=BUILD_TIMEOUT)
        assert first.returncode == 0, first.output
        assert "WARNING: Writing to Remote Cache" not in first.output, first.output
        ran = spawned_processes(first.output)
        assert sum(ran.values()) >= 4, first.output  # unpack, one patch, overlay, repack
        digest = _sha(clones[0].bin_path(REAL_WHEEL))

        second = clones[1].bazel(
            "build", *_cache_flags(cache_server), "--remote_download_toplevel", target, timeout=BUILD_TIMEOUT
        )
        assert second.returncode == 0, second.output
        assert spawned_processes(second.output) == {"remote cache hit": sum(ran.values())}, second.output
        assert _sha(clones[1].bin_path(REAL_WHEEL)) == digest
    finally:
        for clone in clones:
            discard_workspace(clone)
            remove_tree(clone.root)
