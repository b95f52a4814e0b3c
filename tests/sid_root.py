"""How tests run commands in the Debian sid root that `.ci/setup-sid` makes.

Sid's Bazel (7.7.1) needs glibc >= 2.38 and libstdc++ >= 14, so it cannot run on the bookworm host itself
(FACTS.md, "Measured 2026-12-03"); tests run it chrooted in that root instead, as root (CI runs as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

CACHE = Path(os.environ.get("SPARKSEAL_CACHE", Path.home() / ".cache" / "sparkseal"))
SID_ROOT = CACHE / "sid-root"
# Written last by .ci/setup-sid, inside the root it renames into place: present only in a complete root.
STAMP = SID_ROOT / "etc" / "sparkseal" / "setup-sid.sha256"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs on the host inside the new mount and pid namespaces (unshare has mounted the namespace's /proc in
# the root): /dev for Bazel (/dev/null, /dev/urandom), a fresh folder on disk as the root's /tmp (a PEX
# build puts gigabytes there: a tmpfs in memory runs out) so that mount points made there for the binds
# (pytest's tmp_path, say) vanish with it, then each bind at its own path.
# Mount points elsewhere stay in the root as empty directories (removing them could detach a concurrent
# call's mount). Arguments: ROOT, TMP, the bind directories, "--", NAME=VALUE..., the command to run in
# the root.
_ENTER = r"""
set -eu
root=$1
tmp=$2
shift 2
mount --rbind /dev "$root/dev"
mount --bind "$tmp" "$root/tmp"
# A new network namespace (run_in_sid's network=False) has only a loopback, down: Bazel's client needs it.
[ -z "${SID_OFFLINE:-}" ] || ip link set lo up
while [ "$1" != -- ]; do
    mkdir -p "$root$1"
    mount --rbind "$1" "$root$1"
    shift
done
shift
exec chroot "$root" /usr/bin/env -i "$@"
"""


def available() -> bool:
    """Whether a complete root is there (and unshare, which enters it)."""
    return (
        STAMP.is_file()
        and (SID_ROOT / "usr" / "bin" / "bazel").is_file()
        and shutil.which("unshare") is not None
    )


def run_in_sid(
    script: str, binds: Sequence[Path], env: Mapping[str, str], timeout: float, network: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the bash ``script`` in the sid root and return what it printed (not checked).

    Each directory of ``binds`` is mounted at the same absolute path in the root, so paths mean the same on
    both sides. The environment is ``env`` plus PATH, HOME and LANG (``env`` wins). The mounts live in a
    private mount namespace and every process in a new pid namespace: when the script ends (or the timeout
    kills it) the kernel drops both, so nothing stays mounted and no process, Bazel's server included,
    outlives the call. ``network=False`` runs it in a new network namespace too: no interface but a
    loopback that is down, so nothing can be downloaded.
    """
    # Parents before children, or a parent's bind would hide its child's.
    paths = sorted({Path(b).resolve() for b in binds}, key=lambda p: len(p.parts))
    for path in paths:
        if not path.is_dir():
            raise NotADirectoryError(f"bind {path}: expected a directory on the host, actual: missing")
    for name in env:
        if not name or "=" in name:
            raise ValueError(f"environment variable name {name!r}: expected a name without '='")
    # HOME is the host's: the checkout's .bazelrc names ~/.cache/sparkseal/repository, which must be the
    # bound cache in the root too (binds keep their host paths), whoever runs the tests.
    variables = {"PATH": PATH, "HOME": str(Path.home()), "LANG": "C.UTF-8", **env}
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="sid-tmp-", dir=CACHE))
    tmp.chmod(0o1777)
    command = [
        "unshare",
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        *([] if network else ["--net"]),
        f"--mount-proc={SID_ROOT}/proc",
        "/bin/bash",
        "-c",
        _ENTER,
        "sid-root",
        str(SID_ROOT),
        str(tmp),
        *map(str, paths),
        "--",
        *(f"{name}={value}" for name, value in variables.items()),
        "/bin/bash",
        "-c",
        script,
    ]
    try:
        return subprocess.run(
            command,
            env={"PATH": PATH, "LANG": "C.UTF-8", **({} if network else {"SID_OFFLINE": "1"})},
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
    finally:
        # The namespace is gone, so nothing should be mounted below it any more; never delete through a
        # mount that is still there.
        mounts = Path("/proc/mounts").read_text().split()
        if not any(m == str(tmp) or m.startswith(f"{tmp}/") for m in mounts):
            subprocess.run(["chmod", "-R", "u+w", str(tmp)], capture_output=True, check=False)
            shutil.rmtree(tmp, ignore_errors=True)
