"""Which files one part of a distribution installed as two layers keeps (``sparkseal.core.wheel_split``).

With ``--split`` (a split file, ``sparkseal.core.wheel_split``) and ``--split-part``, the layer holds one
part of a distribution installed as two layers: ``lower`` installs the upstream wheel the split names and
leaves out the split's paths, their bytecode and the ``.dist-info``; ``upper`` installs our wheel and keeps
only those. Each part's module manifest names its own files, and the two merge into that of our wheel.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sparkseal.core.digests import sha256_file
from sparkseal.core.layer_plan import LayerError
from sparkseal.core.wheel_split import LOWER, UPPER, WheelSplit
from sparkseal.install.venv import python_dirs


def split_keep(
    split: WheelSplit, part: str, scratch: Path, venv: str, wheels: list[Path]
) -> Callable[[str], bool]:
    """The predicate on venv-relative paths of the files that ``part`` of ``split`` holds.

    Checks first that the layer installed the split's distribution and, for the lower part, that it
    installed the upstream wheel the split was computed against.
    """
    site = python_dirs(venv)["purelib"].removeprefix(venv.rstrip("/") + "/")
    if not (scratch / venv.strip("/") / site / split.dist_info).is_dir():
        names = ", ".join(w.name for w in wheels)
        raise LayerError(
            f"--split: expected the layer's wheels ({names}) to install {split.dist_info}, found no such "
            f"directory in {site}"
        )
    if part == LOWER:
        upstream = [w for w in wheels if w.name == split.upstream_file]
        if not upstream:
            raise LayerError(
                f"--split-part lower: expected the upstream wheel {split.upstream_file} among the layer's "
                f"wheels, found {', '.join(w.name for w in wheels)}"
            )
        found = sha256_file(upstream[0])
        if found != split.upstream_sha256:
            raise LayerError(
                f"--split-part lower: {upstream[0]}: expected sha256 {split.upstream_sha256} (the wheel the "
                f"split was computed against), found {found}"
            )
    upper_keys = split.upper_keys()

    def keep(rel: str) -> bool:
        upper = rel.startswith(site + "/") and split.is_upper(rel[len(site) + 1 :], upper_keys)
        return upper == (part == UPPER)

    return keep


def image_keep(venv_keep: Callable[[str], bool], venv: str, part: str) -> Callable[[str], bool]:
    """``venv_keep`` (see :func:`split_keep`) as a predicate on image paths."""
    # Image paths outside the venv (none today) stay with the lower part, as the venv's scripts do.
    prefix = venv.strip("/") + "/"

    def keep(path: str) -> bool:
        return venv_keep(path[len(prefix) :]) if path.startswith(prefix) else part == LOWER

    return keep
