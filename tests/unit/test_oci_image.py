"""The image's revision label: this repository's commit with `--stamp` (Bazel's stable status file), no
revision label without it. The rest of the image action: tests/image/test_oci.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkseal.actions import oci_image
from sparkseal.core import oci as oci_core
from tests.image.test_oci import make_layers

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
STATUS = (
    "BUILD_HOST builder\nBUILD_USER someone\n"
    f"STABLE_SPARKSEAL_SOURCE_COMMIT {COMMIT}\nSTABLE_SPARKSEAL_SOURCE_TREE {{tree}}\n"
    "STABLE_SPARKSEAL_SOURCE_URI git+https://git.example.org/acme/sparkseal.git@refs/heads/main\n"
)


def _assemble(root: Path, *extra: str) -> tuple[int, dict[str, str]]:
    """Run the action over the fixture layers; its exit status and the image config's labels."""
    args = [
        "--platform",
        "linux_aarch64",
        "--tag",
        "sparkseal/t:1",
        "--label",
        "org.opencontainers.image.title=t",
    ]
    for layer in make_layers(root / "in"):
        name = layer.name.rpartition(":")[2]
        args += ["--layer", layer.name, str(root / "in" / f"{name}.json"), str(layer.blob)]
    layout = root / "layout"
    code = oci_image.main([*args, *extra, "--layout", str(layout), "--digest", str(root / "image.digest")])
    if code:
        return code, {}
    image = oci_core.read_image(layout)
    config = json.loads(oci_core.blob_path(layout, image.manifest["config"]["digest"]).read_bytes())
    return code, config["config"]["Labels"]


def test_without_stamping_the_image_names_no_revision(tmp_path: Path) -> None:
    assert _assemble(tmp_path) == (0, {"org.opencontainers.image.title": "t"})


@pytest.mark.parametrize(("tree", "revision"), [("clean", COMMIT), ("dirty", COMMIT + "-dirty")])
def test_stamping_labels_the_revision_with_this_repositorys_commit(
    tmp_path: Path, tree: str, revision: str
) -> None:
    status = tmp_path / "stable-status.txt"
    status.write_text(STATUS.format(tree=tree))
    code, labels = _assemble(tmp_path, "--revision-from", str(status))
    assert (code, labels) == (
        0,
        {"org.opencontainers.image.revision": revision, "org.opencontainers.image.title": "t"},
    )


def test_stamping_an_unknown_source_or_over_a_given_revision_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = tmp_path / "stable-status.txt"
    status.write_text("BUILD_HOST h\nSTABLE_SPARKSEAL_SOURCE_UNKNOWN the workspace is not a git checkout\n")
    assert _assemble(tmp_path / "a", "--revision-from", str(status))[0] == 1
    assert capsys.readouterr().err.strip() == (
        f"sparkseal: --stamp: {status}: the revision label needs the source commit, which is unknown: the "
        "workspace is not a git checkout"
    )
    status.write_text(STATUS.format(tree="clean"))
    given = ["--label", "org.opencontainers.image.revision=752a3a504485790a2e8491cacbb35c137339ad34"]
    assert _assemble(tmp_path / "b", *given, "--revision-from", str(status))[0] == 1
    assert capsys.readouterr().err.strip() == (
        "sparkseal: --label org.opencontainers.image.revision: expected it only from "
        f"--revision-from {status} (--stamp), found it given as '752a3a504485790a2e8491cacbb35c137339ad34'"
    )


def test_the_image_rules_name_no_revision_and_vllms_commit_as_vllms() -> None:
    """rules/private/image.bzl: the revision label is left to stamping; vLLM's commit is named as vLLM's."""
    text = (Path(__file__).resolve().parents[2] / "rules/private/image.bzl").read_text()
    assert "org.opencontainers.image.revision" not in text.split("labels = {", 1)[1].split("}", 1)[0]
    assert '"vLLM %s (commit %s)' in text
