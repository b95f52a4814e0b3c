"""Push cost: a first push of a large layer, and a second push of the same image, to a loopback registry.

Writes an OCI layout with one layer of random bytes (``--layer-mib``, incompressible like a gzip
layer), starts Debian's ``docker-registry`` on a free loopback port with its storage in a temporary
directory, and runs ``python -m sparkseal.actions.oci_push`` against it twice as a child process. For each
push: wall seconds, the child's peak resident memory (``ru_maxrss``), and the program's own report of
blobs and bytes uploaded. The second push must upload nothing; the memory figure shows that a layer
streams instead of being read into memory. Everything it made is removed at the end.

    ~/.cache/sparkseal/venv/bin/python bench/push.py --layer-mib 1024 --out bench/results/push.md
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparkseal.core.oci import (
    CONFIG_MEDIA_TYPE,
    LAYER_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    REF_NAME,
    canonical_json,
)
from tests.servers.registry_server import Registry

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
COMMAND = "~/.cache/sparkseal/venv/bin/python bench/push.py"


def write_layout(root: Path, layer_mib: int) -> Path:
    """An OCI layout whose image has one ``layer_mib`` MiB layer of random bytes."""
    blobs = root / "layout" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    digest, partial = hashlib.sha256(), blobs / "partial"
    with partial.open("wb") as stream:
        for _ in range(layer_mib):
            chunk = os.urandom(MIB)
            digest.update(chunk)
            stream.write(chunk)
    layer = "sha256:" + digest.hexdigest()
    partial.rename(blobs / layer.removeprefix("sha256:"))

    def put(data: bytes) -> dict[str, object]:
        name = "sha256:" + hashlib.sha256(data).hexdigest()
        (blobs / name.removeprefix("sha256:")).write_bytes(data)
        return {"digest": name, "size": len(data)}

    config = canonical_json(
        {"architecture": "amd64", "os": "linux", "rootfs": {"diff_ids": [], "type": "layers"}}
    )
    manifest = canonical_json(
        {
            "config": {**put(config), "mediaType": CONFIG_MEDIA_TYPE},
            "layers": [{"digest": layer, "mediaType": LAYER_MEDIA_TYPE, "size": layer_mib * MIB}],
            "mediaType": MANIFEST_MEDIA_TYPE,
            "schemaVersion": 2,
        }
    )
    entry = {**put(manifest), "annotations": {REF_NAME: "bench"}, "mediaType": MANIFEST_MEDIA_TYPE}
    (root / "layout" / "index.json").write_bytes(canonical_json({"manifests": [entry], "schemaVersion": 2}))
    (root / "layout" / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    return root / "layout"


def timed_push(reference: str, layout: Path) -> tuple[float, int, dict[str, object]]:
    """Wall seconds, peak RSS in KiB of the push process, and its JSON report."""
    command = [
        sys.executable,
        "-m",
        "sparkseal.actions.oci_push",
        reference,
        "--layout",
        str(layout),
        "--json",
    ]
    with tempfile.TemporaryFile("w+") as out:
        start = time.monotonic()
        proc = subprocess.Popen(command, cwd=REPO, stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage, not the registry's
        wall = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        raise SystemExit(f"push failed with status {proc.returncode}: {text}")
    return wall, usage.ru_maxrss, json.loads(text.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer-mib", type=int, default=1024)
    parser.add_argument("--out", type=Path, help="markdown results file (default: stdout)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkseal-bench-push-") as tmp:
        layout = write_layout(Path(tmp), args.layer_mib)
        with Registry(Path(tmp) / "registry") as registry:
            reference = f"{registry.host}/sparkseal/bench"
            rows = [timed_push(reference, layout) for _ in range(2)]
    os_name = platform.freedesktop_os_release()["PRETTY_NAME"]
    lines = [
        "# Push to a registry",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {os_name}; "
        f"{datetime.date.today().isoformat()}. Registry: Debian's docker-registry on 127.0.0.1, "
        "storage on the same disk. One run.",
        "",
        f"Command: `{COMMAND} --layer-mib {args.layer_mib}`",
        "",
        "| push | wall s | peak RSS of the push (MiB) | blobs uploaded | bytes uploaded | already there |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, (wall, peak, report) in zip(("first", "second (same image)"), rows, strict=True):
        lines.append(
            f"| {name} | {wall:.1f} | {peak / 1024:.0f} | {len(report['uploaded'])} | "  # type: ignore[arg-type]
            f"{report['uploaded_bytes']:,} | {len(report['skipped'])} |"  # type: ignore[arg-type]
        )
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
