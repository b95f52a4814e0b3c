"""SLSA provenance: the statement the action writes, its determinism, and the rules that run it.

`sparkseal provenance check` on the statement: test_provenance_check.py.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkseal import cli
from sparkseal.actions import provenance, sbom
from sparkseal.actions.sparkseal_pex import tree_digest
from tests.bazel_util import BAZEL, MINIMAL_WORKSPACE, REPO, Workspace, base_env, make_fixture_workspace
from tests.unit.test_sbom import (
    COMMIT,
    PLATFORM,
    SBOM_FIXTURE_TARGETS,
    Inputs,
    reversed_flags,
    sbom_args,
    write_inputs,
)

TAG = "sparkseal/vllm:0.25.1-linux_aarch64"
# The source of the fake build, as Bazel's stable status file holds it (beside Bazel's own keys).
SOURCE_COMMIT = "0123456789abcdef0123456789abcdef01234567"
SOURCE_URI = "git+https://git.example.org/acme/sparkseal.git@refs/heads/main"
STATUS = (
    "BUILD_EMBED_LABEL \nBUILD_HOST builder\nBUILD_USER someone\n"
    f"STABLE_SPARKSEAL_SOURCE_COMMIT {SOURCE_COMMIT}\nSTABLE_SPARKSEAL_SOURCE_TREE clean\n"
    f"STABLE_SPARKSEAL_SOURCE_URI {SOURCE_URI}\n"
)
SCANNER_LOCK = Path(__file__).resolve().parents[2] / "third_party/scan/scanner.lock.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _blob(layout: Path, data: bytes) -> str:
    digest = _sha(data)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return "sha256:" + digest


def write_layout(layout: Path) -> str:
    """A small OCI image layout (config, two layers, manifest, index); return the manifest digest."""
    (layout / "blobs" / "sha256").mkdir(parents=True)
    layers = [_blob(layout, f"layer {n}".encode()) for n in range(2)]
    config = _blob(layout, _canonical({"architecture": "arm64", "os": "linux"}))
    manifest = {
        "config": {"digest": config, "mediaType": "application/vnd.oci.image.config.v1+json", "size": 1},
        "layers": [{"digest": d, "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip"} for d in layers],
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "schemaVersion": 2,
    }
    digest = _blob(layout, _canonical(manifest))
    index = {"manifests": [{"digest": digest, "mediaType": manifest["mediaType"]}], "schemaVersion": 2}
    (layout / "index.json").write_bytes(_canonical(index))
    (layout / "oci-layout").write_bytes(_canonical({"imageLayoutVersion": "1.0.0"}))
    return digest


@dataclass
class Build:
    """A fake bazel-bin: the four subjects, their digest files, and the statement over them."""

    inputs: Inputs
    bin: Path
    statement: Path

    @property
    def layout(self) -> Path:
        return self.bin / "image_linux_aarch64"

    @property
    def pex(self) -> Path:
        return self.bin / "pex_linux_aarch64.pex"

    @property
    def manifest(self) -> Path:
        return self.bin / "manifest_linux_aarch64.json"

    @property
    def sbom(self) -> Path:
        return self.bin / "sbom_linux_aarch64.spdx.json"

    @property
    def cyclonedx(self) -> Path:
        return self.bin / "sbom_cyclonedx_linux_aarch64.cdx.json"


def provenance_args(build: Build, out: Path) -> list[str]:
    """The action's command line over the fake bazel-bin."""
    inputs = build.inputs
    args = [
        "--platform", PLATFORM,
        "--vllm-lock", str(inputs.vllm_lock),
        "--python-lock", str(inputs.python_lock),
        "--tools-lock", str(inputs.tools_lock),
        "--debian-lock", str(inputs.debian_lock),
        "--cuda-lock", str(inputs.cuda_lock),
        "--scanner-lock", str(SCANNER_LOCK),
        "--built-wheel", str(inputs.vllm_wheel),
        "--built-wheel", str(inputs.sparkseal_wheel),
        "--subject", "oci-image", build.layout.name, str(build.bin / "image_linux_aarch64.digest"),
        "--image-tag", TAG,
        "--subject", "pex", build.pex.name, str(build.bin / "pex_linux_aarch64.pex.digest"),
        "--subject", "module-manifest", build.manifest.name, str(build.manifest),
        "--subject", "sbom", build.sbom.name, str(build.sbom),
        "--subject", "sbom-cyclonedx", build.cyclonedx.name, str(build.cyclonedx),
        "--target", "//:image_linux_aarch64",
        "--target", "//:pex_linux_aarch64",
        "--bazel-inferred", "< 6.2",
        "--source-status", str(build.inputs.vllm_lock.parent / "stable-status.txt"),
        "--out", str(out),
    ]  # fmt: skip
    for name, path in inputs.patches:
        args += ["--patch", name, str(path)]
    return args


