"""A Python preamble that records every module compiled from source, for scripts run inside an image.

Scripts start with ``PROBE`` and read the list ``compiled`` (source paths) after their imports: with the
image's shipped bytecode, imports compile nothing. Used by the image tests and ``bench/startup.py``.
"""

from __future__ import annotations

PROBE = """
import importlib._bootstrap_external as _ext
compiled = []
_to_code = _ext.SourceLoader.source_to_code
def _counting(self, data, path, *, _optimize=-1):
    compiled.append(path)
    return _to_code(self, data, path, _optimize=_optimize)
_ext.SourceLoader.source_to_code = _counting
"""
