"""Remote execution: ``--config=rbe`` runs every action on REAPI workers, with the local build's outputs.

BuildGrid's execution service (SQL scheduler on a private PostgreSQL cluster) hands actions to two test
bots (``tests/servers/reapi_bot.py``) that run them on this machine. Bazel must report the actions as
``remote``, the bots must see the execution platform's properties, and the wheels must equal a local build's.
Every build is bounded by a timeout: with no live worker Bazel would wait forever.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bazel.test_bazel_fixture import GOOD_PATCH, WHEELS, Fixture, _artifacts, _workspace
from tests.bazel_util import BAZEL, REPO, Workspace, base_env, copy_checkout, remove_tree, spawned_processes
from tests.servers.buildgrid_server import (
    BuildGrid,
    bots,
    buildgrid,
    discard_workspace,
    postgres,
    require_buildgrid,
)
from tests.servers.fixture_index import FixtureIndex

pytestmark = [
    pytest.mark.bazel,
    pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)"),
]

BUILD_TIMEOUT = 600  # seconds
BOTS = 2
PLATFORM = "ISA=x86-64,OSFamily=linux"  # //platforms:rbe_linux_x86_64's exec_properties, as Bazel sends them
LOCK = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
REAL_WHEEL = f"third_party/vllm/wheel_linux_x86_64/{LOCK['wheels']['linux_x86_64']['filename']}"
FIXTURE_TARGETS = [f"//third_party/vllm:wheel_{p}" for p in WHEELS]
FIXTURE_WHEELS = {p: f"third_party/vllm/wheel_{p}/{f}" for p, f in WHEELS.items()}


@dataclass
class Executor:
    """A BuildGrid execution service and the logs of its bots."""

    server: BuildGrid
    bot_logs: list[Path]

    def flags(self) -> list[str]:
        """Bazel flags that send every action to this service."""
        return [
            "--config=rbe",
            f"--remote_executor={self.server.url}",
            f"--remote_instance_name={self.server.instance}",
            # One channel: about 100 requests in flight instead of Bazel's default of about 10,000. The
            # kernels action has some 12,000 inputs, and a single-process test server answered some of
            # the uploads of that many concurrent streams with CANCELLED, which Bazel does not retry.
            "--remote_max_connections=1",
        ]

    def _lease_lines(self) -> list[list[str]]:
        logs = [log.read_text().splitlines() for log in self.bot_logs]
        return [[line for line in lines if " platform " in line] for lines in logs]

    def mark(self) -> list[int]:
        """How many actions each bot has started so far (for :meth:`leases_since`)."""
        return [len(lines) for lines in self._lease_lines()]

    def leases_since(self, mark: list[int]) -> list[str]:
        """One line per action the bots started after ``mark``: counted per bot, because the bots' logs
        grow independently and a slice of their concatenation would pick up one bot's old lines."""
        per_bot = zip(self._lease_lines(), mark, strict=True)
        return [line for lines, start in per_bot for line in lines[start:]]


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Executor]:
    """PostgreSQL, BuildGrid with execution, and two bots, for this module."""
    require_buildgrid()
    tmp = tmp_path_factory.mktemp("buildgrid-execution")
    with (
        postgres() as database,
        buildgrid(tmp / "server", database=database) as server,
        bots(server, tmp / "bots", count=BOTS) as logs,
    ):
        yield Executor(server, logs)


