"""Test helper: write installed distributions (files, dist-info, a real RECORD) into site-packages."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

SITE = "lib/python3.11/site-packages"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def install(
    site: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    installer: bytes = b"sparkseal\n",
) -> dict[str, bytes]:
    """Write ``files`` (paths relative to ``site``; ``../`` reaches the venv) and a dist-info naming them.

    Returns every file written, the dist-info included, by path relative to ``site``.
    """
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    written = {
        **files,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist_info}/INSTALLER": installer,
    }
    rows = [f"{path},{_record_hash(data)},{len(data)}" for path, data in sorted(written.items())]
    record = "\n".join([*rows, f"{dist_info}/RECORD,,"]) + "\n"
    written[f"{dist_info}/RECORD"] = record.encode()
    for path, data in written.items():
        target = site / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return written


def make_venv(root: Path, prefix: str = "opt/venv", vllm_extra: dict[str, bytes] | None = None) -> Path:
    """An image-style tree at ``root/prefix`` with vllm, torch and sparkseal look-alikes; returns its site."""
    venv = root / prefix
    site = venv / SITE
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    install(
        site,
        "vllm",
        "0.25.1",
        {
            "vllm/__init__.py": b"__version__ = '0.25.1'\n",
            "vllm/config.py": b"MAX_MODEL_LEN = 4096\n",
            "vllm/_C.abi3.so": b"\x7fELF fake shared object\n",
            "../../../bin/vllm": b"#!/opt/venv/bin/python3\nfrom vllm.cli import main\nmain()\n",
            **(vllm_extra or {}),
        },
    )
    install(
        site,
        "torch",
        "2.11.0",
        {
            "torch/__init__.py": b"import torch._C\n",
            "torch/nn/functional.py": b"def relu(x):\n    return x\n",
        },
    )
    install(site, "sparkseal", "0.1.0", {"sparkseal/__init__.py": b'"""sparkseal."""\n'})
    return site
