"""Action: build the ``sparkseal`` wheel (Python package + ``libsparkseal_kernels.so``), scikit-build-core.

Runs scikit-build-core's PEP 517 ``build_wheel`` in this process, with only the standard library and the
locked pure-Python wheels (``--python-path``) importable, cmake and ninja from their locked wheels, nvcc
from the locked toolkit root, and the host code compiled by the locked g++ against the locked C library
(``--cc-toolchain``, rules/private/toolchains.bzl). The declared inputs are copied into a fresh source
tree first, so nothing else on disk can reach the wheel; the process environment is replaced by a fixed
one (hermetic ``PATH``, ``SOURCE_DATE_EPOCH``, the target platform tag).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkseal.core.determinism import EXEC_MODE, FILE_MODE, SOURCE_DATE_EPOCH
from sparkseal.core.platforms import PLATFORMS
from sparkseal.core.repo_names import apparent_text

# (build host, wheel platform) -> CMake toolchain file. The host is the one the toolkit was assembled for
# (`host` of its cuda/toolkit.json). An aarch64 host compiles natively; an x86_64 host cross-compiles the
# linux_aarch64 wheel. No aarch64 host builds the linux_x86_64 wheel (no cross toolchain for it).
TOOLCHAIN_FILES = {
    ("linux_x86_64", "linux_x86_64"): "kernels_sm121/cmake/linux_x86_64.cmake",
    ("linux_x86_64", "linux_aarch64"): "kernels_sm121/cmake/linux_aarch64.cmake",
    ("linux_aarch64", "linux_aarch64"): "kernels_sm121/cmake/linux_aarch64-native.cmake",
}
# Only /bin/sh is the host's (ninja runs each command through it); every compiler, linker and binutil is a
# wrapper around the locked toolchain (`compiler_wrappers`), named by absolute path or found in its folder.
SYSTEM_PATH = ("/bin",)
# The binutils CMake looks for beside the compiler (`<triplet>-ar`, ...): each gets a wrapper, so none is
# taken from the host.
BINUTILS = ("addr2line", "ar", "as", "ld", "nm", "objcopy", "objdump", "ranlib", "readelf", "strip")
# ninja jobs per wheel: a CI machine has 2 cores, and Bazel runs the two platforms' actions side by side.
BUILD_JOBS = 2


class KernelsWheelError(Exception):
    """The inputs are incomplete or the build produced something other than the expected wheel."""


def parse_archs(text: str) -> list[str]:
    """Split a CUDA architecture list written with ``;`` or ``,`` (``"90a-real,121a-real"``)."""
    return [part.strip() for part in text.replace(",", ";").split(";") if part.strip()]


def stage_sources(inputs: Sequence[str], root: Path) -> None:
    """Copy each input (a path relative to the current directory) to the same relative path under ``root``,
    mode 0644: Bazel marks every input executable on a remote worker, so an input's execute bit depends on
    where the action runs, and no source of the wheel is a program."""
    for rel in sorted(set(inputs)):
        source = Path(rel)
        if source.is_absolute() or ".." in source.parts:
            raise KernelsWheelError(f"--input {rel}: expected a relative path inside the execution root")
        if not source.is_file():
            raise KernelsWheelError(
                f"--input {rel}: expected a regular file, found none at {source.resolve()}"
            )
        target = root / source
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(FILE_MODE)


@dataclass(frozen=True)
class Compilers:
    """The locked toolchain's programs for one wheel platform, as wrappers CMake and nvcc call."""

    cxx: Path
    strip: Path
    find_root: Path | None


def _wrapper(path: Path, program: Path, library_path: Path, flags: Sequence[str] = ()) -> None:
    """Write a /bin/sh wrapper at ``path`` that runs ``program`` with the toolchain's libraries."""
    words = " ".join(shlex.quote(str(w)) for w in (program, *flags))
    path.write_text(
        f'#!/bin/sh\nLD_LIBRARY_PATH={shlex.quote(str(library_path))} exec {words} "$@"\n',
        encoding="utf-8",
    )
    path.chmod(EXEC_MODE)


def read_toolchain(description: Path, host: str) -> dict[str, Any]:
    """The locked C/C++ toolchain's toolchain.json; it must be the one of the toolkit's build host."""
    try:
        spec = json.loads(description.read_text(encoding="utf-8"))
        toolchain_host = spec["host"]
        if not isinstance(spec["targets"], dict):
            raise TypeError("`targets` is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KernelsWheelError(
            f"{description}: expected the toolchain.json of a locked cc toolchain ({exc})"
        ) from exc
    if toolchain_host != host:
        raise KernelsWheelError(
            f"{description}: expected the compilers of a {host} build host (the CUDA toolkit's), "
            f"got those of {toolchain_host}"
        )
    return spec