def make_build(
    root: Path,
    image_digest: str | None = None,
    sboms: tuple[Path, Path] | None = None,
    status: str = STATUS,
) -> Build:
    """Write fixture inputs and a fake bazel-bin, then the statement into it.

    The image is a small fake layout unless ``image_digest`` names one built elsewhere (then only its digest
    file is written: the statement records the digest); the SBOMs are the action's over the fixture inputs
    unless ``sboms`` are (SPDX, CycloneDX) files built elsewhere; ``status`` is the stable status file
    (the source)."""
    inputs = write_inputs(root / "in")
    (root / "in" / "stable-status.txt").write_text(status)
    out = root / "bazel-bin"
    out.mkdir()
    build = Build(inputs, out, out / "provenance_linux_aarch64.intoto.json")
    digest = image_digest or write_layout(build.layout)
    (out / "image_linux_aarch64.digest").write_text(digest)  # no newline, as oci.py
    build.pex.mkdir()
    (build.pex / "PEX-INFO").write_text('{"entry_point": "vllm"}')
    (build.pex / "__main__.py").write_text("print('pex')\n")
    (build.pex / ".deps" / "numpy.whl").mkdir(parents=True)
    (build.pex / ".deps" / "numpy.whl" / "numpy.py").write_text("x = 1\n")
    (out / "pex_linux_aarch64.pex.digest").write_text(tree_digest(build.pex) + "\n")
    build.manifest.write_text(json.dumps({"format": "sparkseal-module-manifest/1", "distributions": {}}))
    if sboms is None:
        assert sbom.main(sbom_args(inputs, build.sbom)) == 0
        assert sbom.main([*sbom_args(inputs, build.cyclonedx), "--format", "cyclonedx-1.6"]) == 0
    else:
        shutil.copyfile(sboms[0], build.sbom)
        shutil.copyfile(sboms[1], build.cyclonedx)
    assert provenance.main(provenance_args(build, build.statement)) == 0
    return build


@pytest.fixture
def build(tmp_path: Path) -> Build:
    return make_build(tmp_path)


def _statement(build: Build) -> dict:
    return json.loads(build.statement.read_text())


def test_the_locked_interpreter_and_compilers_are_dependencies(build: Build, tmp_path: Path) -> None:
    """Every .deb of the actions' interpreter and of the kernels' compilers is named with its sha256."""
    out = tmp_path / "toolchains.intoto.json"
    locks = {
        "interpreter": REPO / "third_party/toolchains/python_bookworm_amd64.lock.json",
        "compiler": REPO / "third_party/toolchains/cc_bookworm_amd64.lock.json",
    }
    args = [*provenance_args(build, out), "--interpreter-lock", str(locks["interpreter"])]
    assert provenance.main([*args, "--compiler-lock", str(locks["compiler"])]) == 0
    dependencies = json.loads(out.read_text())["predicate"]["buildDefinition"]["resolvedDependencies"]
    for role, lock in locks.items():
        recorded = {
            (d["name"], d["digest"]["sha256"], urllib.parse.unquote(d["uri"].split("@")[0]))
            for d in dependencies
            if d["annotations"]["role"] == role
        }
        packages = json.loads(lock.read_text())["packages"]
        assert recorded == {
            (p["filename"], p["sha256"], f"pkg:deb/debian/{p['package']}") for p in packages
        }, f"{lock}: expected each package as a {role} dependency"
    names = [urllib.parse.unquote(d["uri"]) for d in dependencies if d["annotations"]["role"] in locks]
    assert any(n.startswith("pkg:deb/debian/python3.11-minimal@3.11.2") for n in names)
    assert any(n.startswith("pkg:deb/debian/g++-12@12.2.0") for n in names)
    # Without the locks (an older build), the statement names no toolchain package.
    assert not [
        d
        for d in _statement(build)["predicate"]["buildDefinition"]["resolvedDependencies"]
        if d["annotations"]["role"] in locks
    ]