@dataclass
class FixturePair:
    """Two fixture workspaces on one loopback index: one builds locally, one remotely."""

    local: Fixture
    remote: Fixture


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixturePair]:
    """A local and a remote fixture workspace (the remote one also has //platforms)."""
    tmp = tmp_path_factory.mktemp("rbe-fixture")
    artifacts = _artifacts(tmp)
    with FixtureIndex(artifacts) as index:
        local = Fixture(_workspace(tmp / "local" / "ws", tmp / "cache", index), index, artifacts)
        remote = Fixture(_workspace(tmp / "remote" / "ws", tmp / "cache", index), index, artifacts)
        try:
            yield FixturePair(local, remote)
        finally:
            discard_workspace(local.ws)
            discard_workspace(remote.ws)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fixture_wheels_built_by_remote_workers_equal_the_local_build(
    executor: Executor, fixtures: FixturePair
) -> None:
    fixtures.local.configure()
    code, output = fixtures.local.build(*FIXTURE_TARGETS)
    assert code == 0, output
    local_actions = sum(spawned_processes(output).values())
    assert local_actions > 0, output
    local = {p: _sha(fixtures.local.ws.bin_path(rel)) for p, rel in FIXTURE_WHEELS.items()}

    fixtures.remote.configure()
    before = executor.mark()
    result = fixtures.remote.ws.bazel("build", *executor.flags(), *FIXTURE_TARGETS, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, result.output
    assert spawned_processes(result.output) == {"remote": local_actions}, result.output
    leases = executor.leases_since(before)
    assert len(leases) == local_actions, "\n".join(leases)
    for line in leases:
        assert re.search(rf": lease \S+ platform {PLATFORM} program \S+$", line), line
    remote = {p: _sha(fixtures.remote.ws.bin_path(rel)) for p, rel in FIXTURE_WHEELS.items()}
    assert remote == local


def test_a_failing_remote_action_reports_its_error(executor: Executor, fixtures: FixturePair) -> None:
    bad = GOOD_PATCH.replace(" def mapping():", " def mapping(x):")
    fixtures.remote.configure(patches={"0001-bad.patch": bad})
    result = fixtures.remote.ws.bazel(
        "build", *executor.flags(), "//third_party/vllm:patched_tree", timeout=BUILD_TIMEOUT
    )
    assert result.returncode != 0, result.output
    assert "0001-bad.patch" in result.output
    assert "does not apply at line 1" in result.output
    assert re.search(r"\d+ remote", result.output), result.output


@pytest.fixture(scope="module")
def clone(real_workspace: Workspace, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    """A copy of the checkout elsewhere, with its own output base: the real targets' remote builds.

    One for the module's real builds (the vLLM wheel, the kernels wheel): each is a build from another
    path than the local one, which is all these tests need of it, and the second need not start a Bazel
    server, load the repository and set up its toolchain repositories again.
    """
    tmp = tmp_path_factory.mktemp("rbe-clone")
    root = copy_checkout(REPO, tmp / "elsewhere" / "sparkseal")
    workspace = Workspace(
        root=root,
        output_base=tmp / "output-base",
        repository_cache=real_workspace.repository_cache,
        env=base_env(),
        # Alive from one test's remote build to the next, which first builds locally; stopped below.
        max_idle_secs=900,
    )
    try:
        yield workspace
    finally:
        discard_workspace(workspace)
        remove_tree(root)


def _remote_clone_build(
    executor: Executor, real_workspace: Workspace, clone: Workspace, target: str, output: str
) -> tuple[str, str, list[str], dict[str, int]]:
    """Build ``target`` here and, in ``clone`` (a copy of the checkout elsewhere), on the executor's
    workers; return both sha256s of ``output``, the leases the build took and its process summary."""
    local = real_workspace.bazel("build", target)
    assert local.returncode == 0, local.output
    expected = _sha(real_workspace.bin_path(output))
    before = executor.mark()
    result = clone.bazel("build", *executor.flags(), "--verbose_failures", target, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, result.output
    return (
        expected,
        _sha(clone.bin_path(output)),
        executor.leases_since(before),
        spawned_processes(result.output),
    )


@pytest.mark.network
def test_real_vllm_wheel_built_by_remote_workers_equals_the_local_build(
    executor: Executor, real_workspace: Workspace, clone: Workspace
) -> None:
    expected, remote, leases, ran = _remote_clone_build(
        executor, real_workspace, clone, "//third_party/vllm:wheel_linux_x86_64", REAL_WHEEL
    )
    assert set(ran) == {"remote"} and ran["remote"] >= 4, ran  # unpack, patch, overlay, repack
    assert len(leases) == ran["remote"]
    assert remote == expected


KERNELS = "//kernels_sm121:wheel_linux_aarch64"
KERNELS_WHEEL = "kernels_sm121/wheel_linux_aarch64/sparkseal-0.1.0-py3-none-linux_aarch64.whl"


@pytest.mark.network
def test_kernels_wheel_built_by_a_remote_worker_equals_the_local_build(
    executor: Executor, real_workspace: Workspace, clone: Workspace
) -> None:
    """The kernels action declares its compilers (the locked g++ and sysroot), nvcc and cmake as inputs,
    so a worker with no compiler of its own builds the GB10 wheel, byte for byte the local one."""
    expected, remote, leases, ran = _remote_clone_build(
        executor, real_workspace, clone, KERNELS, KERNELS_WHEEL
    )
    assert set(ran) == {"remote"}, ran
    assert any("kernels_wheel" in line for line in leases), "\n".join(leases)
    assert remote == expected