def compiler_wrappers(description: Path, platform: str, host: str, folder: Path) -> Compilers:
    """Write wrappers for the locked compiler and binutils that build ``platform`` into ``folder``.

    The compiler gets ``--sysroot`` (the locked C library, libstdc++ and kernel headers, never the host's
    /usr/include), ``-B`` (the locked ``as`` and ``ld``) and ``-ffile-prefix-map`` from the toolchain's
    root to ``/``: a path the headers leave in the library (``__FILE__``) reads as on the host the packages
    were made for, whatever the output base.
    """
    spec = read_toolchain(description, host)
    target = spec["targets"].get(platform)
    if target is None:
        raise KernelsWheelError(
            f"{description}: a {host} toolchain compiles only {', '.join(sorted(spec['targets']))} wheels, "
            f"expected one of them, got {platform}"
        )
    # The repository where its files really are: the sandbox links each input file to it, and gcc finds
    # its own parts (and ld the C library's linker scripts, whose absolute paths it prefixes with the
    # sysroot only for a script inside it) through resolved paths; one spelling keeps the two consistent.
    repo = Path(os.path.realpath(description)).parent
    root = repo / spec["sysroot"]
    libs = repo / spec["library_path"]
    cxx = repo / target["cxx"]
    if not os.access(cxx, os.X_OK):
        raise KernelsWheelError(f"{description}: expected the compiler at {cxx}, found none")
    maps = [f"-ffile-prefix-map={root}/=/"]
    folder.mkdir(parents=True, exist_ok=True)
    prefix = target["tools_prefix"]
    triplet_prefix = Path(prefix).name
    _wrapper(
        folder / f"{triplet_prefix}g++",
        cxx,
        libs,
        [f"--sysroot={root}", f"-B{repo / target['binutils_prefix']}", *maps],
    )
    for tool in BINUTILS:
        _wrapper(folder / f"{triplet_prefix}{tool}", repo / f"{prefix}{tool}", libs)
    find_root = repo / target["find_root"] if target["find_root"] else None
    return Compilers(folder / f"{triplet_prefix}g++", folder / f"{triplet_prefix}strip", find_root)


def build_environment(platform: str, tool_dirs: Sequence[Path], home: Path) -> dict[str, str]:
    """Return the complete environment of the build: nothing is inherited from the caller."""
    return {
        "PATH": os.pathsep.join([*(str(d) for d in tool_dirs), *SYSTEM_PATH]),
        "HOME": str(home),
        "TMPDIR": str(home),
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH),
        "_PYTHON_HOST_PLATFORM": platform,
        "CMAKE_BUILD_PARALLEL_LEVEL": str(BUILD_JOBS),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def toolkit_host(cuda_root: Path) -> str:
    """The build host the toolkit's tools were unpacked for (``host`` of ``cuda/toolkit.json``)."""
    record = cuda_root / "toolkit.json"
    try:
        host = json.loads(record.read_text(encoding="utf-8")).get("host")
    except (OSError, ValueError, AttributeError) as exc:
        raise KernelsWheelError(f"{record}: expected the toolkit record of cuda_toolkit ({exc})") from exc
    if host not in PLATFORMS:
        raise KernelsWheelError(
            f"{record}: expected host one of {', '.join(sorted(PLATFORMS))}, got {host!r}"
        )
    return host


def toolchain_file(host: str, platform: str) -> str:
    """The CMake toolchain file (relative to the source root) that builds ``platform`` on ``host``."""
    rel = TOOLCHAIN_FILES.get((host, platform))
    if rel is None:
        builds = sorted(p for h, p in TOOLCHAIN_FILES if h == host)
        raise KernelsWheelError(
            f"--platform {platform}: a {host} build host builds only {', '.join(builds)} wheels, "
            f"expected one of them, got {platform}"
        )
    return rel


