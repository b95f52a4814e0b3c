"""The `host_wheel` repository rule's failures: a lock without this build host's wheel, a wheel without the
package the rule names. Each fails the fetch with a message naming the lock or the wheel and what was
expected; offline, from a repository cache filled by the test.
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bazel_util import BASE_WORKSPACE, BAZEL, Workspace, base_env, make_fixture_workspace
from tests.fixture_wheels import make_wheel, sha256_of

pytestmark = pytest.mark.bazel

HOST = {"x86_64": "linux_x86_64", "aarch64": "linux_aarch64"}[platform.machine()]
OTHER = {"linux_x86_64": "linux_aarch64", "linux_aarch64": "linux_x86_64"}[HOST]

WORKSPACE = (
    BASE_WORKSPACE
    + """
load("//rules:defs.bzl", "host_wheel")

host_wheel(name = "no_host", lock = "//locks:no_host.json", module = "zstandard")

host_wheel(name = "no_package", lock = "//locks:no_package.json", module = "zstandard")

host_wheel(name = "good", lock = "//locks:good.json", module = "zstandard")
"""
)


def _lock(files: dict[str, dict[str, str]]) -> str:
    return json.dumps({"format": 1, "wheels": {"zstandard": {"version": "0.25.0", "files": files}}}, indent=2)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Workspace, dict[str, Path]]]:
    if BAZEL is None:
        pytest.skip("bazel is not installed (make setup installs it)")
    base = tmp_path_factory.mktemp("host-wheel")
    root = base / "ws"
    make_fixture_workspace(root, WORKSPACE)
    cache = base / "repository-cache"
    for directory in ("w1", "w2"):
        (base / directory).mkdir()
    wheels = {
        # Another package under the locked project's name: what a wrong pin would fetch.
        "no_package": make_wheel(base / "w1", "zstandard", "0.25.0", files={"other/__init__.py": b"X = 1\n"}),
        "good": make_wheel(base / "w2", "zstandard", "0.25.0", files={"zstandard/__init__.py": b"X = 1\n"}),
    }
    for wheel in wheels.values():
        cached = cache / "content_addressable" / "sha256" / sha256_of(wheel) / "file"
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_bytes(wheel.read_bytes())
    locks = root / "locks"
    locks.mkdir()
    (locks / "BUILD").write_text('exports_files(glob(["*.json"]))\n')
    entry = {name: {"filename": w.name, "sha256": sha256_of(w)} for name, w in wheels.items()}
    (locks / "no_host.json").write_text(_lock({OTHER: entry["good"]}))
    (locks / "no_package.json").write_text(_lock({HOST: entry["no_package"]}))
    (locks / "good.json").write_text(_lock({HOST: entry["good"]}))
    workspace = Workspace(root, base / "output-base", cache, base_env())
    yield workspace, wheels
    workspace.shutdown()


def _fetch_fails(workspace: Workspace, repository: str) -> str:
    result = workspace.bazel("build", f"@{repository}//:site")
    assert result.returncode != 0, result.output
    return result.output


def test_a_lock_without_this_hosts_wheel_names_the_lock_and_the_missing_field(
    ws: tuple[Workspace, dict[str, Path]],
) -> None:
    output = _fetch_fails(ws[0], "no_host")
    assert re.search(
        rf"sparkseal: (@)?//locks:no_host\.json: field `wheels\.zstandard\.files\.{HOST}`: "
        r"expected an object, actual nothing",
        output,
    ), output


def test_a_wheel_without_the_package_names_the_wheel_and_the_expected_file(
    ws: tuple[Workspace, dict[str, Path]],
) -> None:
    workspace, wheels = ws
    output = _fetch_fails(workspace, "no_package")
    expected = (
        f'sparkseal: host_wheel no_package: {wheels["no_package"].name} holds no package "zstandard" '
        "(expected site/zstandard/__init__.py)"
    )
    assert expected in output, output
    # The same rule with a wheel that holds the package fetches it, offline, from the same cache.
    good = workspace.bazel("build", "@good//:site")
    assert good.returncode == 0, good.output
    external = workspace.output_base / "external" / "good"
    assert (external / "site" / "zstandard" / "__init__.py").read_bytes() == b"X = 1\n"
    assert f"# zstandard 0.25.0 for {HOST} ({wheels['good'].name})" in (external / "BUILD").read_text()
