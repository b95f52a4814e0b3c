"""A shared HTTP remote cache (nginx WebDAV): a second clone executes nothing; a corrupt blob never ships."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bazel_remote import (
    FIXTURE_TARGETS,
    FixtureSource,
    client_value_leaks,
    executed_locally,
    fixture_source,
    read_execution_log,
    real_clone,
    shut_down_after,
    spawn_differences,
    spawn_table,
    wheel_paths,
)
from tests.bazel_util import BAZEL, REPO, Workspace, process_summary
from tests.servers.nginx_cache import NGINX, NginxCache

pytestmark = [
    pytest.mark.bazel,
    pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)"),
    pytest.mark.skipif(not Path(NGINX).exists(), reason=f"{NGINX} is missing (.ci/setup installs nginx)"),
]

REAL_PLATFORM = "linux_x86_64"
REAL_TARGET = f"//third_party/vllm:wheel_{REAL_PLATFORM}"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureSource]:
    with fixture_source(tmp_path_factory.mktemp("http-cache-artifacts")) as src:
        yield src


@pytest.fixture
def cache() -> Iterator[NginxCache]:
    with NginxCache() as server:
        yield server


def _build(workspace: Workspace, cache: NginxCache, *args: str) -> dict[str, int]:
    """Build with the read-write cache; every upload and download must succeed."""
    result = workspace.bazel("build", "--config=remote-cache", f"--remote_cache={cache.url}", *args)
    assert result.returncode == 0, result.output
    assert "Remote Cache:" not in result.output, result.output
    return process_summary(result.output)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _puts(cache: NginxCache) -> int:
    return sum(line.startswith("PUT ") for line in cache.access_log())


def test_second_clone_takes_every_action_from_the_cache(
    source: FixtureSource, cache: NginxCache, tmp_path: Path
) -> None:
    first = source.clone(tmp_path / "a")
    second = source.clone(tmp_path / "elsewhere" / "b")
    with shut_down_after(first.ws, second.ws):
        summary = _build(first.ws, cache, *FIXTURE_TARGETS)
        executed = executed_locally(summary)
        assert executed > 0, summary
        assert "remote cache hit" not in summary, summary
        # One action result per executed action, every output blob under cas/.
        assert len(list((cache.root / "ac").iterdir())) == executed
        wheels = {p: _sha256(path) for p, path in wheel_paths(first.ws).items()}
        assert set(wheels.values()) <= {blob.name for blob in (cache.root / "cas").iterdir()}
        puts = _puts(cache)

        summary = _build(second.ws, cache, *FIXTURE_TARGETS)
        assert summary.get("remote cache hit") == executed, summary
        assert executed_locally(summary) == 0, summary
        assert _puts(cache) == puts, cache.access_log()
        assert {p: _sha256(path) for p, path in wheel_paths(second.ws).items()} == wheels


def test_corrupt_cache_blob_is_rejected_and_rebuilt_locally(
    source: FixtureSource, cache: NginxCache, tmp_path: Path
) -> None:
    """Bazel checks every downloaded blob against its digest; on a mismatch it warns and runs the action.

    Read-only clients leave the bad blob in place; read-write ones upload the good bytes over it.
    """
    writer = source.clone(tmp_path / "a")
    reader = source.clone(tmp_path / "b")
    healer = source.clone(tmp_path / "c")
    with shut_down_after(writer.ws, reader.ws, healer.ws):
        executed = executed_locally(_build(writer.ws, cache, *FIXTURE_TARGETS))
        wheel = wheel_paths(writer.ws)["linux_x86_64"]
        good, size = _sha256(wheel), wheel.stat().st_size
        blob = cache.root / "cas" / good
        data = bytearray(blob.read_bytes())
        data[size // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        bad = hashlib.sha256(data).hexdigest()
        warning = (
            f"download failed: Expected digest '{good}/{size}' does not match received digest '{bad}/{size}'"
        )

        puts = _puts(cache)
        result = reader.ws.bazel(
            "build", "--config=remote-cache-ro", f"--remote_cache={cache.url}", *FIXTURE_TARGETS
        )
        assert result.returncode == 0, result.output
        assert warning in result.output
        summary = process_summary(result.output)
        assert summary.get("linux-sandbox") == 1, summary
        assert summary.get("remote cache hit") == executed - 1, summary
        assert _sha256(wheel_paths(reader.ws)["linux_x86_64"]) == good
        assert _sha256(blob) == bad
        assert _puts(cache) == puts, cache.access_log()

        result = healer.ws.bazel(
            "build", "--config=remote-cache", f"--remote_cache={cache.url}", *FIXTURE_TARGETS
        )
        assert result.returncode == 0, result.output
        assert warning in result.output
        assert process_summary(result.output).get("linux-sandbox") == 1, result.output
        assert _sha256(wheel_paths(healer.ws)["linux_x86_64"]) == good
        assert _sha256(blob) == good, f"{blob}: expected the re-uploaded sha256 {good}"


def test_read_only_server_refuses_uploads_and_the_build_still_passes(
    source: FixtureSource, cache: NginxCache, tmp_path: Path
) -> None:
    """A fork's client that still tries to write (--config=remote-cache) is stopped by the server."""
    fork = source.clone(tmp_path / "fork")
    with shut_down_after(fork.ws):
        result = fork.ws.bazel(
            "build", "--config=remote-cache", f"--remote_cache={cache.read_only_url}", *FIXTURE_TARGETS
        )
    assert result.returncode == 0, result.output
    assert "WARNING: Writing to Remote Cache:" in result.output
    assert executed_locally(process_summary(result.output)) > 0, result.output
    assert _puts(cache) > 0, cache.access_log()
    assert list(cache.root.iterdir()) == [], f"{cache.root}: expected no uploads behind the read-only server"


@pytest.mark.network
def test_real_vllm_wheel_from_another_clone_is_all_cache_hits(tmp_path: Path) -> None:
    """The real patched wheel: downloads come from the shared repository cache, actions from nginx.

    Both execution logs list the same actions with the same input and output digests, and no action's
    argv or environment holds either clone's paths, $HOME or the host name.
    """
    repository_cache = Path.home() / ".cache" / "sparkseal" / "repository"
    lock = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
    wheel = f"third_party/vllm/wheel_{REAL_PLATFORM}/{lock['wheels'][REAL_PLATFORM]['filename']}"
    first = real_clone(tmp_path / "a", repository_cache)
    second = real_clone(tmp_path / "elsewhere" / "b", repository_cache)
    logs = (tmp_path / "a.json", tmp_path / "b.json")
    with NginxCache() as cache, shut_down_after(first, second):
        summary = _build(first, cache, f"--execution_log_json_file={logs[0]}", REAL_TARGET)
        executed = executed_locally(summary)
        assert executed > 0, summary
        digest = _sha256(first.bin_path(wheel))
        summary = _build(second, cache, f"--execution_log_json_file={logs[1]}", REAL_TARGET)
        assert summary.get("remote cache hit") == executed, summary
        assert executed_locally(summary) == 0, summary
        assert _sha256(second.bin_path(wheel)) == digest
    spawns = [read_execution_log(log) for log in logs]
    assert len(spawns[0]) == executed, spawns[0]
    assert spawn_differences(spawn_table(spawns[0]), spawn_table(spawns[1])) == []
    assert client_value_leaks(spawns[0], first) == []
    assert client_value_leaks(spawns[1], second) == []
