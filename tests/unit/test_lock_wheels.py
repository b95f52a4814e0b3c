"""The kernel toolchain lock (``sparkseal.fetch.lock_wheels``) and the toolkit root it assembles.

The lock writer is tested against a fake index; the committed lock against ``PINS``. The Bazel test
(``-m bazel``; its first run downloads the locked wheels, ``network``) fetches ``@sparkseal_cuda`` and checks
the assembled layout: tool versions, the per-target static cudart, headers, and the record of used wheels.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from sparkseal.fetch import lock_wheels
from sparkseal.fetch.index import IndexFile, ProjectPage
from sparkseal.fetch.lock_wheels import ANY, LINUX_AARCH64, LINUX_X86_64, LockError, Pin
from tests.bazel_util import REPO, Workspace

LOCK = REPO / "third_party" / "cuda" / "toolchain.lock.json"
PAGE = "https://index.invalid/simple/cmake/"
CMAKE_FILES = (
    "cmake-4.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "cmake-4.4.5-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
    "cmake-4.4.5-py3-none-musllinux_1_2_x86_64.whl",
    "cmake-4.4.5-py3-none-win_amd64.whl",
    "cmake-4.4.4-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "cmake-4.4.5.tar.gz",
)


def index_file(filename: str, listed: bool = True) -> IndexFile:
    """An index entry whose sha256 is the hash of its name, or none when not ``listed``."""
    digest = hashlib.sha256(filename.encode()).hexdigest() if listed else None
    return IndexFile(filename=filename, url=PAGE + filename, sha256=digest, page_url=PAGE)


CMAKE_PAGE = tuple(index_file(name) for name in CMAKE_FILES)


# --- lock writer -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tags", "platform", "expected"),
    [
        (("manylinux2014_x86_64", "manylinux_2_17_x86_64"), LINUX_X86_64, True),
        (("manylinux2014_x86_64", "manylinux_2_17_x86_64"), LINUX_AARCH64, False),
        (("manylinux2014_aarch64", "manylinux_2_17_aarch64"), LINUX_AARCH64, True),
        (("musllinux_1_2_x86_64",), LINUX_X86_64, False),
        (("win_amd64",), LINUX_X86_64, False),
        (("any",), ANY, True),
        (("manylinux2014_x86_64",), ANY, False),
    ],
)
def test_platform_matches(tags: tuple[str, ...], platform: str, expected: bool) -> None:
    assert lock_wheels.platform_matches(tags, platform) is expected


def test_select_wheel_picks_the_glibc_wheel_of_the_pinned_version() -> None:
    pin = Pin("cmake", "4.4.5", (LINUX_X86_64,))
    chosen = lock_wheels.select_wheel(pin, LINUX_X86_64, CMAKE_PAGE, PAGE)
    assert chosen.filename == CMAKE_FILES[0]
    chosen = lock_wheels.select_wheel(pin, LINUX_AARCH64, CMAKE_PAGE, PAGE)
    assert chosen.filename == CMAKE_FILES[1]


def test_select_wheel_fails_when_no_wheel_fits() -> None:
    pin = Pin("cmake", "4.4.6", (LINUX_X86_64,))
    with pytest.raises(LockError) as err:
        lock_wheels.select_wheel(pin, LINUX_X86_64, CMAKE_PAGE, PAGE)
    assert str(err.value) == f"{PAGE}: expected exactly one cmake 4.4.6 wheel for linux_x86_64, found none"


def test_select_wheel_fails_when_several_wheels_fit() -> None:
    pin = Pin("cmake", "4.4.5", (LINUX_X86_64,))
    extra = index_file("cmake-4.4.5-py3-none-manylinux_2_28_x86_64.whl")
    with pytest.raises(LockError) as err:
        lock_wheels.select_wheel(pin, LINUX_X86_64, (*CMAKE_PAGE, extra), PAGE)
    assert str(err.value) == (
        f"{PAGE}: expected exactly one cmake 4.4.5 wheel for linux_x86_64, found {CMAKE_FILES[0]}, "
        f"{extra.filename}"
    )


def test_select_wheel_of_a_c_extension_takes_the_pinned_interpreter() -> None:
    # python-zstandard publishes one wheel per CPython version and machine; the lock wants the build
    # host's python3 (cp311), never another interpreter's extension.
    files = tuple(
        index_file(f"zstandard-0.25.0-{py}-{py}-manylinux2014_x86_64.manylinux_2_17_x86_64.whl")
        for py in ("cp310", "cp311", "cp312")
    )
    pin = Pin("zstandard", "0.25.0", (LINUX_X86_64,), python="cp311")
    assert lock_wheels.select_wheel(pin, LINUX_X86_64, files, PAGE) == files[1]
    with pytest.raises(LockError) as err:
        lock_wheels.select_wheel(Pin("zstandard", "0.25.0", (LINUX_X86_64,)), LINUX_X86_64, files, PAGE)
    assert (
        "expected exactly one zstandard 0.25.0 wheel for linux_x86_64, found zstandard-0.25.0-cp310"
        in str(err.value)
    )


def test_the_zstd_lock_names_a_cp311_wheel_per_build_host() -> None:
    lock = json.loads((REPO / "third_party/zstd/zstandard.lock.json").read_text())
    files = lock["wheels"]["zstandard"]["files"]
    assert sorted(files) == [LINUX_AARCH64, LINUX_X86_64]
    for platform, entry in files.items():
        assert entry["filename"].startswith("zstandard-0.25.0-cp311-cp311-manylinux")
        assert entry["filename"].endswith(platform.removeprefix("linux_") + ".whl")
        assert len(entry["sha256"]) == 64


def fake_lister(pages: dict[str, tuple[IndexFile, ...]]):
    """A project-page reader over fixed listings."""

    def lister(project: str) -> ProjectPage:
        return ProjectPage(url=PAGE, files=pages[project])

    return lister


def test_build_lock_records_filename_and_sha256_per_platform() -> None:
    pins = (
        Pin("cmake", "4.4.5", (LINUX_X86_64, LINUX_AARCH64)),
        Pin("scikit-build-core", "1.1.2", (ANY,)),
    )
    skbuild = index_file("scikit_build_core-1.1.2-py3-none-any.whl", listed=False)
    hashed = []

    def hasher(file: IndexFile) -> str:
        hashed.append(file.filename)
        return "ab" * 32

    lock = lock_wheels.build_lock(
        pins, fake_lister({"cmake": CMAKE_PAGE, "scikit-build-core": (skbuild,)}), hasher
    )
    assert lock["wheels"]["cmake"] == {
        "version": "4.4.5",
        "files": {
            LINUX_AARCH64: {"filename": CMAKE_FILES[1], "sha256": CMAKE_PAGE[1].sha256},
            LINUX_X86_64: {"filename": CMAKE_FILES[0], "sha256": CMAKE_PAGE[0].sha256},
        },
    }
    assert lock["wheels"]["scikit-build-core"]["files"][ANY] == {
        "filename": skbuild.filename,
        "sha256": "ab" * 32,
    }
    assert hashed == [skbuild.filename], "only a file without a listed sha256 is downloaded and hashed"


def test_check_mode_reports_an_out_of_date_lock(tmp_path: Path, monkeypatch, capsys) -> None:
    pages = {
        "cmake": CMAKE_PAGE,
        "ninja": (index_file("ninja-1.13.2-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"),),
    }
    monkeypatch.setattr(lock_wheels, "PINS", (Pin("cmake", "4.4.5", (LINUX_X86_64,)),))
    monkeypatch.setattr(lock_wheels, "list_files", lambda project, index: ProjectPage(PAGE, pages[project]))
    lock = tmp_path / "toolchain.lock.json"
    assert lock_wheels.main(["--output", str(lock)]) == 0
    assert lock_wheels.main(["--output", str(lock), "--check"]) == 0
    monkeypatch.setattr(lock_wheels, "PINS", (Pin("ninja", "1.13.2", (LINUX_X86_64,)),))
    assert lock_wheels.main(["--output", str(lock), "--check"]) == 1
    assert f"sparkseal: {lock}: out of date with PINS and the index" in capsys.readouterr().err


# --- the committed lock ----------------------------------------------------------------------------


def test_committed_lock_matches_pins() -> None:
    text = LOCK.read_text(encoding="utf-8")
    lock = json.loads(text)
    assert lock_wheels.render(lock) == text, f"{LOCK}: not in the form lock_wheels writes"
    expected = {lock_wheels.normalize_name(pin.project): pin for pin in lock_wheels.PINS}
    assert sorted(lock["wheels"]) == sorted(expected), f"{LOCK}: projects differ from PINS"
    for project, entry in lock["wheels"].items():
        pin = expected[project]
        assert entry["version"] == pin.version, (
            f"{LOCK}: {project}: version {entry['version']}, PINS {pin.version}"
        )
        assert sorted(entry["files"]) == sorted(pin.platforms), (
            f"{LOCK}: {project}: platforms differ from PINS"
        )
        for platform, file in entry["files"].items():
            name, version, tags = lock_wheels.wheel_parts(file["filename"])
            assert (name, version) == (project, pin.version), f"{LOCK}: {file['filename']} is not {project}"
            assert lock_wheels.platform_matches(tags, platform), (
                f"{LOCK}: {file['filename']} is not {platform}"
            )
            assert re.fullmatch(r"[0-9a-f]{64}", file["sha256"]), f"{LOCK}: {file['filename']}: bad sha256"


# --- the assembled toolkit -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toolkit(real_workspace: Workspace) -> Path:
    """The fetched @sparkseal_cuda repository (in the tests' shared output base)."""
    result = real_workspace.bazel("fetch", "@sparkseal_cuda//:all")
    assert result.returncode == 0, result.output
    return real_workspace.output_base / "external" / "sparkseal_cuda"


def locked(project: str, platform: str) -> dict[str, str]:
    """The lock entry of one wheel."""
    return json.loads(LOCK.read_text())["wheels"][project]["files"][platform]


def version_of(project: str) -> str:
    """The locked version of a project."""
    return json.loads(LOCK.read_text())["wheels"][project]["version"]


def first_elf_machine(archive: Path) -> int:
    """e_machine of the first ELF object in a static library."""
    data = archive.read_bytes()
    assert data.startswith(b"!<arch>\n"), f"{archive}: expected an ar archive"
    start = data.index(b"\x7fELF")
    return int.from_bytes(data[start + 18 : start + 20], "little")


def run_version(tool: Path, *args: str) -> str:
    """The output of ``tool --version`` (or ``args``)."""
    proc = subprocess.run([str(tool), *(args or ("--version",))], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{tool}: exit {proc.returncode}: {proc.stderr}"
    return proc.stdout


@pytest.mark.bazel
@pytest.mark.network
def test_tools_are_the_locked_versions(toolkit: Path) -> None:
    nvcc = run_version(toolkit / "cuda" / "bin" / "nvcc")
    assert f"V{version_of('nvidia-cuda-nvcc')}" in nvcc, (
        f"nvcc: expected V{version_of('nvidia-cuda-nvcc')}, got {nvcc}"
    )
    cmake = run_version(toolkit / "cmake" / "bin" / "cmake")
    assert f"cmake version {version_of('cmake')}" in cmake, f"cmake: got {cmake}"
    ninja = run_version(toolkit / "ninja" / "bin" / "ninja")
    assert ninja.startswith(version_of("ninja")), f"ninja: expected {version_of('ninja')}, got {ninja}"
    cuobjdump = run_version(toolkit / "cuobjdump" / "bin" / "cuobjdump")
    assert "cuobjdump" in cuobjdump.lower(), f"cuobjdump --version: {cuobjdump}"


@pytest.mark.bazel
@pytest.mark.network
@pytest.mark.parametrize(("target_dir", "machine"), [("x86_64-linux", 0x3E), ("sbsa-linux", 0xB7)])
def test_each_target_has_its_own_static_cudart_and_headers(
    toolkit: Path, target_dir: str, machine: int
) -> None:
    root = toolkit / "cuda" / "targets" / target_dir
    found = first_elf_machine(root / "lib" / "libcudart_static.a")
    assert found == machine, (
        f"{root}/lib/libcudart_static.a: expected ELF machine {machine:#x}, got {found:#x}"
    )
    for header in ("cuda_runtime.h", "crt/host_defines.h", "fatbinary_section.h", "cccl/cuda/std/cstdint"):
        assert (root / "include" / header).is_file(), f"{root}/include: expected {header}, found none"


@pytest.mark.bazel
@pytest.mark.network
def test_toolkit_records_the_wheels_it_was_made_of(toolkit: Path) -> None:
    record = json.loads((toolkit / "cuda" / "toolkit.json").read_text())
    lock = json.loads(LOCK.read_text())["wheels"]
    expected = {
        file["filename"]: file["sha256"]
        for project, entry in lock.items()
        for platform, file in entry["files"].items()
        if platform == LINUX_X86_64 or (platform == LINUX_AARCH64 and project == "nvidia-cuda-runtime")
    }
    assert record == {"host": LINUX_X86_64, "wheels": expected}, f"{toolkit}/cuda/toolkit.json: {record}"
    site = json.loads((toolkit / "python" / "site.json").read_text())
    pure = {
        locked(p, ANY)["filename"]: locked(p, ANY)["sha256"]
        for p in ("scikit-build-core", "packaging", "pathspec")
    }
    assert site == {"wheels": pure}, f"{toolkit}/python/site.json: {site}"
    assert (toolkit / "python" / "scikit_build_core" / "build" / "__init__.py").is_file()
    assert (toolkit / "cuda" / "nvvm" / "bin" / "cicc").is_file()
    assert (toolkit / "cuda" / "nvvm" / "libdevice" / "libdevice.10.bc").is_file()


def test_the_scanner_set_writes_its_own_lock(tmp_path: Path, monkeypatch, capsys) -> None:
    files = (
        "kingfisher_bin-2.14.0-py3-none-manylinux_2_17_aarch64.musllinux_1_2_aarch64.whl",
        "kingfisher_bin-2.14.0-py3-none-manylinux_2_17_x86_64.musllinux_1_2_x86_64.whl",
        "kingfisher_bin-2.14.0-py3-none-macosx_11_0_arm64.whl",
    )
    page = tuple(index_file(name) for name in files)
    monkeypatch.setattr(lock_wheels, "list_files", lambda project, index: ProjectPage(PAGE, page))
    lock = tmp_path / "scanner.lock.json"
    assert lock_wheels.main(["--set", "scanner", "--output", str(lock)]) == 0
    written = json.loads(lock.read_text())
    assert written["comment"] == (
        "Generated by `python3 -m sparkseal.fetch.lock_wheels --set scanner`; "
        "edit SCANNER_PINS there, not this file."
    )
    assert written["wheels"]["kingfisher-bin"] == {
        "version": "2.14.0",
        "files": {
            LINUX_AARCH64: {"filename": files[0], "sha256": page[0].sha256},
            LINUX_X86_64: {"filename": files[1], "sha256": page[1].sha256},
        },
    }
    monkeypatch.setattr(lock_wheels, "SCANNER_PINS", (Pin("kingfisher-bin", "2.14.0", (LINUX_X86_64,)),))
    assert lock_wheels.main(["--set", "scanner", "--output", str(lock), "--check"]) == 1
    assert f"sparkseal: {lock}: out of date with SCANNER_PINS and the index" in capsys.readouterr().err


def test_the_committed_scanner_lock_matches_the_dev_requirements() -> None:
    """One version of the scanner: the image build's lock and the venv's hash-locked pin agree."""
    lock = json.loads((REPO / "third_party/scan/scanner.lock.json").read_text())["wheels"]["kingfisher-bin"]
    assert [(p.project, p.version) for p in lock_wheels.SCANNER_PINS] == [("kingfisher-bin", lock["version"])]
    assert f"kingfisher-bin=={lock['version']} \\" in (REPO / ".ci/requirements-trust.txt").read_text()