def test_zstd_layers_are_a_parameter_and_their_compressor_a_dependency(
    build: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "zstd.intoto.json"
    zstd_lock = REPO / "third_party/zstd/zstandard.lock.json"
    args = [*provenance_args(build, out), "--layer-compression", "zstd", "--zstd-lock", str(zstd_lock)]
    assert provenance.main(args) == 0
    definition = json.loads(out.read_text())["predicate"]["buildDefinition"]
    assert definition["externalParameters"]["layerCompression"] == "zstd"
    compressors = [
        d for d in definition["resolvedDependencies"] if d["annotations"]["role"] == "layer-compressor"
    ]
    files = json.loads(zstd_lock.read_text())["wheels"]["zstandard"]["files"]
    assert sorted((d["name"], d["digest"]["sha256"]) for d in compressors) == sorted(
        (f["filename"], f["sha256"]) for f in files.values()
    )
    # gzip (the default) adds neither; a zstd build must name the compressor's lock.
    assert "layerCompression" not in _statement(build)["predicate"]["buildDefinition"]["externalParameters"]
    assert provenance.main([*provenance_args(build, out), "--layer-compression", "zstd"]) == 1
    assert "--zstd-lock: expected it exactly with zstd layers, found layer compression 'zstd'" in (
        capsys.readouterr().err
    )


def test_statement_subjects(build: Build) -> None:
    statement = _statement(build)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    layout_digest = (build.bin / "image_linux_aarch64.digest").read_text().removeprefix("sha256:")
    assert statement["subject"] == [
        {
            "annotations": {"kind": "oci-image", "tag": TAG},
            "digest": {"sha256": layout_digest},
            "name": "image_linux_aarch64",
        },
        {
            "annotations": {"kind": "module-manifest"},
            "digest": {"sha256": _sha(build.manifest.read_bytes())},
            "name": "manifest_linux_aarch64.json",
        },
        {
            "annotations": {"kind": "pex"},
            "digest": {"sha256": tree_digest(build.pex).removeprefix("sha256:")},
            "name": "pex_linux_aarch64.pex",
        },
        {
            "annotations": {"kind": "sbom-cyclonedx"},
            "digest": {"sha256": _sha(build.cyclonedx.read_bytes())},
            "name": "sbom_cyclonedx_linux_aarch64.cdx.json",
        },
        {
            "annotations": {"kind": "sbom"},
            "digest": {"sha256": _sha(build.sbom.read_bytes())},
            "name": "sbom_linux_aarch64.spdx.json",
        },
    ]


def test_predicate(build: Build) -> None:
    predicate = _statement(build)["predicate"]
    definition = predicate["buildDefinition"]
    assert definition["buildType"] == provenance.BUILD_TYPE
    assert definition["externalParameters"] == {
        "cudaArchs": "",
        "platform": PLATFORM,
        "targets": ["//:image_linux_aarch64", "//:pex_linux_aarch64"],
    }
    # Bazel 4.2.3 as Debian builds it: no release reported, none declared; the range its Starlark tells.
    assert definition["internalParameters"] == {
        "bazel": {
            "declared": None,
            "inferred": "< 6.2 (from features: native.package_relative_label is absent)",
            "release": None,
        },
        "sourceDateEpoch": 315532800,
    }
    deps = definition["resolvedDependencies"]
    by_role: dict[str, list[dict]] = {}
    for dep in deps:
        by_role.setdefault(dep["annotations"]["role"], []).append(dep)
    assert deps[0] == {  # this repository's commit first: what the build is made from
        "annotations": {"role": "source", "tree": "clean"},
        "digest": {"gitCommit": SOURCE_COMMIT},
        "name": "sparkseal",
        "uri": SOURCE_URI,
    }
    assert sorted(by_role) == sorted(
        [
            "source",
            "vllm-source",
            "vllm-sdist",
            "vllm-upstream-wheel",
            "patch",
            "wheel",
            "deb",
            "toolchain",
            "build-tool",
            "secret-scanner",
        ]
    )
    assert by_role["vllm-source"] == [
        {
            "annotations": {"role": "vllm-source", "version": "0.25.1"},
            "digest": {"gitCommit": COMMIT},
            "name": "vllm",
            "uri": f"pkg:github/vllm-project/vllm@{COMMIT}",
        }
    ]
    lock = json.loads(build.inputs.vllm_lock.read_text())
    [sdist] = by_role["vllm-sdist"]
    assert (sdist["name"], sdist["digest"]) == ("vllm-0.25.1.tar.gz", {"sha256": lock["sdist"]["sha256"]})
    [upstream] = by_role["vllm-upstream-wheel"]
    assert upstream["name"] == lock["wheels"][PLATFORM]["filename"]
    assert upstream["digest"] == {"sha256": lock["wheels"][PLATFORM]["sha256"]}
    assert by_role["patch"] == [
        {
            "annotations": {"role": "patch", "series": index},
            "digest": {"sha256": _sha(path.read_bytes())},
            "name": name,
        }
        for index, (name, path) in enumerate(build.inputs.patches, start=1)
    ]
    wheels = json.loads(build.inputs.python_lock.read_text())["wheels"]
    assert {d["name"]: d["digest"]["sha256"] for d in by_role["wheel"]} == {
        w["filename"]: w["sha256"] for w in wheels.values()
    }
    debs = json.loads(build.inputs.debian_lock.read_text())["packages"]
    assert [d["name"] for d in by_role["deb"]] == sorted(p["filename"] for p in debs)
    assert {d["name"]: d["digest"]["sha256"] for d in by_role["deb"]} == {
        p["filename"]: p["sha256"] for p in debs
    }
    [nvcc] = by_role["toolchain"]
    assert nvcc["annotations"] == {"role": "toolchain", "platform": "linux_x86_64"}
    assert nvcc["uri"].startswith("pkg:pypi/nvidia-cuda-nvcc@13.0.88?")
    assert [d["name"] for d in by_role["build-tool"]] == ["pex-2.105.2-py3-none-any.whl"]
    scanner = json.loads(SCANNER_LOCK.read_text())["wheels"]["kingfisher-bin"]
    assert [(d["name"], d["digest"]["sha256"], d["annotations"]) for d in by_role["secret-scanner"]] == [
        (file["filename"], file["sha256"], {"role": "secret-scanner", "platform": key})
        for key, file in sorted(scanner["files"].items())
    ]
    assert all(
        d["uri"].startswith(f"pkg:pypi/kingfisher-bin@{scanner['version']}?")
        for d in by_role["secret-scanner"]
    )

    run = predicate["runDetails"]
    assert run["builder"] == {  # no Bazel release: the Bazel reported none
        "id": provenance.BUILDER_ID,
        "version": {"python": f"CPython {platform.python_version()}"},
    }
    assert run["byproducts"] == [
        {
            "annotations": {"role": "built-wheel"},
            "digest": {"sha256": _sha(path.read_bytes())},
            "name": path.name,
        }
        for path in (build.inputs.sparkseal_wheel, build.inputs.vllm_wheel)
    ]
    assert "metadata" not in run


def _with_status(build: Build, tmp_path: Path, status: str | None) -> list[str]:
    """The action's arguments with another status file (None: no --source-status at all)."""
    args = provenance_args(build, tmp_path / "p.json")
    index = args.index("--source-status")
    if status is None:
        del args[index : index + 2]
    else:
        (tmp_path / "stable-status.txt").write_text(status)
        args[index + 1] = str(tmp_path / "stable-status.txt")
    return args


def test_a_dirty_tree_is_recorded_as_dirty(build: Build, tmp_path: Path) -> None:
    status = STATUS.replace("SOURCE_TREE clean", "SOURCE_TREE dirty")
    assert provenance.main(_with_status(build, tmp_path, status)) == 0
    [entry] = [
        d
        for d in json.loads((tmp_path / "p.json").read_text())["predicate"]["buildDefinition"][
            "resolvedDependencies"
        ]
        if d["annotations"]["role"] == "source"
    ]
    assert entry["annotations"] == {"role": "source", "tree": "dirty"}
    assert entry["digest"] == {"gitCommit": SOURCE_COMMIT}


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (None, "the build ran without sparkseal's workspace status command (.bazelrc: "
               "--workspace_status_command), so nothing asked git"),
        ("BUILD_HOST h\nBUILD_USER u\n", "the build ran without sparkseal's workspace status command "
               "(.bazelrc: --workspace_status_command), so nothing asked git"),
        ("BUILD_HOST h\nSTABLE_SPARKSEAL_SOURCE_UNKNOWN the workspace is not a git checkout\n",
         "the workspace is not a git checkout"),
    ],
)  # fmt: skip
def test_an_unknown_source_is_said_plainly(
    build: Build, tmp_path: Path, status: str | None, reason: str
) -> None:
    assert provenance.main(_with_status(build, tmp_path, status)) == 0
    definition = json.loads((tmp_path / "p.json").read_text())["predicate"]["buildDefinition"]
    assert definition["internalParameters"]["source"] == {"unknown": reason}
    assert not [d for d in definition["resolvedDependencies"] if d["annotations"]["role"] == "source"]


