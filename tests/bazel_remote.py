"""Shared by the remote-cache and hermeticity tests: clones, Bazel's process summary, execution logs."""

from __future__ import annotations

import json
import re
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.bazel.test_bazel_fixture import WHEELS, Fixture, _artifacts, _workspace
from tests.bazel_util import BASE_WORKSPACE, MINIMAL_WORKSPACE, REPO, Workspace, base_env, copy_checkout
from tests.servers.fixture_index import FixtureIndex

FIXTURE_TARGETS = tuple(f"//third_party/vllm:wheel_{platform}" for platform in WHEELS)


def executed_locally(summary: dict[str, int]) -> int:
    """How many processes of a summary ran on this machine (anything but cache hits and internal ones)."""
    return sum(
        n for kind, n in summary.items() if kind not in {"remote cache hit", "disk cache hit", "internal"}
    )


def clone_repo(dest: Path) -> Path:
    """Copy the repository's working tree to ``dest`` (no ``.git``, no ``bazel-*`` links) and return it."""
    return copy_checkout(REPO, dest)


def minimal_workspace(
    root: Path,
    build: str,
    files: dict[str, str] | None = None,
    copies: tuple[str, ...] = (),
    workspace_extra: str = "",
) -> Workspace:
    """A workspace with the repository's .bazelrc and platforms/, one BUILD file and ``files``.

    ``copies`` are more repository paths to copy (``rules``, ``sparkseal``); ``workspace_extra`` is
    appended to the WORKSPACE file. Its output base and repository cache lie beside ``root``; the user's
    repository cache is not touched.
    """
    # Every workspace registers the locked toolchains (rules/, unpacked by a helper in sparkseal/).
    for rel in dict.fromkeys(
        ("third_party/bazel", "third_party/toolchains", "platforms", "rules", "sparkseal", *copies)
    ):
        shutil.copytree(REPO / rel, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
    # Our rules need the secret scanner's repository; a workspace without them cannot load it.
    base = MINIMAL_WORKSPACE if "rules" in copies else BASE_WORKSPACE
    (root / "WORKSPACE").write_text(base + workspace_extra)
    (root / "BUILD").write_text(build)
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    rc = (REPO / ".bazelrc").read_text()
    (root / ".bazelrc").write_text(
        "\n".join(line for line in rc.splitlines() if "repository_cache" not in line)
    )
    return Workspace(
        root, root.parent / f"{root.name}-output-base", root.parent / f"{root.name}-cache", base_env()
    )


def real_clone(dest: Path, repository_cache: Path) -> Workspace:
    """A copy of the repository at ``dest``/sparkseal with its own output base beside it."""
    return Workspace(
        root=clone_repo(dest / "sparkseal"),
        output_base=dest / "output-base",
        repository_cache=repository_cache,
        env=base_env(),
    )


@dataclass
class FixtureSource:
    """The fake vLLM artifacts, the loopback index serving them and a repository cache for every clone."""

    index: FixtureIndex
    artifacts: dict[str, bytes]
    repository_cache: Path

    def clone(self, parent: Path) -> Fixture:
        """A configured fixture workspace at ``parent``/ws (output base ``parent``/ws-output-base)."""
        fixture = Fixture(
            _workspace(parent / "ws", self.repository_cache, self.index), self.index, self.artifacts
        )
        fixture.configure()
        return fixture


@contextmanager
def fixture_source(tmp: Path) -> Iterator[FixtureSource]:
    """Make the fixture artifacts under ``tmp`` and serve them while the block runs."""
    artifacts = _artifacts(tmp)
    with FixtureIndex(artifacts) as index:
        yield FixtureSource(index, artifacts, tmp / "repository-cache")


@contextmanager
def shut_down_after(*workspaces: Workspace) -> Iterator[None]:
    """Stop the workspaces' Bazel servers and delete their output bases when the block ends."""
    try:
        yield
    finally:
        for workspace in workspaces:
            workspace.shutdown()
            shutil.rmtree(workspace.output_base, ignore_errors=True)


def wheel_paths(workspace: Workspace) -> dict[str, Path]:
    """The fixture's vLLM wheels under ``workspace``'s bazel-bin, by platform."""
    return {p: workspace.bin_path(f"third_party/vllm/wheel_{p}/{name}") for p, name in WHEELS.items()}


def read_execution_log(path: Path) -> list[dict[str, object]]:
    """The spawns of a ``--execution_log_json_file`` (a stream of JSON objects, not one array)."""
    text = path.read_text()
    decoder = json.JSONDecoder()
    spawns, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return spawns
        spawn, pos = decoder.raw_decode(text, pos)
        spawns.append(spawn)


def spawn_table(spawns: list[dict[str, object]]) -> dict[tuple[str, ...], dict[str, object]]:
    """Spawns keyed by their declared outputs: mnemonic, argv, environment and input/output digests."""
    table: dict[tuple[str, ...], dict[str, object]] = {}
    for spawn in spawns:
        key = tuple(sorted(str(path) for path in spawn.get("listedOutputs", [])))
        table[key] = {
            "mnemonic": spawn.get("mnemonic"),
            "argv": spawn.get("commandArgs", []),
            "env": {e["name"]: e["value"] for e in spawn.get("environmentVariables", [])},
            "inputs": {i["path"]: i.get("digest", {}).get("hash") for i in spawn.get("inputs", [])},
            "outputs": {o["path"]: o.get("digest", {}).get("hash") for o in spawn.get("actualOutputs", [])},
        }
    return table


def spawn_differences(
    first: dict[tuple[str, ...], dict[str, object]], second: dict[tuple[str, ...], dict[str, object]]
) -> list[str]:
    """What differs between two spawn tables, one line per action and field (empty: identical)."""
    lines = [f"action {key} only in the first log" for key in first.keys() - second.keys()]
    lines += [f"action {key} only in the second log" for key in second.keys() - first.keys()]
    for key in sorted(first.keys() & second.keys()):
        for field, expected in first[key].items():
            actual = second[key][field]
            if isinstance(expected, dict) and isinstance(actual, dict):
                changed = sorted(
                    p for p in expected.keys() | actual.keys() if expected.get(p) != actual.get(p)
                )
                if changed:
                    lines.append(f"action {key} {field}: differ at {changed[:5]}")
            elif expected != actual:
                lines.append(f"action {key} {field}: expected {expected}, actual {actual}")
    return lines


def _whole(value: str) -> re.Pattern[str]:
    """``value`` as a whole path or word: ``/root`` is in ``/root/x``, not in ``a/root`` or ``/rootfs``."""
    return re.compile(rf"(?<![\w.-]){re.escape(value)}(?![\w.-])")


def _client_values(workspace: Workspace) -> dict[str, re.Pattern[str]]:
    """What must never reach an action: the client's paths and host name."""
    return {
        "workspace path": _whole(str(workspace.root)),
        "output base": _whole(str(workspace.output_base)),
        "$HOME": _whole(str(Path.home())),
        "host name": _whole(socket.gethostname()),
    }


def client_value_leaks(spawns: list[dict[str, object]], workspace: Workspace) -> list[str]:
    """Every argv word or ``NAME=value`` of the spawns that holds one of the client's paths or host name."""
    found = []
    for spawn in spawns:
        env = [f"{e['name']}={e['value']}" for e in spawn.get("environmentVariables", [])]
        for where, values in (("argv", spawn.get("commandArgs", [])), ("env", env)):
            for value in values:
                for what, pattern in _client_values(workspace).items():
                    if pattern.search(str(value)):
                        found.append(f"{spawn.get('mnemonic')} {where} holds the {what}: {value}")
    return found


# Absolute paths an action may name without reading the host's files: devices and its own process.
NOT_HOST_READS = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/proc/self/")
# Inputs whose text the action reads as more arguments: Bazel's param files (one argument a line, the
# "multiline" format) and the locked compilers' toolchain.json (paths in the repository).
_ARGUMENT_FILES = (".params", "/toolchain.json")


def _absolute_paths(text: str) -> list[str]:
    """The absolute paths in one argument or value: whole, after ``NAME=`` or ``--flag=``, glued to an
    option (``-I/usr/include``), or in a ``:``/``,``-separated list (``PATH``)."""
    found = []
    for part in re.split(r"[\s=:,;\"']+", text):
        part = re.sub(r"^-[\w-]*?(?=/)", "", part)
        if part.startswith("/") and not part.startswith(NOT_HOST_READS):  # "/" alone: the host's root
            found.append(part)
    return found


def _json_strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _json_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _json_strings(item)


def host_reads(spawn: dict[str, object], execroot: Path | None = None) -> list[str]:
    """What one spawn of an execution log would read from the host rather than from its inputs.

    Bazel lists an action's inputs relative to the execution root, so an input list alone never shows a
    host path; what does is the command: an absolute path in its arguments, its environment (a ``PATH``
    of host directories), or, with ``execroot`` to read them from, its toolchain.json and its param files
    (where Bazel left them there: Bazel 7 writes a sandboxed action's param files into its sandbox only).
    Each is returned as ``WHERE: PATH``; an input outside the execution root is too.
    """
    found: list[str] = []
    inputs = [str(i["path"]) for i in spawn.get("inputs", [])]  # type: ignore[attr-defined,index]
    found += [f"input: {path}" for path in inputs if path.startswith(("/", "../"))]
    for word in spawn.get("commandArgs", []):  # type: ignore[attr-defined]
        found += [f"argument {word}: {path}" for path in _absolute_paths(str(word))]
    for variable in spawn.get("environmentVariables", []):  # type: ignore[attr-defined]
        name, value = variable["name"], str(variable["value"])  # type: ignore[index]
        found += [f"environment {name}: {path}" for path in _absolute_paths(value)]
    if execroot is not None:
        for path in inputs:
            if not path.endswith(_ARGUMENT_FILES) or (
                path.endswith(".params") and not (execroot / path).is_file()
            ):
                continue
            text = (execroot / path).read_text()
            words = _json_strings(json.loads(text)) if path.endswith(".json") else text.splitlines()
            found += [f"{path}: {p}" for word in words for p in _absolute_paths(word)]
    return found