def config_settings(
    source_root: Path,
    build_dir: Path,
    platform: str,
    archs: Sequence[str],
    cuda_root: Path,
    host: str,
    compilers: Compilers,
) -> dict[str, str]:
    """Return scikit-build-core's config settings for one platform and architecture list."""
    settings = {
        "build-dir": str(build_dir),
        "cmake.define.CMAKE_TOOLCHAIN_FILE": str(source_root / toolchain_file(host, platform)),
        "cmake.define.CMAKE_CUDA_COMPILER": str(cuda_root / "bin" / "nvcc"),
        "cmake.define.CMAKE_CUDA_ARCHITECTURES": ";".join(archs),
        "cmake.define.CMAKE_CXX_COMPILER": str(compilers.cxx),
        "cmake.define.CMAKE_CUDA_HOST_COMPILER": str(compilers.cxx),
        "cmake.define.CMAKE_STRIP": str(compilers.strip),
    }
    if compilers.find_root is not None:
        settings["cmake.define.CMAKE_FIND_ROOT_PATH"] = str(compilers.find_root)
    return settings


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (and those of its children: cmake, nvcc) to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with log.open("wb") as stream:
            os.dup2(stream.fileno(), 1)
            os.dup2(stream.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        os.close(saved[0])
        os.close(saved[1])


@contextlib.contextmanager
def environment_and_cwd(env: dict[str, str], cwd: Path) -> Iterator[None]:
    """Run the block with exactly ``env`` as the environment and ``cwd`` as the working directory."""
    saved_env, saved_cwd = dict(os.environ), Path.cwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def isolate_sys_path(python_path: Sequence[Path]) -> None:
    """Make only the standard library and the locked wheels importable (no site or user packages)."""
    kept = [p for p in sys.path if p and "site-packages" not in p and "dist-packages" not in p]
    sys.path[:] = [str(p) for p in python_path] + kept


def build(args: argparse.Namespace) -> Path:
    """Build the wheel described by ``args`` and move it to ``args.out``; return that path."""
    archs = parse_archs(args.cuda_archs)
    cuda_root = args.cuda_root.resolve()
    tool_dirs = [cuda_root / "bin", args.cmake.resolve().parent, args.ninja.resolve().parent]
    for tool in (cuda_root / "bin" / "nvcc", args.cmake, args.ninja):
        if not os.access(tool, os.X_OK):
            raise KernelsWheelError(f"{tool}: expected an executable build tool, found none")
    python_path = [p.resolve() for p in args.python_path]
    isolate_sys_path(python_path)
    from scikit_build_core.build import build_wheel

    with tempfile.TemporaryDirectory(prefix="sparkseal-kernels-") as scratch_name:
        scratch = Path(scratch_name)
        source_root, build_dir, dist, home = (scratch / d for d in ("src", "build", "dist", "home"))
        for directory in (source_root, dist, home):
            directory.mkdir()
        stage_sources(args.input, source_root)
        host = toolkit_host(cuda_root)
        compilers = compiler_wrappers(args.cc_toolchain, args.platform, host, scratch / "bin")
        settings = config_settings(source_root, build_dir, args.platform, archs, cuda_root, host, compilers)
        env = build_environment(args.platform, [scratch / "bin", *tool_dirs], home)
        log = scratch / "build.log"
        try:
            with environment_and_cwd(env, source_root), output_to(log):
                built = build_wheel(str(dist), settings)
        except (Exception, SystemExit) as exc:
            output = log.read_text(encoding="utf-8", errors="replace")
            raise KernelsWheelError(
                f"{source_root / 'pyproject.toml'}: scikit-build-core failed to build the {args.platform} "
                f"wheel ({exc!r}); expected {args.out.name}. Its output:\n{output}"
            ) from exc
        if built != args.out.name:
            raise KernelsWheelError(
                f"{source_root / 'pyproject.toml'}: the build produced {built}, but the target expects "
                f"{args.out.name} (version or platform tag out of step)"
            )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(dist / built, args.out)
    return args.out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], fromfile_prefix_chars="@")
    parser.add_argument("--platform", required=True, choices=PLATFORMS, help="wheel platform tag")
    parser.add_argument(
        "--cuda-archs",
        required=True,
        help="CMAKE_CUDA_ARCHITECTURES, ';' or ',' separated (e.g. 90a-real;121a-real)",
    )
    parser.add_argument("--cuda-root", required=True, type=Path, help="assembled CUDA toolkit root")
    parser.add_argument(
        "--cc-toolchain", required=True, type=Path, help="toolchain.json of the locked C/C++ toolchain"
    )
    parser.add_argument("--cmake", required=True, type=Path, help="the cmake executable")
    parser.add_argument("--ninja", required=True, type=Path, help="the ninja executable")
    parser.add_argument(
        "--python-path",
        action="append",
        default=[],
        type=Path,
        help="directory of unpacked locked wheels to import scikit-build-core from",
    )
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        help="a source file of the wheel, relative to the current directory",
    )
    parser.add_argument("--out", required=True, type=Path, help="where to write the wheel")
    args = parser.parse_args(argv)
    try:
        build(args)
    except KernelsWheelError as exc:
        print(f"sparkseal: {apparent_text(str(exc))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