def test_a_credential_in_the_status_fails_without_being_shown(
    build: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = STATUS.replace("git+https://", "git+https://me:s3cr3t-token@")
    assert provenance.main(_with_status(build, tmp_path, status)) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        f"provenance: {tmp_path / 'stable-status.txt'}: STABLE_SPARKSEAL_SOURCE_URI: expected "
        "git+SCHEME://HOST/PATH without user name or password, found another form (not shown: it may hold "
        "a credential)"
    )
    assert "s3cr3t" not in err and not (tmp_path / "p.json").exists()


def test_same_bytes_for_another_time_zone_and_argument_order(
    build: Build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    again = tmp_path / "again.json"
    monkeypatch.setenv("TZ", "Asia/Kathmandu")
    time.tzset()
    assert provenance.main(reversed_flags(provenance_args(build, again))) == 0
    monkeypatch.undo()
    time.tzset()
    assert again.read_bytes() == build.statement.read_bytes()
    text = again.read_text()
    assert text.endswith("}\n") and str(tmp_path) not in text


def test_patch_order_is_part_of_the_statement(build: Build, tmp_path: Path) -> None:
    args = provenance_args(build, tmp_path / "swapped.json")
    first = args.index("--patch")
    args[first:] = args[first + 3 :] + args[first : first + 3]
    assert provenance.main(args) == 0
    patches = [
        (d["name"], d["annotations"]["series"])
        for d in json.loads((tmp_path / "swapped.json").read_text())["predicate"]["buildDefinition"][
            "resolvedDependencies"
        ]
        if d["annotations"]["role"] == "patch"
    ]
    assert patches == [("patches/vllm/0002-second.patch", 1), ("patches/vllm/0001-first.patch", 2)]


def test_bad_digest_file(build: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digest = build.bin / "pex_linux_aarch64.pex.digest"
    digest.write_text("md5:0123\n")
    assert provenance.main(provenance_args(build, tmp_path / "p.json")) == 1
    assert (
        capsys.readouterr().err.strip() == f"provenance: {digest}: expected sha256:<64 hex>, found 'md5:0123'"
    )
    digest.unlink()
    assert provenance.main(provenance_args(build, tmp_path / "p.json")) == 1
    assert capsys.readouterr().err.strip() == f"provenance: {digest}: expected a digest file, found none"
    assert not (tmp_path / "p.json").exists()


def test_missing_subject_kind(build: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = provenance_args(build, tmp_path / "p.json")
    index = args.index("sbom") - 1
    del args[index : index + 4]
    assert provenance.main(args) == 1
    assert capsys.readouterr().err.strip() == (
        "provenance: --subject: expected one of each kind module-manifest, oci-image, pex, sbom, "
        "sbom-cyclonedx, found module-manifest, oci-image, pex, sbom-cyclonedx"
    )


def test_bad_toolchain_lock(build: Build, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = build.inputs.cuda_lock
    data = json.loads(lock.read_text())
    data["wheels"]["nvidia-cuda-nvcc"]["files"]["linux_x86_64"]["sha256"] = "0" * 63
    lock.write_text(json.dumps(data))
    assert provenance.main(provenance_args(build, tmp_path / "p.json")) == 1
    assert capsys.readouterr().err.strip() == (
        f"provenance: {lock}: field `wheels.nvidia-cuda-nvcc.files.linux_x86_64.sha256`: expected 64 "
        f'lowercase hex digits, actual "{"0" * 63}"'
    )


def test_the_bazel_record_says_what_was_reported_inferred_and_declared(build: Build, tmp_path: Path) -> None:
    """A reported release is the builder's Bazel version; a declared one is recorded as declared only."""
    args = provenance_args(build, tmp_path / "p.json")
    index = args.index("--bazel-inferred")
    args[index : index + 2] = ["--bazel-inferred", ">= 6.2", "--bazel-release", "8.1.0"]
    args += ["--bazel-declared", "7.7.1"]
    assert provenance.main(args) == 0
    predicate = json.loads((tmp_path / "p.json").read_text())["predicate"]
    assert predicate["buildDefinition"]["internalParameters"]["bazel"] == {
        "declared": "7.7.1",
        "inferred": ">= 6.2 (from features: native.package_relative_label is present)",
        "release": "8.1.0",
    }
    assert predicate["runDetails"]["builder"]["version"]["bazel"] == "8.1.0"
    # Declared alone names no release in the builder: nobody measured it.
    args = [*provenance_args(build, tmp_path / "q.json"), "--bazel-declared", "7.7.1"]
    assert provenance.main(args) == 0
    predicate = json.loads((tmp_path / "q.json").read_text())["predicate"]
    assert predicate["buildDefinition"]["internalParameters"]["bazel"]["declared"] == "7.7.1"
    assert "bazel" not in predicate["runDetails"]["builder"]["version"]


def test_the_bazel_inference_is_one_of_the_two(build: Build, tmp_path: Path) -> None:
    with pytest.raises(provenance.ProvenanceError) as error:
        provenance.bazel_record(None, "7.7.1", None)
    assert str(error.value) == "--bazel-inferred: expected one of '>= 6.2', '< 6.2', found '7.7.1'"


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`sparkseal provenance check ARGS`: exit status, stdout, stderr."""
    try:
        code = cli.main(["provenance", "check", *args])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# --- the rules, on a fixture workspace ---

FIXTURE_WORKSPACE = MINIMAL_WORKSPACE

# A stand-in for sparkseal_pex: a packed-layout-like tree and its digest, computed with coreutils as
# sparkseal/core/manifest.py says an auditor can.
FAKE_PEX_BZL = r'''
load("//rules:defs.bzl", "SparksealPexInfo")

def _fake_pex_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name + ".pex")
    digest = ctx.actions.declare_file(ctx.label.name + ".pex.digest")
    ctx.actions.run_shell(
        outputs = [out, digest],
        command = """
set -eu
mkdir -p {out}/.deps/a-1.0-py3-none-any.whl
printf '{{}}' > {out}/PEX-INFO
printf 'x = 1\\n' > {out}/.deps/a-1.0-py3-none-any.whl/a.py
sum=$(cd {out} && find . -type f -printf '%P\\0' | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum)
echo "sha256:${{sum%% *}}" > {digest}
""".format(out = out.path, digest = digest.path),
    )
    return [DefaultInfo(files = depset([out, digest])), SparksealPexInfo(pex = out, digest = digest)]

fake_pex = rule(implementation = _fake_pex_impl)
'''

FIXTURE_BUILD = (
    """\
load("//rules:defs.bzl", "oci_image", "oci_layer", "provenance", "sbom", "sbom_cyclonedx")
load(":fake_pex.bzl", "fake_pex")

PATCHES = ["in/patches/vllm/0001-first.patch", "in/patches/vllm/0002-second.patch"]

"""
    + SBOM_FIXTURE_TARGETS
    + """
oci_layer(
    name = "layer_app",
    files = {
        ":manifest": "/opt/sparkseal/manifest.json",
        ":sbom": "/opt/sparkseal/sbom.spdx.json",
    },
)

oci_image(
    name = "image",
    layers = [":layer_app"],
    platform = "linux_aarch64",
    tag = "sparkseal/fixture:1",
)

fake_pex(name = "app")

genrule(
    name = "manifest",
    srcs = ["manifest.in"],
    outs = ["manifest.json"],
    cmd = "cp $< $@",
)

provenance(
    name = "provenance",
    built_wheels = [
        "in/built/vllm-0.25.1-cp38-abi3-manylinux_2_28_aarch64.whl",
        "in/built/sparkseal-0.1.0-py3-none-linux_aarch64.whl",
    ],
    cuda_lock = "in/toolchain.lock.json",
    debian_lock = "in/bookworm_arm64.lock.json",
    image = ":image",
    manifest = ":manifest",
    patches = PATCHES,
    pex = ":app",
    platform = "linux_aarch64",
    python_lock = "in/requirements_linux_aarch64.files.json",
    sbom = ":sbom",
    sbom_cyclonedx = ":sbom_cyclonedx",
    tools_lock = "in/tools.files.json",
    vllm_lock = "in/vllm.lock.json",
)
"""
)


@pytest.mark.bazel
@pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)")
def test_rules_on_a_fixture_workspace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "ws"
    make_fixture_workspace(root)
    (root / "WORKSPACE").write_text(FIXTURE_WORKSPACE)
    (root / "kernels_sm121").mkdir()
    (root / "kernels_sm121" / "BUILD").write_text(
        'load("//rules:defs.bzl", "cuda_archs_setting")\n\n'
        'package(default_visibility = ["//visibility:public"])\n\n'
        'cuda_archs_setting(name = "cuda_archs", build_setting_default = "")\n'
    )
    package = root / "prov"
    inputs = write_inputs(package / "in")
    (package / "manifest.in").write_text('{"format": "sparkseal-module-manifest/1", "distributions": {}}\n')
    (package / "fake_pex.bzl").write_text(FAKE_PEX_BZL)
    (package / "BUILD").write_text(FIXTURE_BUILD)
    ws = Workspace(root, tmp_path / "output-base", tmp_path / "repository-cache", base_env())
    statement_path = ws.bin_path("") / "prov" / "provenance.intoto.json"
    sources = []
    try:
        result = ws.bazel("build", "//prov:provenance", "--//kernels_sm121:cuda_archs=121a-real")
        assert result.returncode == 0, result.output
        bazel_bin = ws.bin_path("")
        sources.append(json.loads(statement_path.read_text())["predicate"]["buildDefinition"])
        # The same workspace as a git checkout (.bazelrc's workspace status command asks git): clean, then
        # dirty; only the provenance action reads the status, so the image is not rebuilt.
        (root / ".gitignore").write_text("bazel-*\n")
        for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "fixture"]):
            git = ["git", "-c", "user.email=b@example.org", "-c", "user.name=b", *command]
            subprocess.run(git, cwd=root, check=True, capture_output=True)
        for dirty in (False, True):
            if dirty:
                (root / "notes.txt").write_text("not committed\n")  # untracked, read by no target
            rebuilt = ws.bazel("build", "//prov:provenance", "--//kernels_sm121:cuda_archs=121a-real")
            assert rebuilt.returncode == 0, rebuilt.output
            assert "Assembling image" not in rebuilt.output
            sources.append(json.loads(statement_path.read_text())["predicate"]["buildDefinition"])
    finally:
        ws.shutdown()
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()
    assert sources[0]["internalParameters"]["source"] == {"unknown": "the workspace is not a git checkout"}
    for definition, tree in zip(sources[1:], ("clean", "dirty"), strict=True):
        assert "source" not in definition["internalParameters"]
        assert definition["resolvedDependencies"][0] == {
            "annotations": {"role": "source", "tree": tree, "uriUnknown": "the checkout has no remote (or "
                            "several and none is origin)"},
            "digest": {"gitCommit": commit},
            "name": "sparkseal",
        }  # fmt: skip

    statement = json.loads(statement_path.read_text())
    assert [(s["name"], s["annotations"]["kind"]) for s in statement["subject"]] == [
        ("prov/app.pex", "pex"),
        ("prov/image", "oci-image"),
        ("prov/manifest.json", "module-manifest"),
        ("prov/sbom.spdx.json", "sbom"),
        ("prov/sbom_cyclonedx.cdx.json", "sbom-cyclonedx"),
    ]
    definition = statement["predicate"]["buildDefinition"]
    assert definition["externalParameters"] == {
        "cudaArchs": "121a-real",
        "platform": PLATFORM,
        "targets": ["//prov:app", "//prov:image", "//prov:manifest", "//prov:sbom", "//prov:sbom_cyclonedx"],
    }
    patches = [d for d in definition["resolvedDependencies"] if d["annotations"]["role"] == "patch"]
    assert [(d["name"], d["digest"]["sha256"]) for d in patches] == [
        (f"prov/in/{name}", _sha(path.read_bytes())) for name, path in inputs.patches
    ]
    assert "bazel-out" not in statement_path.read_text()
    # This Bazel (4.2.3 on the test host) reports no release to the rules; its Starlark tells < 6.2.
    assert definition["internalParameters"]["bazel"] == {
        "declared": None,
        "inferred": "< 6.2 (from features: native.package_relative_label is absent)",
        "release": None,
    }
    assert "bazel" not in statement["predicate"]["runDetails"]["builder"]["version"]

    code, out, err = _check(capsys, "--root", str(bazel_bin), str(statement_path))
    assert code == 0, out + err
    assert out.splitlines()[-1] == "PASSED: 7 checks, 0 differ"  # 5 subjects + the config and the layer blob


# --- validators of the in-toto attestation framework ---


def test_the_statement_validates_with_in_toto_attestation(build: Build) -> None:
    """The in-toto attestation framework's own bindings accept the statement and its SLSA v1 predicate."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    data = json.loads(build.statement.read_text())
    Statement.copy_from_pb(json_format.ParseDict(data, statement_pb2.Statement())).validate()
    predicate = json_format.ParseDict(data["predicate"], provenance_pb2.Provenance())  # unknown fields fail
    for dependency in predicate.build_definition.resolved_dependencies:
        ResourceDescriptor.copy_from_pb(dependency).validate()
    assert len(predicate.build_definition.resolved_dependencies) == len(
        data["predicate"]["buildDefinition"]["resolvedDependencies"]
    )

    # Not a rubber stamp: a subject without a digest is refused.
    data["subject"][0]["digest"] = {}
    with pytest.raises(ValueError, match=r"At least one digest required \(subject 0\)"):
        Statement.copy_from_pb(json_format.ParseDict(data, statement_pb2.Statement())).validate()
