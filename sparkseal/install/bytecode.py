"""Byte-compile an installed virtual environment: ``.pyc`` files whose bytes depend only on the sources.

Why: the image runs with ``PYTHONDONTWRITEBYTECODE=1`` (bytecode written at run time would be a foreign
file to the module check), so without shipped bytecode every start of every rank compiles each module it
imports again. Shipped ``.pyc`` files are module files like any other: the installed distribution's
RECORD lists them, the module manifest hashes them and the start-up check verifies them.

The files are *unchecked-hash* pycs (PEP 552): the header holds the source's SipHash instead of an mtime,
and the interpreter does not re-read the source to validate them. Images are immutable and the module
check hashes source and bytecode alike, so checking at import would only cost time.

Three things make their bytes reproducible:

* the file name compiled into each code object is the module's path inside the image, not the path of
  the action's scratch directory;
* the hash seed is fixed (``PYTHONHASHSEED=0``): it orders the members of frozenset constants;
* ``marshal`` writes a back-reference only for objects referenced more than once *in the whole process*,
  so a file's bytes can depend on what the process compiled before it (measured: 2 of 4495 torch and
  vLLM modules changed when the same process compiled them in reverse order). Each fixed chunk of files
  is therefore compiled by a fresh interpreter, in sorted order; the chunks depend only on the file list,
  never on the number of workers that run them.

Bytecode is specific to the interpreter's minor version, not to the CPU: the build's ``python3`` compiles
for both image platforms, and a build whose ``python3`` is not the image's minor version is refused.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import py_compile
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sparkseal.core.digests import record_hash
from sparkseal.core.wheels import PYTHON_VERSION

# Files per fresh interpreter: large enough that starting one (~20 ms) is a small part of compiling its
# chunk, small enough that the two CPUs of a CI machine share a venv's chunks evenly.
CHUNK_FILES = 256
# The hash seed of the compiling interpreters (see the module docstring).
HASH_SEED = "0"
CACHE_TAG = f"cpython-{PYTHON_VERSION[0]}{PYTHON_VERSION[1]}"


class BytecodeError(Exception):
    """Bytecode cannot be written for this image: wrong interpreter, a failed compiler process."""


def check_interpreter() -> None:
    """Refuse to compile with an interpreter whose bytecode the image's Python would not load."""
    found = f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}"
    expected = f"cpython {PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}"
    if found != expected or sys.implementation.cache_tag != CACHE_TAG:
        raise BytecodeError(
            f"{sys.executable}: bytecode for the image needs the image's interpreter version, expected "
            f"{expected} (cache tag {CACHE_TAG}), found {found} (cache tag {sys.implementation.cache_tag})"
        )


def chunks(sources: Sequence[str], size: int | None = None) -> list[list[str]]:
    """Split the sorted sources into fixed runs (``CHUNK_FILES``): the same chunks for any worker count."""
    size = size or CHUNK_FILES
    ordered = sorted(sources)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def compile_files(site: Path, image_site: str, sources: Sequence[str]) -> list[tuple[str, str]]:
    """Compile ``sources`` (paths relative to ``site``) in this process; return (source, pyc) pairs.

    A source that is not valid Python (a template, a Python 2 file shipped as data) gets no pyc, as with
    ``compileall``: importing it fails with or without one.
    """
    written = []
    for rel in sources:
        pyc = importlib.util.cache_from_source(rel, optimization="")
        try:
            py_compile.compile(
                str(site / rel),
                cfile=str(site / pyc),
                dfile=f"{image_site}/{rel}",
                doraise=True,
                optimize=0,
                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
            )
        except py_compile.PyCompileError:
            continue
        written.append((rel, pyc))
    return written


def _run_chunk(site: Path, image_site: str, sources: list[str]) -> list[tuple[str, str]]:
    env = {**os.environ, "PYTHONHASHSEED": HASH_SEED, "PYTHONDONTWRITEBYTECODE": "1"}
    request = json.dumps({"site": str(site), "image_site": image_site, "sources": sources})
    done = subprocess.run(
        [sys.executable, "-m", __name__],
        input=request,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise BytecodeError(
            f"{site}: the compiler process for {sources[0]} .. {sources[-1]} exited with "
            f"{done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    return [(source, pyc) for source, pyc in json.loads(done.stdout)]


def compile_tree(site: Path, image_site: str, sources: Sequence[str], workers: int) -> list[tuple[str, str]]:
    """Compile ``sources`` below ``site`` in fresh interpreters, ``workers`` at a time; (source, pyc) pairs.

    ``image_site`` is the site-packages directory as the image will have it (the file names compiled in).
    """
    check_interpreter()
    work = chunks(sources)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda chunk: _run_chunk(site, image_site, chunk), work))
    return sorted(pair for written in results for pair in written)


def record_row(path: Path, key: str) -> list[str]:
    """A RECORD row for the file at ``path``: its key, RECORD-form sha256 and size (PEP 376/627)."""
    data = path.read_bytes()
    return [key, record_hash(data), str(len(data))]


def add_to_record(record: Path, site: Path, pycs: Sequence[str]) -> None:
    """Add rows for ``pycs`` (relative to ``site``) to an installed RECORD, keeping its rows sorted.

    The distribution owns the bytecode of its own sources, as pip records it, so the module manifest
    files them under that distribution.
    """
    rows = [row for row in csv.reader(io.StringIO(record.read_text(encoding="utf-8"))) if row]
    rows += [record_row(site / pyc, pyc) for pyc in pycs]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(sorted(rows, key=lambda row: row[0]))
    record.write_text(text.getvalue(), encoding="utf-8")


def _worker() -> int:
    request = json.loads(sys.stdin.read())
    written = compile_files(Path(request["site"]), request["image_site"], request["sources"])
    sys.stdout.write(json.dumps(written))
    return 0


if __name__ == "__main__":
    sys.exit(_worker())
