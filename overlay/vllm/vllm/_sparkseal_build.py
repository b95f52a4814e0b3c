"""Build record of this vLLM, as sparkseal wrote it into the wheel's ``.dist-info/sparkseal.json``.

It names the locked commit, the upstream wheel (file and sha256) whose compiled files were kept, and every
patch of the series (file and sha256), so that a running process can say which fixes it carries.
"""

from __future__ import annotations

import json
from importlib import metadata

RECORD_FILE = "sparkseal.json"


def build_record() -> dict[str, object]:
    """Return the build record of the installed ``vllm`` distribution.

    Raises ``LookupError`` when the installed vLLM was not built by sparkseal.
    """
    text = metadata.distribution("vllm").read_text(RECORD_FILE)
    if text is None:
        raise LookupError(f"the installed vllm has no {RECORD_FILE} in its dist-info: not a sparkseal build")
    return json.loads(text)


def applied_patches() -> list[str]:
    """Return the file names of the patches applied to this vLLM, in series order."""
    patches = build_record()["patches"]
    assert isinstance(patches, list)
    return [entry["file"] for entry in patches]
