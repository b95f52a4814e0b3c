"""The sparkseal wheel with libsparkseal_kernels.so: action program, CMake guards, and the Bazel build.

Unit tests of ``sparkseal.actions.kernels_wheel`` run anywhere. The Bazel tests (``-m bazel``; the first run
downloads the locked toolchain wheels, ``network``) build ``//kernels_sm121:wheel_linux_{aarch64,x86_64}`` in
two output bases and check the cubins with the locked cuobjdump, the wheel tags and layout, bit-identical
wheels, the architecture flag, and CMake's refusal of an empty architecture list or a device-debug flag.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkseal.actions import kernels_wheel
from sparkseal.core.determinism import SOURCE_DATE_EPOCH, ZIP_DATE_TIME
from tests.bazel_util import REPO, Workspace

PLATFORMS = ("linux_aarch64", "linux_x86_64")
EXPECTED_CUBINS = {"linux_aarch64": {"sm_121a"}, "linux_x86_64": {"sm_90a", "sm_121a"}}
ELF_MACHINE = {"linux_aarch64": 0xB7, "linux_x86_64": 0x3E}
LIBRARY = "sparkseal/_lib/libsparkseal_kernels.so"
VERSION = "0.1.0"
TOOLCHAIN_REPO = "external/sparkseal_cuda"


# --- the action program, without Bazel -------------------------------------------------------------


def test_parse_archs_accepts_both_separators() -> None:
    assert kernels_wheel.parse_archs("90a-real,121a-real") == ["90a-real", "121a-real"]
    assert kernels_wheel.parse_archs(" 90a-real ; 121a-real ;") == ["90a-real", "121a-real"]
    assert kernels_wheel.parse_archs("") == []


def test_stage_sources_copies_relative_files_with_normalised_modes(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "tree"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("a = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "pkg" / "a.py").chmod(0o600)
    (src / "run.sh").chmod(0o700)
    monkeypatch.chdir(src)
    out = tmp_path / "out"
    kernels_wheel.stage_sources(["run.sh", "pkg/a.py", "pkg/a.py"], out)
    assert (out / "pkg" / "a.py").read_text() == "a = 1\n"
    assert (out / "pkg" / "a.py").stat().st_mode & 0o777 == 0o644
    # An execute bit says where the action ran (a remote worker gets every input executable), not what the
    # file is: the wheel's sources are all 0644.
    assert (out / "run.sh").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("rel", "message"),
    [
        ("../escape.txt", "--input ../escape.txt: expected a relative path inside the execution root"),
        ("missing.txt", "--input missing.txt: expected a regular file, found none at"),
    ],
)
def test_stage_sources_rejects_bad_inputs(tmp_path: Path, monkeypatch, rel: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(kernels_wheel.KernelsWheelError) as err:
        kernels_wheel.stage_sources([rel], tmp_path / "out")
    assert message in str(err.value)


def test_build_environment_is_fixed_and_names_the_platform(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDAARCHS", "75")
    monkeypatch.setenv("CMAKE_ARGS", "-DCMAKE_CUDA_FLAGS=-G")
    env = kernels_wheel.build_environment("linux_aarch64", [Path("/tk/bin"), Path("/cm/bin")], tmp_path)
    # Only /bin (the shell ninja runs commands with) is the host's; no compiler is found on PATH.
    assert env["PATH"] == "/tk/bin:/cm/bin:/bin"
    assert env["SOURCE_DATE_EPOCH"] == str(SOURCE_DATE_EPOCH)
    assert env["_PYTHON_HOST_PLATFORM"] == "linux_aarch64"
    assert env["HOME"] == str(tmp_path)
    assert "CUDAARCHS" not in env
    assert "CMAKE_ARGS" not in env


def test_config_settings_pass_toolchain_compiler_and_archs(tmp_path: Path) -> None:
    settings = kernels_wheel.config_settings(
        tmp_path / "src",
        tmp_path / "build",
        "linux_x86_64",
        ["90a-real", "121a-real"],
        Path("/tk"),
        "linux_x86_64",
        kernels_wheel.Compilers(Path("/w/x86_64-linux-gnu-g++"), Path("/w/x86_64-linux-gnu-strip"), None),
    )
    assert settings["cmake.define.CMAKE_CUDA_ARCHITECTURES"] == "90a-real;121a-real"
    assert settings["cmake.define.CMAKE_CXX_COMPILER"] == "/w/x86_64-linux-gnu-g++"
    assert settings["cmake.define.CMAKE_CUDA_HOST_COMPILER"] == "/w/x86_64-linux-gnu-g++"
    assert settings["cmake.define.CMAKE_STRIP"] == "/w/x86_64-linux-gnu-strip"
    assert "cmake.define.CMAKE_FIND_ROOT_PATH" not in settings
    assert settings["cmake.define.CMAKE_CUDA_COMPILER"] == "/tk/bin/nvcc"
    assert settings["cmake.define.CMAKE_TOOLCHAIN_FILE"] == str(
        tmp_path / "src" / "kernels_sm121" / "cmake" / "linux_x86_64.cmake"
    )
    assert settings["build-dir"] == str(tmp_path / "build")


@pytest.mark.parametrize(
    ("host", "platform", "expected", "cross"),
    [
        ("linux_x86_64", "linux_x86_64", "linux_x86_64.cmake", False),
        ("linux_x86_64", "linux_aarch64", "linux_aarch64.cmake", True),
        ("linux_aarch64", "linux_aarch64", "linux_aarch64-native.cmake", False),
    ],
)
def test_the_toolchain_file_depends_on_the_build_host(
    host: str, platform: str, expected: str, cross: bool
) -> None:
    rel = kernels_wheel.toolchain_file(host, platform)
    assert rel == f"kernels_sm121/cmake/{expected}"
    text = (REPO / rel).read_text()
    assert ("CMAKE_SYSTEM_NAME" in text) is cross, f"{rel}: cross settings only where host and target differ"
    # The compilers are the locked toolchain's, passed by the action: no file names one of the host's.
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "/usr/bin" not in code and "COMPILER" not in code, rel


def test_an_aarch64_host_refuses_the_x86_64_wheel() -> None:
    with pytest.raises(kernels_wheel.KernelsWheelError) as err:
        kernels_wheel.toolchain_file("linux_aarch64", "linux_x86_64")
    assert str(err.value) == (
        "--platform linux_x86_64: a linux_aarch64 build host builds only linux_aarch64 wheels, "
        "expected one of them, got linux_x86_64"
    )


def test_the_host_comes_from_the_toolkit_record(tmp_path: Path) -> None:
    record = tmp_path / "toolkit.json"
    record.write_text(json.dumps({"host": "linux_aarch64", "wheels": {}}))
    assert kernels_wheel.toolkit_host(tmp_path) == "linux_aarch64"
    record.write_text(json.dumps({"host": "linux_riscv64"}))
    with pytest.raises(kernels_wheel.KernelsWheelError) as err:
        kernels_wheel.toolkit_host(tmp_path)
    assert str(err.value) == (
        f"{record}: expected host one of linux_aarch64, linux_x86_64, got 'linux_riscv64'"
    )
    record.unlink()
    with pytest.raises(kernels_wheel.KernelsWheelError) as err:
        kernels_wheel.toolkit_host(tmp_path)
    assert str(err.value).startswith(f"{record}: expected the toolkit record of cuda_toolkit")


def test_toolchain_files_exist_for_every_platform() -> None:
    for (host, platform), rel in kernels_wheel.TOOLCHAIN_FILES.items():
        assert (REPO / rel).is_file(), (
            f"{rel}: expected the CMake toolchain file of {platform} on {host}, found none"
        )
    assert sorted({platform for _, platform in kernels_wheel.TOOLCHAIN_FILES}) == sorted(PLATFORMS)


def test_main_refuses_a_missing_build_tool(tmp_path: Path, capsys) -> None:
    status = kernels_wheel.main(
        [
            "--platform=linux_x86_64",
            "--cuda-archs=90a-real",
            f"--cuda-root={tmp_path}",
            f"--cmake={tmp_path / 'cmake'}",
            f"--ninja={tmp_path / 'ninja'}",
            f"--cc-toolchain={tmp_path / 'toolchain.json'}",
            f"--out={tmp_path / 'x.whl'}",
        ]
    )
    assert status == 1
    err = capsys.readouterr().err
    assert f"sparkseal: {tmp_path / 'bin' / 'nvcc'}: expected an executable build tool, found none" in err


def _fake_toolchain(tmp_path: Path, host: str = "linux_x86_64") -> Path:
    """A cc toolchain repository as locked_toolchain lays it out, with a stand-in compiler."""
    repo = tmp_path / "sparkseal_cc"
    (repo / "root/usr/bin").mkdir(parents=True)
    (repo / "lib").mkdir()
    for name in ("x86_64-linux-gnu-g++-12", "aarch64-linux-gnu-g++-12"):
        (repo / "root/usr/bin" / name).write_text("#!/bin/sh\n")
        (repo / "root/usr/bin" / name).chmod(0o755)
    targets = {
        "linux_x86_64": {
            "cxx": "root/usr/bin/x86_64-linux-gnu-g++-12",
            "tools_prefix": "root/usr/bin/x86_64-linux-gnu-",
            "binutils_prefix": "root/usr/bin/",
            "find_root": "",
        },
        "linux_aarch64": {
            "cxx": "root/usr/bin/aarch64-linux-gnu-g++-12",
            "tools_prefix": "root/usr/bin/aarch64-linux-gnu-",
            "binutils_prefix": "root/usr/bin/aarch64-linux-gnu-",
            "find_root": "root/usr/aarch64-linux-gnu",
        },
    }
    description = repo / "toolchain.json"
    description.write_text(
        json.dumps({"host": host, "sysroot": "root", "library_path": "lib", "targets": targets})
    )
    return description


def test_compiler_wrappers_run_the_locked_compiler_on_its_sysroot(tmp_path: Path) -> None:
    description = _fake_toolchain(tmp_path)
    repo = description.parent.resolve()
    compilers = kernels_wheel.compiler_wrappers(
        description, "linux_aarch64", "linux_x86_64", tmp_path / "bin"
    )
    assert compilers.cxx == tmp_path / "bin" / "aarch64-linux-gnu-g++"
    assert compilers.strip == tmp_path / "bin" / "aarch64-linux-gnu-strip"
    assert compilers.find_root == repo / "root/usr/aarch64-linux-gnu"
    text = compilers.cxx.read_text()
    assert text == (
        "#!/bin/sh\n"
        f"LD_LIBRARY_PATH={repo / 'lib'} exec {repo / 'root/usr/bin/aarch64-linux-gnu-g++-12'} "
        f"--sysroot={repo / 'root'} -B{repo / 'root/usr/bin/aarch64-linux-gnu-'} "
        f'-ffile-prefix-map={repo / "root"}/=/ "$@"\n'
    )
    assert os.access(compilers.cxx, os.X_OK)
    # Every binutil CMake looks for beside the compiler is the locked one, never the host's.
    for tool in kernels_wheel.BINUTILS:
        wrapper = (tmp_path / "bin" / f"aarch64-linux-gnu-{tool}").read_text()
        assert f"exec {repo / 'root/usr/bin'}/aarch64-linux-gnu-{tool} " in wrapper, tool


def test_compiler_wrappers_refuse_another_hosts_toolchain_and_a_missing_target(tmp_path: Path) -> None:
    description = _fake_toolchain(tmp_path, host="linux_aarch64")
    with pytest.raises(kernels_wheel.KernelsWheelError) as err:
        kernels_wheel.compiler_wrappers(description, "linux_x86_64", "linux_x86_64", tmp_path / "bin")
    assert str(err.value) == (
        f"{description}: expected the compilers of a linux_x86_64 build host (the CUDA toolkit's), "
        "got those of linux_aarch64"
    )
    data = json.loads(description.read_text())
    data["host"] = "linux_x86_64"
    del data["targets"]["linux_aarch64"]
    description.write_text(json.dumps(data))
    with pytest.raises(kernels_wheel.KernelsWheelError) as err:
        kernels_wheel.compiler_wrappers(description, "linux_aarch64", "linux_x86_64", tmp_path / "bin")
    assert str(err.value) == (
        f"{description}: a linux_x86_64 toolchain compiles only linux_x86_64 wheels, "
        "expected one of them, got linux_aarch64"
    )


# --- built wheels: utilities -----------------------------------------------------------------------


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def elf_sections(data: bytes) -> tuple[int, dict[str, bytes]]:
    """Return (e_machine, {section name: contents}) of a 64-bit little-endian ELF file."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "expected a 64-bit little-endian ELF"
    (machine,) = struct.unpack_from("<H", data, 18)
    (shoff,) = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx]
    strtab = data[names[4] : names[4] + names[5]]
    sections = {}
    for name_off, sh_type, _flags, _addr, offset, size, *_ in headers:
        name = strtab[name_off : strtab.index(b"\0", name_off)].decode()
        sections[name] = b"" if sh_type == 8 else data[offset : offset + size]  # 8: SHT_NOBITS
    return machine, sections


