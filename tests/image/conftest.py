"""The real images, built once for every test that needs one."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkseal.core.platforms import PLATFORMS
from tests.bazel_util import Workspace


@pytest.fixture(scope="session")
def built_images(real_workspace: Workspace) -> dict[str, Path]:
    """Each platform's image layout (``bazel-bin/image_<platform>``), both images and their ``.load``
    programs built by one ``bazel build``.

    One command rather than one per platform: Bazel schedules the two images' layer actions together, so
    a core that one image's last long actions (the torch layer, the image assembly) leave idle works on
    the other's, and the repository is analysed once.
    """
    targets = [f"//:image_{platform}{suffix}" for platform in PLATFORMS for suffix in ("", ".load")]
    result = real_workspace.bazel("build", *targets, timeout=5400)
    assert result.returncode == 0, result.output[-6000:]
    return {platform: real_workspace.bin_path(f"image_{platform}") for platform in PLATFORMS}
