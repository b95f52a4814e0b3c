"""docs/auditing.md's walkthrough, from a registry digest to a verdict, run as the page writes it.

The page's `audit` recipe (tests/recipe.py reads its blocks; tests/unit/test_recipe.py checks their order
and variables) runs step by step, each in a bash of its own, with only the `vars` step's values
substituted: the registry is Debian's `docker-registry` on a loopback port (tests/servers/registry_server.py,
stopped by pid), reached over plain HTTP through the user's registries.conf (in a HOME of the test's) that
marks that one address insecure, as an auditor's own configuration would for a registry without TLS
(Debian's skopeo 1.9 reads no CONTAINERS_REGISTRIES_CONF); `sparkseal` on PATH is this checkout's, as
`make tools` installs it.

What is pushed there is a small image, not the real one: the project's own rules (`oci_layer`,
`oci_image`, `sbom`, `sbom_cyclonedx`) build it on a fixture workspace that is a committed git checkout, so
that the page's `verify` step, a full rebuild in a fresh output base, rebuilds that workspace in tens of
seconds rather than the real image in the time of a cold `make image`, and nothing here pushes or copies
gigabytes. It holds what the walkthrough reads: an `/etc/passwd` whose home directory only the image
allow-list (third_party/scan/image-allow.json, copied into fixture workspaces) lets through, so the `scan`
step passes only where `scan --image` reads that list; and both SBOMs at their paths in the last layer.
The publisher's side is what a release does: the provenance action's statement over the built image
digest and both SBOMs (tests/unit/test_provenance.py's fixture for the rest: its locks, a small PEX and
module manifest), with the source the workspace status command records of the fixture checkout, signed
by `sparkseal provenance sign`'s code with a key made here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkseal.actions import oci_push
from sparkseal.audit.provenance_sign import sign
from sparkseal.core.oci import read_image
from tests.bazel_util import BAZEL, MINIMAL_WORKSPACE, REPO, Workspace, base_env, make_fixture_workspace
from tests.recipe import AUDITING_PAGE, recipe_steps, script, steps_by_name, substitute
from tests.servers.registry_server import REGISTRY, Registry
from tests.unit.test_provenance import make_build
from tests.unit.test_provenance_sign import _keys
from tests.unit.test_sbom import SBOM_FIXTURE_TARGETS, write_inputs
from tests.unit.test_workspace_status import _git

pytestmark = pytest.mark.bazel

STEPS = ["vars", "copy", "provenance", "checkout", "verify", "scan", "sbom", "vsa"]
REMOTE = "https://git.example.org/acme/sparkseal.git"
# The service account's home directory: the image allow-list's `etc/passwd` home-path entry lets it
# through (written in pieces, so that the repository's own scan does not read it as a person's home).
SERVICE_HOME = "/" + "home/vllm"

BUILD = (
    'load("//rules:defs.bzl", "oci_image", "oci_layer", "sbom", "sbom_cyclonedx")\n\n'
    + SBOM_FIXTURE_TARGETS
    + f"""
SCAN_ALLOW = "//third_party/scan:image-allow.json"

genrule(
    name = "accounts",
    outs = ["accounts"],
    cmd = "echo 'vllm:x:1000:1000::{SERVICE_HOME}:/bin/sh' > $@",
)

# One layer (each is a scan more, in the build and in its rebuild): the last, as the real app layer is.
oci_layer(
    name = "layer_app",
    files = {{
        ":accounts": "/etc/passwd",
        ":sbom": "/opt/sparkseal/sbom.spdx.json",
        ":sbom_cyclonedx": "/opt/sparkseal/sbom.cdx.json",
    }},
    scan_allow = SCAN_ALLOW,
)

oci_image(
    name = "image",
    layers = [":layer_app"],
    platform = "linux_aarch64",
)
"""
)


def _fixture_checkout(checkout: Path, repository_cache: Path) -> str:
    """The fixture workspace as a clean git checkout on branch main with a remote; return its commit. Its
    .bazelrc names the repository cache, so that `verify`'s rebuild reads the same locked files."""
    make_fixture_workspace(checkout, MINIMAL_WORKSPACE)
    (checkout / "BUILD").write_text(BUILD)
    write_inputs(checkout / "in")
    (checkout / ".gitignore").write_text("bazel-*\n")
    rc = checkout / ".bazelrc"
    rc.write_text(f"{rc.read_text()}\nbuild --repository_cache={repository_cache}\n")
    _git(checkout, "init", "--quiet", "--initial-branch=main")
    _git(checkout, "add", "--all")
    _git(checkout, "commit", "--quiet", "--message", "the audited build")
    _git(checkout, "remote", "add", "origin", REMOTE)
    return _git(checkout, "rev-parse", "HEAD")


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    if not Path(REGISTRY).exists():
        pytest.fail(f"{REGISTRY}: docker-registry is not installed: run make setup")
    with Registry(tmp_path / "registry") as server:
        yield server