def cubins(cuobjdump: Path, library: Path) -> set[str]:
    """The SASS targets embedded in ``library``, as listed by ``cuobjdump --list-elf``."""
    proc = subprocess.run(
        [str(cuobjdump), "--list-elf", str(library)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"cuobjdump --list-elf {library} failed: {proc.stderr}"
    return set(re.findall(r"\.(sm_\d+[af]?)\.cubin", proc.stdout))


def wheel_name(platform: str) -> str:
    """The file name of the sparkseal wheel for ``platform``."""
    return f"sparkseal-{VERSION}-py3-none-{platform}.whl"


def extract_library(wheel: Path, into: Path) -> Path:
    """Write the kernel library of ``wheel`` under ``into`` and return its path."""
    target = into / wheel.name / "libsparkseal_kernels.so"
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        target.write_bytes(archive.read(LIBRARY))
    return target


# --- the Bazel build -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Builds:
    """The wheels of the shared test output base, those of a fresh one built with the architecture flag,
    and the shared output base (for the locked tools)."""

    first: dict[str, Path]
    second: dict[str, Path]
    output_base: Path


# In the second build the flag changes only the x86_64 wheel (the aarch64 list is 121a-real already):
# its aarch64 wheel is a second, independent build of the first one's, and its x86_64 wheel shows the flag.
ARCH_FLAG = "--//kernels_sm121:cuda_archs=121a-real"


def _build_wheels(workspace: Workspace, into: Path, *flags: str) -> dict[str, Path]:
    targets = [f"//kernels_sm121:wheel_{p}" for p in PLATFORMS]
    result = workspace.bazel("build", "--symlink_prefix=/", *flags, *targets)
    assert result.returncode == 0, result.output
    copies = {}
    for platform in PLATFORMS:
        built = workspace.bin_path(f"kernels_sm121/wheel_{platform}/{wheel_name(platform)}")
        into.mkdir(parents=True, exist_ok=True)
        copies[platform] = Path(shutil.copy(built, into / built.name))
    return copies


@pytest.fixture(scope="module")
def builds(real_workspace: Workspace, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builds]:
    """Both wheels from the tests' shared output base and from a fresh one (with ``ARCH_FLAG``)."""
    root = tmp_path_factory.mktemp("kernels")
    second = Workspace(REPO, root / "ob2", real_workspace.repository_cache, real_workspace.env)
    try:
        wheels_first = _build_wheels(real_workspace, root / "first")
        wheels_second = _build_wheels(second, root / "second", ARCH_FLAG)
        yield Builds(wheels_first, wheels_second, real_workspace.output_base)
    finally:
        second.shutdown()


@pytest.mark.bazel
@pytest.mark.network
@pytest.mark.parametrize("platform", PLATFORMS)
def test_wheel_holds_the_expected_cubins(builds: Builds, platform: str, tmp_path: Path) -> None:
    cuobjdump = builds.output_base / TOOLCHAIN_REPO / "cuobjdump" / "bin" / "cuobjdump"
    library = extract_library(builds.first[platform], tmp_path)
    found = cubins(cuobjdump, library)
    assert found == EXPECTED_CUBINS[platform], (
        f"{builds.first[platform].name}: {LIBRARY}: expected cubins {sorted(EXPECTED_CUBINS[platform])}, "
        f"found {sorted(found)}"
    )


@pytest.mark.bazel
@pytest.mark.network
def test_two_output_bases_give_identical_wheels(builds: Builds) -> None:
    platform = "linux_aarch64"
    first, second = sha256(builds.first[platform]), sha256(builds.second[platform])
    assert first == second, f"{wheel_name(platform)}: first build sha256 {first}, second build {second}"


@pytest.mark.bazel
@pytest.mark.network
@pytest.mark.parametrize("platform", PLATFORMS)
def test_wheel_tags_layout_and_library(builds: Builds, platform: str) -> None:
    wheel = builds.first[platform]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        wheel_meta = archive.read(f"sparkseal-{VERSION}.dist-info/WHEEL").decode()
        library = archive.read(LIBRARY)
        dates = {info.date_time for info in archive.infolist()}
    tag = f"Tag: py3-none-{platform}\n"
    assert tag in wheel_meta, f"{wheel.name}: WHEEL: expected {tag!r}, got {wheel_meta!r}"
    assert "Root-Is-Purelib: false\n" in wheel_meta, f"{wheel.name}: WHEEL: {wheel_meta}"
    assert "sparkseal/kernels/_lib.py" in names, f"{wheel.name}: expected the Python package, got {names}"
    assert "sparkseal/core/manifest.py" in names, f"{wheel.name}: expected sparkseal.core, got {names}"
    assert "sparkseal/scan/scanner.py" in names, f"{wheel.name}: expected sparkseal.scan, got {names}"
    # What runs in the image only: no action program, fetch helper or auditor.
    foreign = [
        n for n in names if n.startswith(("sparkseal/actions/", "sparkseal/fetch/", "sparkseal/audit/"))
    ]
    assert foreign == [], f"{wheel.name}: expected no build, fetch or audit code, found {foreign}"
    assert dates == {ZIP_DATE_TIME}, f"{wheel.name}: expected every entry dated {ZIP_DATE_TIME}, got {dates}"
    machine, sections = elf_sections(library)
    assert machine == ELF_MACHINE[platform], (
        f"{wheel.name}: {LIBRARY}: expected ELF machine {ELF_MACHINE[platform]:#x}, got {machine:#x}"
    )
    assert ".symtab" not in sections, f"{wheel.name}: {LIBRARY} is not stripped (has .symtab)"
    assert ".nv_fatbin" in sections, f"{wheel.name}: {LIBRARY}: expected a .nv_fatbin section"
    assert b"libcudart.so" not in sections[".dynstr"], f"{wheel.name}: {LIBRARY} links libcudart.so"
    assert b"tmpxft_" not in library, f"{wheel.name}: {LIBRARY} names nvcc's temporary files"


@pytest.mark.bazel
@pytest.mark.network
def test_arch_flag_overrides_the_target_list(builds: Builds, tmp_path: Path) -> None:
    cuobjdump = builds.output_base / TOOLCHAIN_REPO / "cuobjdump" / "bin" / "cuobjdump"
    found = cubins(cuobjdump, extract_library(builds.second["linux_x86_64"], tmp_path))
    assert found == {"sm_121a"}, f"{ARCH_FLAG}: expected cubins ['sm_121a'], found {sorted(found)}"


def _configure(builds: Builds, build_dir: Path, *defines: str) -> subprocess.CompletedProcess[str]:
    toolchain = builds.output_base / TOOLCHAIN_REPO
    return subprocess.run(
        [
            str(toolchain / "cmake" / "bin" / "cmake"),
            "-S",
            str(REPO / "kernels_sm121"),
            "-B",
            str(build_dir),
            "-G",
            "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={toolchain / 'ninja' / 'bin' / 'ninja'}",
            f"-DCMAKE_TOOLCHAIN_FILE={REPO / 'kernels_sm121' / 'cmake' / 'linux_x86_64.cmake'}",
            f"-DCMAKE_CUDA_COMPILER={toolchain / 'cuda' / 'bin' / 'nvcc'}",
            f"-DSKBUILD_PROJECT_VERSION={VERSION}",
            "-DCMAKE_BUILD_TYPE=Release",
            *defines,
        ],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(build_dir), "LC_ALL": "C.UTF-8"},
    )


@pytest.mark.bazel
@pytest.mark.network
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "CMAKE_CUDA_ARCHITECTURES is empty; expected a list such as"),
        ("native", 'CUDA architecture "native" (from CMAKE_CUDA_ARCHITECTURES="native") is not of the form'),
        ("121a", 'CUDA architecture "121a" (from CMAKE_CUDA_ARCHITECTURES="121a") is not of the form'),
    ],
)
def test_cmake_refuses_a_bad_arch_list(builds: Builds, tmp_path: Path, value: str, message: str) -> None:
    proc = _configure(builds, tmp_path / "build", f"-DCMAKE_CUDA_ARCHITECTURES={value}")
    output = re.sub(r"\s+", " ", proc.stdout + proc.stderr)
    assert proc.returncode != 0, f"cmake accepted CMAKE_CUDA_ARCHITECTURES={value!r}: {output}"
    assert message in output, output


@pytest.mark.bazel
@pytest.mark.network
def test_cmake_refuses_device_debug_flags(builds: Builds, tmp_path: Path) -> None:
    proc = _configure(
        builds, tmp_path / "build", "-DCMAKE_CUDA_ARCHITECTURES=90a-real", "-DCMAKE_CUDA_FLAGS=-G"
    )
    output = re.sub(r"\s+", " ", proc.stdout + proc.stderr)
    assert proc.returncode != 0, f"cmake accepted CMAKE_CUDA_FLAGS=-G: {output}"
    assert 'CUDA flag "-G" is not allowed' in output, output


@pytest.mark.bazel
@pytest.mark.network
def test_cmake_accepts_the_default_arch_list(builds: Builds, tmp_path: Path) -> None:
    proc = _configure(builds, tmp_path / "build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    flags = (tmp_path / "build" / "build.ninja").read_text()
    assert "arch=compute_121a,code=[sm_121a]" in flags, "expected sm_121a code generation in build.ninja"
    assert "compute_75" not in flags, "CMake fell back to its default architecture (sm_75)"
