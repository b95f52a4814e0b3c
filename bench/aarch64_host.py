"""Check, once: the GB10 wheel built on an aarch64 host (emulated) against the x86_64 host's cross build.

    python3 bench/aarch64_host.py --cross WHEEL [--out bench/results/aarch64_host.md]

``WHEEL`` is ``//kernels_sm121:wheel_linux_aarch64`` as an x86_64 host builds it (cross-compiled); its
Bazel params file beside it names the action's inputs. A fixture workspace assembles the toolkit for an
aarch64 host (``cuda_toolkit(host = "linux_aarch64")``), and the kernels wheel action
(``sparkseal/actions/kernels_wheel.py``) runs with it on the same inputs, outside Bazel: its cmake, ninja
and nvcc are aarch64 programs run under qemu-user (binfmt_misc), so the action takes the native toolchain
file, as on a GB10. The one addition to the action's environment is ``QEMU_LD_PREFIX``, where qemu-user
finds the aarch64 C library. The host compiler is Debian's GCC 12 for aarch64 in both builds (a native
process on a GB10, the cross compiler here). Emulation makes it slow, hence not a unit test.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import sys
import tempfile
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkseal.actions import kernels_wheel  # noqa: E402
from tests.bazel_util import (  # noqa: E402
    MINIMAL_WORKSPACE,
    Workspace,
    base_env,
    make_fixture_workspace,
    remove_tree,
)

# Where qemu-user finds the aarch64 dynamic loader and C library (Debian's cross packages).
AARCH64_SYSROOT = "/usr/aarch64-linux-gnu"
TOOLKIT = "cuda_aarch64_host"
LIBRARY = "sparkseal/_lib/libsparkseal_kernels.so"


def action_inputs(params: Path) -> list[str]:
    """The ``--input`` values of a kernels wheel action's params file (one argument per line)."""
    lines = params.read_text(encoding="utf-8").splitlines()
    inputs = [lines[i + 1] for i, line in enumerate(lines[:-1]) if line == "--input"]
    if not inputs:
        raise SystemExit(f"{params}: expected --input lines of the kernels wheel action, found none")
    return inputs


def fetch_toolkit(scratch: Path) -> tuple[Workspace, Path]:
    """Assemble the aarch64 host's toolkit in a fixture workspace under ``scratch``; return both."""
    make_fixture_workspace(
        scratch / "ws",
        MINIMAL_WORKSPACE
        + '\nload("//rules:defs.bzl", "cuda_toolkit")\n\n'
        + f'cuda_toolkit(name = "{TOOLKIT}", host = "linux_aarch64", '
        + 'lock = "//third_party/cuda:toolchain.lock.json")\n',
    )
    shutil.copytree(REPO / "third_party" / "cuda", scratch / "ws" / "third_party" / "cuda")
    workspace = Workspace(
        scratch / "ws", scratch / "ob", Path.home() / ".cache" / "sparkseal" / "repository", base_env()
    )
    result = workspace.bazel("fetch", f"@{TOOLKIT}//:all")
    if result.returncode != 0:
        raise SystemExit(f"bazel fetch @{TOOLKIT}//:all failed:\n{result.output}")
    return workspace, workspace.output_base / "external" / TOOLKIT


def sha256(data: bytes) -> str:
    """Hex sha256, the form the table compares."""
    return hashlib.sha256(data).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cross", required=True, type=Path, help="the x86_64 host's linux_aarch64 wheel")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "aarch64_host.md")
    args = parser.parse_args()
    cross = args.cross.resolve()
    inputs = action_inputs(cross.with_name(cross.name + "-0.params"))

    def emulated_environment(platform_tag: str, tool_dirs, home: Path) -> dict[str, str]:
        return {**build_environment(platform_tag, tool_dirs, home), "QEMU_LD_PREFIX": AARCH64_SYSROOT}

    build_environment = kernels_wheel.build_environment
    kernels_wheel.build_environment = emulated_environment
    with tempfile.TemporaryDirectory(prefix="sparkseal-aarch64-host-") as scratch_name:
        scratch = Path(scratch_name)
        workspace, toolkit = fetch_toolkit(scratch)
        try:
            native = scratch / "native" / cross.name
            os.chdir(REPO)
            start = time.monotonic()
            status = kernels_wheel.main(
                [
                    "--platform=linux_aarch64",
                    "--cuda-archs=121a-real",
                    f"--cuda-root={toolkit / 'cuda'}",
                    f"--cmake={toolkit / 'cmake' / 'bin' / 'cmake'}",
                    f"--ninja={toolkit / 'ninja' / 'bin' / 'ninja'}",
                    f"--python-path={toolkit / 'python'}",
                    f"--out={native}",
                    *(f"--input={rel}" for rel in inputs),
                ]
            )
            seconds = time.monotonic() - start
            if status != 0:
                return status
            paths = {"x86_64 host (cross)": cross, "aarch64 host (qemu-user)": native}
            wheels = {name: path.read_bytes() for name, path in paths.items()}
            libraries = {}
            for name, path in paths.items():
                with zipfile.ZipFile(path) as wheel:
                    libraries[name] = wheel.read(LIBRARY)
        finally:
            workspace.bazel("clean", "--expunge")
            remove_tree(scratch / "ws")
    same = len({sha256(d) for d in wheels.values()}) == 1
    rows = "\n".join(
        f"| {name} | `{sha256(wheels[name])}` | {len(wheels[name]):,} | `{sha256(libraries[name])}` |"
        for name in wheels
    )
    args.out.write_text(
        f"""# The GB10 wheel: aarch64 build host against x86_64 cross build

Command: `python bench/aarch64_host.py --cross {args.cross}`

Machine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end;
qemu-user emulates the aarch64 host. Date: {datetime.now(UTC):%Y-%m-%d}.

| build host | wheel sha256 | bytes | {LIBRARY} sha256 |
|---|---|---:|---|
{rows}

Whole wheel {"bit-identical" if same else "DIFFERENT"}. The emulated aarch64-host build took {seconds:.0f} s
(wall; cmake, ninja, nvcc, cicc and ptxas under qemu-user, the host compiler native).
""",
        encoding="utf-8",
    )
    print(args.out.read_text(encoding="utf-8"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