def test_the_auditors_walkthrough_runs_as_written(tmp_path: Path, registry: Registry) -> None:
    if BAZEL is None:
        pytest.fail("bazel is not installed: run make setup")
    steps = steps_by_name(recipe_steps(AUDITING_PAGE.read_text(), "audit", AUDITING_PAGE), STEPS, "audit")
    checkout = tmp_path / "checkout"
    cache = tmp_path / "repository-cache"
    commit = _fixture_checkout(checkout, cache)

    # The publisher: build, write and sign the provenance, push by digest.
    workspace = Workspace(checkout, tmp_path / "output-base", cache, base_env())
    try:
        built = workspace.bazel("build", "//:image", "//:sbom", "//:sbom_cyclonedx")
        assert built.returncode == 0, built.output[-6000:]
        bazel_bin = workspace.bin_path("")
    finally:
        workspace.shutdown()
    layout, digest = bazel_bin / "image", (bazel_bin / "image.digest").read_text().strip()
    status = subprocess.run(
        [sys.executable, "-m", "sparkseal.fetch.workspace_status", "--root", str(checkout)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"STABLE_SPARKSEAL_SOURCE_COMMIT {commit}\n" in status and "TREE clean" in status, status
    sboms = (bazel_bin / "sbom.spdx.json", bazel_bin / "sbom_cyclonedx.cdx.json")
    release = make_build(tmp_path / "release", digest, sboms, status)
    keys = tmp_path / "keys"
    keys.mkdir()
    builder, builder_pub = _keys(keys, "builder")
    auditor, _ = _keys(keys, "auditor")
    envelope = sign(release.statement, builder, None)
    assert oci_push.main([f"{registry.host}/sparkseal/vllm:published", "--layout", str(layout)]) == 0

    # The auditor: the page's commands, with this machine's values.
    work = tmp_path / "audit"
    values = {
        "IMAGE": f"{registry.host}/sparkseal/vllm",
        "DIGEST": digest,
        "PROVENANCE": str(envelope),
        "PUBKEY": str(builder_pub),
        "KEY": str(auditor),
        "CHECKOUT": str(checkout),
        "WORK": str(work),
    }
    variables = substitute(steps["vars"], values, AUDITING_PAGE)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "sparkseal").write_text(f'#!/bin/sh\nexec {sys.executable} -m sparkseal "$@"\n')
    (tools / "sparkseal").chmod(0o755)
    home = tmp_path / "home"
    registries = home / ".config/containers/registries.conf"
    registries.parent.mkdir(parents=True)
    registries.write_text(f'[[registry]]\nlocation = "{registry.host}"\ninsecure = true\n')
    environment = base_env(
        HOME=str(home), PATH=f"{tools}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(REPO)
    )

    def run_step(name: str) -> list[str]:
        done = subprocess.run(
            ["bash", "-c", script(variables, steps[name], AUDITING_PAGE)],
            env=environment, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"{AUDITING_PAGE}:{steps[name].line}: step {name}: expected exit 0, got {done.returncode}\n"
            f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
        )
        return done.stdout.splitlines()

    run_step("copy")
    assert read_image(work / "image").digest == digest

    checked = run_step("provenance")
    assert checked[:2] == [
        f"ok signature (ed25519) verifies with {builder_pub}",
        f"source: git+{REMOTE}@refs/heads/main commit {commit} (clean tree)",
    ]
    assert checked[-1] == "PASSED: 3 checks, 0 differ; 4 subjects not checked"  # manifest, config, layer

    assert run_step("checkout") == [f"{commit} the audited build"]

    verified = run_step("verify")
    assert verified[-1].startswith(f"PASSED: identical: digest {digest} as published"), verified

    scanned = run_step("scan")
    assert scanned[-1].startswith("3 files scanned, 0 finding(s), 1 allowed "), scanned

    listed = run_step("sbom")
    assert listed[0].startswith("CycloneDX 1.6 sparkseal-vllm-0.25.1-linux_aarch64 "), listed
    assert any(line.startswith("  vllm 0.25.1 pkg:pypi/vllm@0.25.1?") for line in listed), listed
    assert listed[-1] == "PASSED: 2 checks, 0 differ; 3 subjects not checked"

    summary = run_step("vsa")
    vsa = work / "verify" / "image.vsa.intoto.json"
    assert summary[:2] == [
        f"//:image {digest}",
        f"PASSED ['SPARKSEAL_REBUILT_IDENTICAL'] {json.loads(vsa.read_text())['predicate']['timeVerified']}",
    ]
    assert summary[3].startswith("source {") and f'"gitCommit": "{commit}"' in summary[3], summary
    assert summary[-1] == str(work / "verify" / "image.vsa.intoto.dsse.json")
