"""An aarch64 build host (a GB10 itself): ``cuda_toolkit`` assembles its toolkit from the aarch64 host
wheels, and that nvcc makes the same SM121 device code as the x86_64 host's cross build.

A fixture workspace assembles the toolkit twice from the committed lock, once per host (``host`` chooses
it), so that an x86_64 machine can check the aarch64 one: its tools are aarch64 ELF files, and its nvcc,
run under qemu-user emulation, compiles kernel translation units of ``kernels_sm121/csrc`` for sm_121a.
The cubins ``cuobjdump -xelf`` extracts must be byte-identical to those of the x86_64 nvcc compiling the
same file with the same flags. Both use the host compiler of GCC's same release for aarch64 (natively on
a GB10, Debian's cross compiler here).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bazel_util import MINIMAL_WORKSPACE, REPO, Workspace, base_env, make_fixture_workspace, remove_tree

pytestmark = [pytest.mark.bazel, pytest.mark.network]

LOCK = REPO / "third_party" / "cuda" / "toolchain.lock.json"
HOSTS = {"linux_x86_64": "cuda_host_x86_64", "linux_aarch64": "cuda_host_aarch64"}
ELF_MACHINES = {"linux_x86_64": 0x3E, "linux_aarch64": 0xB7}
# The kernel translation units compiled on both hosts: the DSpark input kernel and the template-heavy
# V4 sparse-MLA instantiation (~1 min under emulation on a 2-core machine; the other sparse-MLA units
# instantiate the same template and would only add time).
TUS = ("kernels_sm121/csrc/dspark_prepare_inputs.cu", "kernels_sm121/csrc/sparse_mla_v4.cu")
# The flags CMake gives nvcc for the GB10 wheel (Release, CUDA_STANDARD 17, 121a-real, -objtemp).
NVCC_FLAGS = (
    "-target-dir",
    "sbsa-linux",
    "-O3",
    "-DNDEBUG",
    "-std=c++17",
    "-Xcompiler=-fPIC",
    "-gencode",
    "arch=compute_121a,code=sm_121a",
    "-objtemp",
    "-Ikernels_sm121/include",
)
AARCH64_GXX = Path("/usr/bin/aarch64-linux-gnu-g++")
# The aarch64 C library of Debian's cross packages, where qemu-user finds the dynamic loader.
AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")
BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")


@pytest.fixture(scope="module")
def toolkits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Both hosts' toolkit roots, fetched in one fixture workspace (its output base is removed after)."""
    root = tmp_path_factory.mktemp("aarch64-host")
    rules = "\n".join(
        f'cuda_toolkit(name = "{name}", host = "{host}", lock = "//third_party/cuda:toolchain.lock.json")'
        for host, name in HOSTS.items()
    )
    make_fixture_workspace(
        root / "ws", MINIMAL_WORKSPACE + '\nload("//rules:defs.bzl", "cuda_toolkit")\n\n' + rules + "\n"
    )
    shutil.copytree(REPO / "third_party" / "cuda", root / "ws" / "third_party" / "cuda")
    workspace = Workspace(
        root=root / "ws",
        output_base=root / "output-base",
        repository_cache=Path.home() / ".cache" / "sparkseal" / "repository",
        env=base_env(),
    )
    try:
        result = workspace.bazel("fetch", *(f"@{name}//:all" for name in HOSTS.values()))
        assert result.returncode == 0, result.output
        yield {host: workspace.output_base / "external" / name for host, name in HOSTS.items()}
    finally:
        workspace.bazel("clean", "--expunge")
        remove_tree(root)


def elf_machine(path: Path) -> int:
    """e_machine of an ELF file."""
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", f"{path}: expected an ELF file, got {head[:4]!r}"
    return int.from_bytes(head[18:20], "little")


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_each_host_gets_its_own_host_tools(toolkits: dict[str, Path], host: str) -> None:
    root = toolkits[host]
    for tool in (
        "cuda/bin/nvcc",
        "cuda/bin/ptxas",
        "cuda/nvvm/bin/cicc",
        "cmake/bin/cmake",
        "ninja/bin/ninja",
    ):
        found = elf_machine(root / tool)
        assert found == ELF_MACHINES[host], (
            f"{root}/{tool}: expected ELF machine {ELF_MACHINES[host]:#x}, got {found:#x}"
        )
    lock = json.loads(LOCK.read_text())["wheels"]
    record = json.loads((root / "cuda" / "toolkit.json").read_text())
    expected = {
        file["filename"]: file["sha256"]
        for project, entry in lock.items()
        for platform, file in entry["files"].items()
        if platform == host or (project == "nvidia-cuda-runtime" and platform != "any")
    }
    assert record == {"host": host, "wheels": expected}, f"{root}/cuda/toolkit.json: {record}"


