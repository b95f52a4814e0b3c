"""`sparkseal verify` on a small workspace: identical rebuilds pass, a leak is traced to its file."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bazel_util import BAZEL, MINIMAL_WORKSPACE, base_env, make_fixture_workspace

pytestmark = pytest.mark.bazel

# `leaky` writes the action's working directory, which contains the output base: a real-world kind of
# non-determinism that only a rebuild elsewhere reveals.
BUILD = """\
load("//rules:defs.bzl", "oci_image", "oci_layer")

genrule(name = "stable", outs = ["stable.txt"], cmd = "echo hello > $@")

genrule(name = "leaky", outs = ["leaky.txt"], cmd = "echo built in $$PWD > $@")

oci_layer(name = "layer_stable", files = {":stable": "/etc/stable.txt"})

oci_layer(name = "layer_leaky", files = {":leaky": "/etc/leaky.txt"})

oci_image(
    name = "image",
    layers = [":layer_stable", ":layer_leaky"],
    platform = "linux_x86_64",
)
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if BAZEL is None:
        pytest.fail("bazel is not installed: run `make setup`")
    root = tmp_path_factory.mktemp("verify") / "checkout"
    root.mkdir()
    make_fixture_workspace(root, MINIMAL_WORKSPACE)
    (root / "BUILD").write_text(BUILD)
    rc = (root / ".bazelrc").read_text()
    output_base = root.parent / "first-output-base"
    (root / ".bazelrc").write_text(
        f"startup --output_base={output_base}\nstartup --max_idle_secs=30\n{rc}\n"
        f"build --repository_cache={root.parent / 'repository-cache'}\n"
    )
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    yield root
    subprocess.run([BAZEL, "shutdown"], cwd=root, env=base_env(), check=False, capture_output=True)


def _verify(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkseal", "verify", "--workspace", str(workspace), *args],
        cwd=workspace,
        env=base_env(PYTHONPATH=str(Path(__file__).resolve().parents[2])),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_an_identical_rebuild_passes_and_lists_the_variations(workspace: Path) -> None:
    result = _verify(workspace, "//:stable")
    assert result.returncode == 0, result.stdout + result.stderr
    for variation in (
        "checkout path",
        "output base",
        "TZ",
        "LANG/LC_ALL",
        "umask",
        "HOME",
        "file creation order",
    ):
        assert f"  {variation}: " in result.stdout
    assert result.stdout.splitlines()[-1].startswith("PASSED: identical: 1 outputs")
    assert result.stdout.splitlines()[0] == "source: UNKNOWN: the git checkout has no commit yet"


def test_a_leaking_file_is_named_by_image_layer_and_member(workspace: Path, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    result = _verify(workspace, "//:image", "--report-dir", str(reports))
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "DIFFERS image\n" in out
    assert "layer //:layer_leaky: sha256:" in out
    assert "etc/leaky.txt: file mode 0644 owner 0:0 mtime 315532800" in out
    assert "layer //:layer_stable" not in out
    assert "DIFFERS image.digest" in out
    assert out.splitlines()[-1].startswith("FAILED: ")
    summary = json.loads((reports / "image.vsa.intoto.json").read_text())["predicate"]
    assert summary["verificationResult"] == "FAILED"
    differences = summary["urn:sparkseal:verify:inputs:v1"]["differences"]
    [image] = [d for d in differences if d["artifact"] == "image"]
    assert [layer["layer"] for layer in image["layers"]] == ["//:layer_leaky"]
    report_lines = [line.split("report: ", 1)[1] for line in out.splitlines() if "report: " in line]
    if shutil.which("diffoscope"):
        member_report = next(r for r in report_lines if r.endswith("leaky.txt.diffoscope.txt"))
        text = Path(member_report).read_text()
        assert "built in" in text and "first-output-base" in text
    else:
        assert "no diffoscope report: diffoscope is not installed" in report_lines[0]


def test_against_a_published_digest(workspace: Path) -> None:
    published = "sha256:" + hashlib.sha256(b"hello\n").hexdigest()
    good = _verify(workspace, "//:stable", "--against", published)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.splitlines()[-1].startswith(f"PASSED: identical: digest {published} as published")
    wrong = "sha256:" + "0" * 64
    bad = _verify(workspace, "//:stable", "--against", wrong)
    assert bad.returncode == 1
    assert f"expected {wrong} (published), actual {published} (rebuilt)" in bad.stdout


def test_usage_errors_and_failed_builds_exit_2(workspace: Path) -> None:
    two = _verify(workspace, "//:stable", "//:leaky", "--against", "sha256:" + "1" * 64)
    assert two.returncode == 2
    assert "--against compares one target's digest, got 2 targets: //:stable //:leaky" in two.stderr
    short = _verify(workspace, "//:stable", "--against", "abc")
    assert short.returncode == 2 and "expected sha256:<64 hex digits>" in short.stderr
    missing = _verify(workspace, "//:nothing")
    assert missing.returncode == 2
    assert "sparkseal verify: no verdict: bazel build //:nothing in " in missing.stderr
    assert "failed (1)" in missing.stderr
