"""Hermeticity: two clones run the same actions, none sees the client's paths, none reaches the network.

The real vLLM wheel gets the same execution-log comparison in test_remote_http_cache.py, where its two clones
are built anyway.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bazel_remote import (
    FIXTURE_TARGETS,
    FixtureSource,
    client_value_leaks,
    fixture_source,
    minimal_workspace,
    read_execution_log,
    shut_down_after,
    spawn_differences,
    spawn_table,
)
from tests.bazel_util import BAZEL, Workspace

pytestmark = [
    pytest.mark.bazel,
    pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)"),
]

PROBE = """\
import socket
import sys

address = ("127.0.0.1", int(sys.argv[1]))
try:
    socket.create_connection(address, timeout=5).close()
except OSError as error:
    sys.exit(f"probe: cannot connect to 127.0.0.1:{address[1]}: {error}")
print("probe: connected")
"""
PROBE_BUILD = """\
genrule(
    name = "probe",
    srcs = ["probe.py"],
    outs = ["probe.txt"],
    cmd = "python3 $(location probe.py) {port} > $@",
)
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureSource]:
    with fixture_source(tmp_path_factory.mktemp("hermeticity-artifacts")) as src:
        yield src


def _logged_build(workspace: Workspace, log: Path) -> list[dict[str, object]]:
    # Nothing under $HOME is visible to the actions: no user site-packages, pip or tool configuration.
    result = workspace.bazel(
        "build", f"--sandbox_block_path={Path.home()}", f"--execution_log_json_file={log}", *FIXTURE_TARGETS
    )
    assert result.returncode == 0, result.output
    spawns = read_execution_log(log)
    assert spawns, f"{log}: expected the spawns of the build, found none"
    return spawns


def test_two_clones_run_identical_actions_without_client_paths(source: FixtureSource, tmp_path: Path) -> None:
    first = source.clone(tmp_path / "a")
    second = source.clone(tmp_path / "elsewhere" / "b")
    with shut_down_after(first.ws, second.ws):
        one = _logged_build(first.ws, tmp_path / "a.json")
        two = _logged_build(second.ws, tmp_path / "b.json")
    table = spawn_table(one)
    assert len(table) == len(one), "two spawns declared the same outputs"
    mnemonics = {entry["mnemonic"] for entry in table.values()}
    assert {"VllmUnpack", "VllmPatch", "VllmOverlay", "VllmRepack"} <= mnemonics, mnemonics
    assert all(entry["outputs"] for entry in table.values()), table
    assert spawn_differences(table, spawn_table(two)) == []
    assert client_value_leaks(one, first.ws) == []
    assert client_value_leaks(two, second.ws) == []


def test_leak_check_sees_a_client_path() -> None:
    """The check itself finds each client value as a whole path or word, and nothing inside other words."""
    workspace = Workspace(Path("/srv/ws"), Path("/srv/ob"), Path("/srv/rc"), {})
    host = socket.gethostname()
    spawns: list[dict[str, object]] = [
        {"mnemonic": "A", "commandArgs": ["tool", "--out=/srv/ob/execroot/x"]},
        {"mnemonic": "B", "environmentVariables": [{"name": "CACHE", "value": f"{Path.home()}/.cache"}]},
        {"mnemonic": "C", "commandArgs": ["--builder", host], "environmentVariables": []},
        {"mnemonic": "D", "environmentVariables": [{"name": "SRC", "value": "/srv/ws/patches"}]},
        {
            "mnemonic": "E",
            "commandArgs": [f"{host}x", f"external/x{Path.home()}", f"{Path.home()}fs", "/srv/wsx"],
        },
    ]
    assert client_value_leaks(spawns, workspace) == [
        "A argv holds the output base: --out=/srv/ob/execroot/x",
        f"B env holds the $HOME: CACHE={Path.home()}/.cache",
        f"C argv holds the host name: {host}",
        "D env holds the workspace path: SRC=/srv/ws/patches",
    ]


class _Listener:
    """A loopback TCP listener that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[_Listener]:
    server = _Listener()
    yield server
    server.close()


def test_action_cannot_reach_a_server_the_host_can(listener: _Listener, tmp_path: Path) -> None:
    workspace = minimal_workspace(
        tmp_path / "ws", PROBE_BUILD.format(port=listener.port), {"probe.py": PROBE}
    )
    outside = subprocess.run(
        [sys.executable, str(workspace.root / "probe.py"), str(listener.port)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert outside.returncode == 0, outside.stderr
    assert outside.stdout == "probe: connected\n"
    assert listener.accepted == 1

    with shut_down_after(workspace):
        blocked = workspace.bazel("build", "//:probe")
        assert blocked.returncode != 0, blocked.output
        assert f"probe: cannot connect to 127.0.0.1:{listener.port}: [Errno 111] Connection refused" in (
            blocked.output
        )
        assert "Executing genrule //:probe failed" in blocked.output
        assert listener.accepted == 1

        # With the sandbox's network allowed the same action reaches the server: .bazelrc's setting blocks it.
        allowed = workspace.bazel("build", "--sandbox_default_allow_network=true", "//:probe")
        assert allowed.returncode == 0, allowed.output
        assert listener.accepted == 2
        out = workspace.bin_path("probe.txt")
        assert out.read_text() == "probe: connected\n"


def test_blocked_home_is_invisible_to_actions(tmp_path: Path) -> None:
    """The control for ``--sandbox_block_path`` above: an action sees $HOME's files only when not blocked."""
    home = Path.home()
    command = f"ls -A {home} > $@; test -s $@ || {{ echo {home} looks empty >&2; exit 1; }}"
    workspace = minimal_workspace(
        tmp_path / "ws", f'genrule(name = "home", outs = ["home.txt"], cmd = "{command}")\n'
    )
    with shut_down_after(workspace):
        blocked = workspace.bazel("build", f"--sandbox_block_path={home}", "//:home")
        assert blocked.returncode != 0, blocked.output
        assert f"{home} looks empty" in blocked.output
        seen = workspace.bazel("build", "//:home")
        assert seen.returncode == 0, seen.output
        names = workspace.bin_path("home.txt").read_text().split()
        assert names, f"{home}: expected the action to list its entries, got none"
        assert all((home / name).exists() for name in names), names
