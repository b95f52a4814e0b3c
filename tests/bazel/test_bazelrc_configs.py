"""Remote execution settings: each rbe config offers only its own workers; host-tool actions stay local."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import pytest

from tests.bazel_remote import minimal_workspace, shut_down_after
from tests.bazel_util import BAZEL
from tests.toolchain_cache import seed_repository_cache

pytestmark = [
    pytest.mark.bazel,
    pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)"),
]

BUILD = """\
genrule(
    name = "on_x86_64",
    outs = ["x86_64.txt"],
    cmd = "true > $@",
    exec_compatible_with = ["@platforms//cpu:x86_64"],
)

genrule(
    name = "on_aarch64",
    outs = ["aarch64.txt"],
    cmd = "true > $@",
    exec_compatible_with = ["@platforms//cpu:aarch64"],
)
"""


def test_each_rbe_config_offers_only_its_own_workers(tmp_path: Path) -> None:
    workspace = minimal_workspace(tmp_path / "ws", BUILD)
    outcomes = {}
    with shut_down_after(workspace):
        for config in ("rbe", "rbe-arm64"):
            for target in ("on_x86_64", "on_aarch64"):
                result = workspace.bazel("aquery", f"--config={config}", f"//:{target}")
                outcomes[config, target] = result.returncode == 0
                if not outcomes[config, target]:
                    arch = "aarch64" if config == "rbe-arm64" else "x86_64"
                    assert (
                        "Unable to find an execution platform for target platform "
                        f"//platforms:rbe_linux_{arch}" in result.output
                    ), result.output
    assert outcomes == {
        ("rbe", "on_x86_64"): True,
        ("rbe", "on_aarch64"): False,
        ("rbe-arm64", "on_x86_64"): False,
        ("rbe-arm64", "on_aarch64"): True,
    }


KERNELS_BUILD = """\
load("//rules/private:kernels_wheel.bzl", "cuda_archs_setting", "kernels_wheel")

cuda_archs_setting(name = "cuda_archs", build_setting_default = "")

kernels_wheel(
    name = "wheel",
    cuda_archs = ["90a-real"],
    platform = "linux_x86_64",
    version = "0",
)
"""
# A stand-in for @sparkseal_cuda: the rule only needs its labels to analyse.
FAKE_CUDA_BUILD = """\
package(default_visibility = ["//visibility:public"])

exports_files(["cuda_root", "cmake", "ninja", "python_root"])

[filegroup(name = name, srcs = []) for name in ["cuda", "cmake_files", "python"]]
"""


def test_kernels_wheel_action_may_run_remotely(tmp_path: Path) -> None:
    """The kernels action declares its compiler and interpreter as inputs, so it carries no
    no-remote-exec (only its network block): a remote worker needs no compiler of its own."""
    fake_cuda = tmp_path / "fake_cuda"
    fake_cuda.mkdir()
    (fake_cuda / "WORKSPACE").write_text('workspace(name = "sparkseal_cuda")\n')
    (fake_cuda / "BUILD").write_text(FAKE_CUDA_BUILD)
    for name in ("cuda_root", "cmake", "ninja", "python_root"):
        (fake_cuda / name).write_text("")
    workspace = minimal_workspace(
        tmp_path / "ws",
        "",
        files={"kernels_sm121/BUILD": KERNELS_BUILD},
        copies=("rules", "sparkseal"),
        workspace_extra=(f'local_repository(name = "sparkseal_cuda", path = "{fake_cuda}")\n'),
    )
    seed_repository_cache(workspace.repository_cache, ("cc",))
    with shut_down_after(workspace):
        result = workspace.bazel(
            "aquery", "--output=jsonproto", "mnemonic(KernelsWheel, //kernels_sm121:wheel)"
        )
        text = workspace.bazel("aquery", "--output=text", "mnemonic(KernelsWheel, //kernels_sm121:wheel)")
    assert result.returncode == 0, result.output
    graph = json.loads(result.output[result.output.index("{") : result.output.rindex("}") + 1])
    [action] = graph["actions"]
    info = {entry["key"]: entry.get("value", "") for entry in action["executionInfo"]}
    assert info == {"block-network": "1"}, f"rules/private/kernels_wheel.bzl: {info}"
    arch = platform.machine()
    inputs = re.search(r"^\s*Inputs: \[(.*)\]$", text.output, re.MULTILINE)
    assert inputs, text.output
    for tool in (
        f"external/sparkseal_cc_linux_{arch}/root/usr/bin/{arch}-linux-gnu-g++-12",
        f"external/sparkseal_cc_linux_{arch}/root/usr/include/stdio.h",
        f"external/sparkseal_cc_linux_{arch}/toolchain.json",
    ):
        assert tool in inputs.group(1).split(", "), f"{tool}: expected among the kernels action's inputs"
