"""Writing the files that people review (locks): whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sparkseal.core.determinism import FILE_MODE


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that no reader ever sees a half-written file."""
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        temp.chmod(FILE_MODE)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
