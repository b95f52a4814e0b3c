"""`tests/bazel_remote.host_reads`: what an execution log's spawn would read from the host.

The Bazel tests assert it over real logs (tests/bazel/test_hosts.py); here over crafted spawns, so that
the check is shown to trip on each way an action can name a host path, and to pass a clean one.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.bazel_remote import host_reads

PARAMS = "bazel-out/k8-opt-exec/bin/kernels_sm121/wheel-0.params"
TOOLCHAIN = "external/sparkseal_cc_linux_x86_64/toolchain.json"


def _spawn(args: list[str], env: dict[str, str], inputs: list[str]) -> dict[str, object]:
    """A spawn as ``--execution_log_json_file`` writes one (the fields host_reads reads)."""
    return {
        "commandArgs": args,
        "environmentVariables": [{"name": k, "value": v} for k, v in env.items()],
        "inputs": [{"path": p, "digest": {"hash": "0" * 64}} for p in inputs],
        "mnemonic": "KernelsWheel",
    }


def _execroot(tmp_path: Path, params: list[str], toolchain: dict[str, object]) -> Path:
    (tmp_path / PARAMS).parent.mkdir(parents=True)
    (tmp_path / PARAMS).write_text("\n".join(params) + "\n")
    (tmp_path / TOOLCHAIN).parent.mkdir(parents=True)
    (tmp_path / TOOLCHAIN).write_text(json.dumps(toolchain))
    return tmp_path


CLEAN_TOOLCHAIN = {"host": "linux_x86_64", "sysroot": "root", "targets": {"x": {"cxx": "root/usr/bin/g++"}}}


def test_a_clean_spawn_reads_nothing_from_the_host(tmp_path: Path) -> None:
    execroot = _execroot(
        tmp_path, ["--cmake", "external/cmake/bin/cmake", "--out", "bazel-out/w.whl"], CLEAN_TOOLCHAIN
    )
    spawn = _spawn(
        ["bazel-out/k8-opt-exec/bin/sparkseal/actions/kernels_wheel", f"@{PARAMS}", "-o/dev/null"],
        {"LC_ALL": "C.UTF-8", "TZ": "UTC"},
        [PARAMS, TOOLCHAIN, "external/sparkseal_cc_linux_x86_64/root/usr/include/math.h"],
    )
    assert host_reads(spawn, execroot) == []


def test_each_way_of_naming_a_host_path_is_found(tmp_path: Path) -> None:
    execroot = _execroot(
        tmp_path,
        ["--cmake", "/usr/bin/cmake", "--cuda-root", "external/cuda"],
        {"host": "linux_x86_64", "sysroot": "/", "targets": {"x": {"cxx": "/usr/bin/g++-12"}}},
    )
    spawn = _spawn(
        ["/usr/bin/python3", f"@{PARAMS}", "-I/usr/include", "--sysroot=/opt/host"],
        {"PATH": "/usr/local/bin:/usr/bin", "TZ": "UTC"},
        [PARAMS, TOOLCHAIN, "../host_repo/lib.so"],
    )
    assert host_reads(spawn, execroot) == [
        "input: ../host_repo/lib.so",
        "argument /usr/bin/python3: /usr/bin/python3",
        "argument -I/usr/include: /usr/include",
        "argument --sysroot=/opt/host: /opt/host",
        "environment PATH: /usr/local/bin",
        "environment PATH: /usr/bin",
        f"{PARAMS}: /usr/bin/cmake",
        f"{TOOLCHAIN}: /",  # a sysroot of "/" is the host's whole file system
        f"{TOOLCHAIN}: /usr/bin/g++-12",
    ]
    # Without the execution root the files are not read: the command alone is judged.
    assert host_reads(spawn) == host_reads(spawn, execroot)[:6]
