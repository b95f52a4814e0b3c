"""Locate and load the compiled kernel library (a plain C ABI shared object)."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

LIBRARY_NAME = "libsparkseal_kernels.so"
LIBRARY_ENV = "SPARKSEAL_KERNELS_LIB"


def library_path() -> Path:
    """Return the kernel library's path: ``$SPARKSEAL_KERNELS_LIB`` if set, else the packaged copy."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "_lib" / LIBRARY_NAME


@functools.cache
def load() -> ctypes.CDLL:
    """Load the kernel library once; raise ``OSError`` naming the path when it is missing."""
    path = library_path()
    if not path.is_file():
        raise OSError(
            f"sparkseal kernel library not found at {path}: build the sparkseal wheel "
            f"(//kernels_sm121:wheel_<platform>) or set {LIBRARY_ENV}"
        )
    return ctypes.CDLL(str(path))