def test_an_unknown_host_is_refused(tmp_path: Path) -> None:
    make_fixture_workspace(
        tmp_path / "ws",
        MINIMAL_WORKSPACE
        + '\nload("//rules:defs.bzl", "cuda_toolkit")\n\n'
        + 'cuda_toolkit(name = "cuda", host = "linux_ppc64le", '
        + 'lock = "//third_party/cuda:toolchain.lock.json")\n',
    )
    shutil.copytree(REPO / "third_party" / "cuda", tmp_path / "ws" / "third_party" / "cuda")
    workspace = Workspace(tmp_path / "ws", tmp_path / "ob", tmp_path / "repo-cache", base_env())
    try:
        result = workspace.bazel("fetch", "@cuda//:all")
    finally:
        workspace.bazel("clean", "--expunge")
    assert result.returncode != 0
    assert "host" in result.output and "linux_ppc64le" in result.output, result.output
    assert "linux_aarch64" in result.output and "linux_x86_64" in result.output, result.output


def compile_cubins(nvcc: Path, tu: str, work: Path, cuobjdump: Path, env: dict[str, str]) -> dict[str, bytes]:
    """Compile ``tu`` with ``nvcc`` in ``work`` (a copy of kernels_sm121) and return its extracted cubins."""
    shutil.copytree(REPO / "kernels_sm121", work / "kernels_sm121")
    obj = work / "kernel.o"
    proc = subprocess.run(
        [str(nvcc), "-ccbin", str(AARCH64_GXX), *NVCC_FLAGS, "-c", tu, "-o", str(obj)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"{nvcc} {tu}: exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    out = work / "cubins"
    out.mkdir()
    proc = subprocess.run(
        [str(cuobjdump), "-xelf", "all", str(obj)], cwd=out, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"cuobjdump -xelf all {obj}: {proc.stderr}"
    cubins = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert cubins, f"cuobjdump -xelf all {obj}: expected cubins, found none:\n{proc.stdout}"
    assert all(name.endswith(".sm_121a.cubin") for name in cubins), f"{obj}: cubins {sorted(cubins)}"
    return cubins


@pytest.mark.parametrize("tu", TUS)
def test_the_aarch64_nvcc_makes_the_same_device_code_as_the_cross_build(
    toolkits: dict[str, Path], tmp_path: Path, tu: str
) -> None:
    if not BINFMT.is_file() or "enabled" not in BINFMT.read_text():
        pytest.skip(f"aarch64 programs do not run here: expected {BINFMT} enabled (.ci/setup registers it)")
    assert AARCH64_GXX.is_file(), f"expected Debian's aarch64 g++ at {AARCH64_GXX}, found none (make setup)"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LC_ALL": "C.UTF-8", "TZ": "UTC"}
    cuobjdump = toolkits["linux_x86_64"] / "cuobjdump" / "bin" / "cuobjdump"
    cross = compile_cubins(
        toolkits["linux_x86_64"] / "cuda" / "bin" / "nvcc", tu, tmp_path / "x86_64", cuobjdump, env
    )
    native = compile_cubins(
        toolkits["linux_aarch64"] / "cuda" / "bin" / "nvcc",
        tu,
        tmp_path / "aarch64",
        cuobjdump,
        {**env, "QEMU_LD_PREFIX": str(AARCH64_SYSROOT)},
    )
    digests = {
        host: {name: hashlib.sha256(data).hexdigest() for name, data in cubins.items()}
        for host, cubins in (("x86_64 (cross)", cross), ("aarch64 (qemu-user)", native))
    }
    assert native == cross, f"{tu}: the device code differs between the hosts: {digests}"
