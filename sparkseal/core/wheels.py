"""Wheel file names and tags: which wheel is which project, and where it installs.

One home for the PEP 427 filename split, the PEP 503 project name and the tag list of the image's
interpreter, so the installer, the PEX builder, the lock command and the provenance all agree on them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkseal.core.platforms import PLATFORMS as IMAGE_PLATFORMS

# The image platforms plus ``any``: the pure-Python build tools, which run on every build host.
PLATFORMS = (*IMAGE_PLATFORMS, "any")
# The target interpreter: Debian bookworm's python3 (3.11) and glibc 2.36. A wheel installs when one of its
# tags is among supported_tags(platform); the order of that list is pip's preference (best first).
PYTHON_VERSION = (3, 11)
GLIBC = (2, 36)
# The oldest glibc a manylinux tag names, per architecture (as pip's `packaging` counts them).
_OLDEST_GLIBC_MINOR = {"x86_64": 5, "aarch64": 17}
# PEP 600 aliases of the legacy manylinux tags.
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


class WheelError(ValueError):
    """A wheel file name is malformed or names an unknown platform; the message names it."""


@dataclass(frozen=True)
class WheelName:
    """The parts of a wheel filename (PEP 427)."""

    project: str
    version: str
    tags: tuple[str, ...]


def normalize_name(name: str) -> str:
    """The PEP 503 form of a project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_filename(filename: str) -> WheelName:
    """Split ``NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl``; the compressed tag sets are expanded."""
    parts = filename[: -len(".whl")].split("-") if filename.endswith(".whl") else []
    if len(parts) not in (5, 6) or not all(parts):
        raise WheelError(
            f"{filename}: not a wheel filename (expected NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl)"
        )
    pythons, abis, platforms = (p.split(".") for p in parts[-3:])
    tags = tuple(f"{py}-{abi}-{plat}" for py in pythons for abi in abis for plat in platforms)
    return WheelName(project=normalize_name(parts[0]), version=parts[1], tags=tags)


def _platform_tags(platform: str) -> list[str]:
    arch = platform.removeprefix("linux_")
    tags = []
    for minor in range(GLIBC[1], _OLDEST_GLIBC_MINOR[arch] - 1, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        legacy = _LEGACY_MANYLINUX.get(minor)
        if legacy and (legacy == "manylinux2014" or arch == "x86_64"):
            tags.append(f"{legacy}_{arch}")
    return [*tags, platform]


def supported_tags(platform: str) -> tuple[str, ...]:
    """The wheel tags CPython 3.11 accepts on ``platform``, best first, as pip orders them.

    ``any`` accepts pure-Python wheels only (the tools that run on every build host).
    """
    if platform not in PLATFORMS:
        raise WheelError(f"platform {platform!r}: expected one of {', '.join(PLATFORMS)}")
    major, minor = PYTHON_VERSION
    cp = f"cp{major}{minor}"
    plats = [] if platform == "any" else _platform_tags(platform)
    tags = [f"{cp}-{abi}-{p}" for abi in (cp, "abi3", "none") for p in plats]
    tags += [f"cp{major}{m}-abi3-{p}" for m in range(minor - 1, 1, -1) for p in plats]
    pys = [f"py{major}{minor}", f"py{major}", *(f"py{major}{m}" for m in range(minor - 1, -1, -1))]
    tags += [f"{py}-none-{p}" for py in pys for p in plats]
    tags += [f"{cp}-none-any", *(f"{py}-none-any" for py in pys)]
    return tuple(tags)


def tag_rank(filename: str, platform: str) -> int | None:
    """The preference of a wheel on ``platform`` (0 is best), or None when it does not install there."""
    ranks = {tag: i for i, tag in enumerate(supported_tags(platform))}
    found = [ranks[tag] for tag in parse_wheel_filename(filename).tags if tag in ranks]
    return min(found) if found else None


def describe_target(platform: str) -> str:
    """Words for the target of ``platform``, for error messages."""
    python = f"CPython {PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}"
    if platform == "any":
        return f"{python}, pure Python (py3-none-any)"
    return f"{python} on {platform}, manylinux glibc <= {GLIBC[0]}.{GLIBC[1]}"


def check_wheels(wheels: Sequence[Path], platform: str) -> list[Path]:
    """Fail unless every wheel installs on ``platform`` and no project comes twice; return them sorted."""
    owners: dict[str, Path] = {}
    for wheel in wheels:
        name = parse_wheel_filename(wheel.name)
        if tag_rank(wheel.name, platform) is None:
            raise WheelError(
                f"{wheel}: tags {', '.join(name.tags)} do not install on {describe_target(platform)}"
            )
        if name.project in owners:
            raise WheelError(f"project {name.project} comes twice: {owners[name.project]} and {wheel}")
        owners[name.project] = wheel
    return sorted(wheels, key=lambda w: w.name)


def wheel_name_or_none(filename: str) -> WheelName | None:
    """The parts of a wheel filename, or None for an sdist or any other file an index lists."""
    try:
        return parse_wheel_filename(filename)
    except WheelError:
        return None


def platform_tags(name: WheelName) -> tuple[str, ...]:
    """The platform parts of a wheel's tags (``manylinux_2_28_x86_64``, ``any``), in order, once each."""
    return tuple(dict.fromkeys(tag.split("-")[2] for tag in name.tags))
