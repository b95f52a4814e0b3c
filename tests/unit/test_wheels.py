"""The wheel tags a platform supports, in pip's order, and the rank that picks the most specific wheel."""

from __future__ import annotations

import pytest

from sparkseal.core.wheels import supported_tags, tag_rank


def test_supported_tags_follow_pips_order() -> None:
    tags = pytest.importorskip("pip._vendor.packaging.tags")
    for platform, arch in [("linux_aarch64", "aarch64"), ("linux_x86_64", "x86_64")]:
        oldest = 17 if arch == "aarch64" else 5
        plats = []
        for minor in range(36, oldest - 1, -1):
            plats.append(f"manylinux_2_{minor}_{arch}")
            legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(minor)
            if legacy and (legacy == "manylinux2014" or arch == "x86_64"):
                plats.append(f"{legacy}_{arch}")
        plats.append(platform)
        expected = [str(t) for t in tags.cpython_tags((3, 11), ["cp311"], plats)]
        expected += [str(t) for t in tags.compatible_tags((3, 11), "cp311", plats)]
        assert list(supported_tags(platform)) == expected


def test_tag_rank_prefers_the_most_specific_wheel() -> None:
    names = [
        "p-1-py3-none-any.whl",
        "p-1-cp38-abi3-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
        "p-1-cp311-cp311-manylinux_2_17_aarch64.whl",
        "p-1-cp311-cp311-manylinux_2_28_aarch64.whl",
    ]
    ranks = [tag_rank(n, "linux_aarch64") for n in names]
    assert None not in ranks
    assert sorted(names, key=lambda n: tag_rank(n, "linux_aarch64") or 0) == names[::-1]
    assert tag_rank("p-1-cp311-cp311-manylinux_2_34_aarch64.whl", "linux_x86_64") is None
