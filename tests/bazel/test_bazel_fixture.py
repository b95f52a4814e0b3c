"""Bazel integration tests on a fixture workspace: the real rules, a tiny fake vLLM on a loopback index."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bazel_util import BAZEL, Workspace, base_env, make_fixture_workspace, remove_tree
from tests.fixtures_vllm import make_patch, make_sdist, make_wheel
from tests.servers.fixture_index import FixtureIndex

pytestmark = [
    pytest.mark.bazel,
    pytest.mark.skipif(BAZEL is None, reason="bazel is not installed (make setup installs it)"),
]

VERSION = "0.25.1"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SPECULATOR = "vllm/spec.py"
SOURCES = {
    "vllm/__init__.py": b'"""fixture vllm"""\n',
    SPECULATOR: b"def mapping():\n    return 0\n",
    "vllm/utils.py": b"X = 1\n",
}
SDIST = f"vllm-{VERSION}.tar.gz"
WHEELS = {
    "linux_aarch64": f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_aarch64.whl",
    "linux_x86_64": f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl",
}
GOOD_PATCH = """\
--- a/vllm/spec.py
+++ b/vllm/spec.py
@@ -1,2 +1,2 @@
 def mapping():
-    return 0
+    return -1
"""
SECOND_PATCH = """\
--- a/vllm/utils.py
+++ b/vllm/utils.py
@@ -1 +1 @@
-X = 1
+X = 2
"""
OVERLAY_FILE = "vllm/_downstream.py"


@dataclass
class Fixture:
    """A fixture workspace, its loopback index and the artifacts that index serves."""

    ws: Workspace
    index: FixtureIndex
    artifacts: dict[str, bytes]

    def lock(self, **override: object) -> dict[str, object]:
        lock: dict[str, object] = {
            "commit": COMMIT,
            "format": 1,
            "name": "vllm",
            "sdist": {"filename": SDIST, "sha256": _sha(self.artifacts[SDIST])},
            "version": VERSION,
            "wheels": {p: {"filename": f, "sha256": _sha(self.artifacts[f])} for p, f in WHEELS.items()},
        }
        lock.update(override)
        return lock

    def configure(
        self,
        lock: dict[str, object] | None = None,
        patches: dict[str, str] | None = None,
        overlay: dict[str, bytes] | None = None,
        replaces: dict[str, str] | None = None,
    ) -> None:
        """Write the lock, the patch series and the overlay of the fixture workspace."""
        root = self.ws.root
        lock_text = json.dumps(lock or self.lock(), indent=2, sort_keys=True) + "\n"
        (root / "third_party/vllm/vllm.lock.json").write_text(lock_text)
        patch_dir = root / "patches/vllm"
        for old in patch_dir.glob("*.patch"):
            old.unlink()
        patches = {"0001-fix.patch": GOOD_PATCH} if patches is None else patches
        for name, diff in patches.items():
            make_patch(patch_dir / name, diff)
        (patch_dir / "series").write_text("".join(f"{name}\n" for name in patches))
        overlay_dir = root / "overlay/vllm"
        shutil.rmtree(overlay_dir / "vllm", ignore_errors=True)
        overlay = {OVERLAY_FILE: b"DOWNSTREAM = True\n"} if overlay is None else overlay
        for rel, data in overlay.items():
            (overlay_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (overlay_dir / rel).write_bytes(data)
        manifest = {"files": {rel: "fixture" for rel in overlay}, "replaces": replaces or {}}
        (overlay_dir / "overlay.json").write_text(json.dumps(manifest, indent=2) + "\n")

    def build(self, *targets: str) -> tuple[int, str]:
        result = self.ws.bazel("build", *targets)
        return result.returncode, result.output


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _artifacts(tmp: Path, commit_id: str = COMMIT[:9]) -> dict[str, bytes]:
    make_sdist(tmp / SDIST, VERSION, commit_id, SOURCES)
    artifacts = {SDIST: (tmp / SDIST).read_bytes()}
    for platform, filename in WHEELS.items():
        compiled = {"vllm/_C.abi3.so": f"ELF for {platform}".encode()}
        make_wheel(tmp / filename, VERSION, commit_id, {**SOURCES, **compiled}, platform)
        artifacts[filename] = (tmp / filename).read_bytes()
    return artifacts


def _workspace(root: Path, cache: Path, index: FixtureIndex) -> Workspace:
    make_fixture_workspace(root)
    return Workspace(
        root=root,
        output_base=root.parent / (root.name + "-output-base"),
        repository_cache=cache,
        env=base_env(PIP_INDEX_URL=index.url),
    )


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    tmp = tmp_path_factory.mktemp("bazel-fixture")
    artifacts = _artifacts(tmp)
    with FixtureIndex(artifacts) as index:
        ws = _workspace(tmp / "ws", tmp / "repository-cache", index)
        fx = Fixture(ws, index, artifacts)
        yield fx
        ws.shutdown()


def _wheel_path(ws: Workspace, platform: str) -> Path:
    return ws.bin_path(f"third_party/vllm/wheel_{platform}/{WHEELS[platform]}")


def _sandboxed_processes(output: str) -> int:
    match = re.search(r"(\d+) linux-sandbox", output)
    return int(match.group(1)) if match else 0


def test_good_build_then_second_clone_is_identical_and_offline(
    fixture: Fixture, tmp_path_factory: pytest.TempPathFactory
) -> None:
    fixture.configure()
    targets = [f"//third_party/vllm:wheel_{p}" for p in WHEELS]
    code, output = fixture.build(*targets)
    assert code == 0, output
    # Every locked file missed the empty repository cache; a miss is no failure and prints nothing.
    assert "WARNING: Download from" not in output, output
    digests = {p: _sha(_wheel_path(fixture.ws, p).read_bytes()) for p in WHEELS}
    with zipfile.ZipFile(_wheel_path(fixture.ws, "linux_x86_64")) as wheel:
        assert wheel.read(SPECULATOR) == b"def mapping():\n    return -1\n"
        assert wheel.read("vllm/_C.abi3.so") == b"ELF for linux_x86_64"
        assert wheel.read(OVERLAY_FILE) == b"DOWNSTREAM = True\n"
        record = json.loads(wheel.read(f"vllm-{VERSION}.dist-info/sparkseal.json"))
        assert record["commit"] == COMMIT
        assert [p["file"] for p in record["patches"]] == ["0001-fix.patch"]
    page_requests = sum(n for path, n in fixture.index.requests.items() if path.startswith("/simple/"))
    assert page_requests == 3  # one index lookup per locked file, then the repository cache serves them

    # A second clone at another path, with its own output base but the same repository cache, must
    # give identical wheels without asking the index anything.
    other = _workspace(tmp_path_factory.mktemp("clone") / "ws2", fixture.ws.repository_cache, fixture.index)
    try:
        clone = Fixture(other, fixture.index, fixture.artifacts)
        clone.configure()
        before = sum(fixture.index.requests.values())
        code, output = clone.build(*targets)
        assert code == 0, output
        assert sum(fixture.index.requests.values()) == before
        assert {p: _sha(_wheel_path(other, p).read_bytes()) for p in WHEELS} == digests
    finally:
        other.shutdown()


def test_editing_one_patch_reruns_only_later_steps(fixture: Fixture) -> None:
    fixture.configure(patches={"0001-fix.patch": GOOD_PATCH, "0002-utils.patch": SECOND_PATCH})
    code, output = fixture.build("//third_party/vllm:wheel_linux_x86_64")
    assert code == 0, output
    fixture.configure(
        patches={"0001-fix.patch": GOOD_PATCH, "0002-utils.patch": SECOND_PATCH.replace("2", "3")}
    )
    code, output = fixture.build("//third_party/vllm:wheel_linux_x86_64")
    assert code == 0, output
    # Patch 2, the overlay and the repack run again; unpacking and patch 1 come from the cache.
    assert _sandboxed_processes(output) == 3, output
    with zipfile.ZipFile(_wheel_path(fixture.ws, "linux_x86_64")) as wheel:
        assert wheel.read("vllm/utils.py") == b"X = 3\n"


@pytest.mark.parametrize(
    ("diff", "expected"),
    [
        (GOOD_PATCH.replace(" def mapping():", " def mapping(x):"), "does not apply at line 1"),
        (GOOD_PATCH.replace("return -1", "return -1 "), "trailing whitespace in added line"),
        (GOOD_PATCH.replace("return -1", "return -1 +"), "patched file does not compile"),
        (GOOD_PATCH.replace("vllm/spec.py", "csrc/attention.cu"), "a source build of vLLM is not supported"),
        (GOOD_PATCH.replace("a/vllm/spec.py", "a/../spec.py"), "escapes its root through '..'"),
    ],
    ids=["context", "whitespace", "syntax", "compiled", "escape"],
)
def test_patch_check_failures(fixture: Fixture, diff: str, expected: str) -> None:
    fixture.configure(patches={"0001-bad.patch": diff})
    code, output = fixture.build("//third_party/vllm:patched_tree")
    assert code != 0
    assert "0001-bad.patch" in output
    assert expected in output


def test_overlay_replacing_a_patched_file_is_refused(fixture: Fixture) -> None:
    fixture.configure(overlay={SPECULATOR: b"REPLACED = True\n"})
    code, output = fixture.build("//third_party/vllm:patched_tree")
    assert code != 0
    assert f"overlay file {SPECULATOR} would replace a file that patch 0001-fix.patch modified" in output
    fixture.configure(overlay={SPECULATOR: b"REPLACED = True\n"}, replaces={SPECULATOR: "fixture"})
    code, output = fixture.build("//third_party/vllm:patched_tree")
    assert code == 0, output


def test_overlay_escaping_the_tree_is_refused(fixture: Fixture) -> None:
    fixture.configure()
    manifest = fixture.ws.root / "overlay/vllm/overlay.json"
    manifest.write_text(json.dumps({"files": {"../evil.py": "fixture"}, "replaces": {}}))
    code, output = fixture.build("//third_party/vllm:patched_tree")
    assert code != 0
    assert "escapes its root through '..'" in output


def test_download_with_wrong_bytes_fails_with_both_hashes(
    fixture: Fixture, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("corrupt")
    artifacts = _artifacts(tmp, commit_id="fedcba987")
    corrupt = b"not the locked sdist"
    with FixtureIndex(artifacts, served_bytes_override={SDIST: corrupt}) as index:
        ws = _workspace(tmp / "ws", tmp / "cache", index)
        try:
            fx = Fixture(ws, index, artifacts)
            fx.configure()
            code, output = fx.build("//third_party/vllm:pristine_tree")
        finally:
            ws.shutdown()
    assert code != 0
    expected, actual = _sha(artifacts[SDIST]), _sha(corrupt)
    assert f"sparkseal: {SDIST}: sha256 mismatch: expected {expected} (locked), actual {actual}" in output
    cached = tmp / "cache" / "content_addressable" / "sha256"
    assert not (cached / _sha(corrupt)).exists()
    assert not (cached / _sha(artifacts[SDIST])).exists()


def test_bazel_download_failing_on_the_locked_file_blames_the_download(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The index serves the locked sdist, but Bazel's transfers of it are cut short (as a proxy might
    cut them): Bazel reports a checksum mismatch, which must not read as a wrong file. The message names
    the file, the URL and the locked sha256 the second client got, then Bazel's own error ends the fetch;
    a transfer cut only once heals on the second download."""
    tmp = tmp_path_factory.mktemp("cut")
    artifacts = _artifacts(tmp)
    locked = _sha(artifacts[SDIST])
    with FixtureIndex(artifacts, bazel_cuts={SDIST: 2}) as index:
        ws = _workspace(tmp / "ws", tmp / "cache", index)
        url = index.file_url(SDIST)
        explanation = (
            f"sparkseal: {SDIST}: Bazel's downloader failed to fetch {url}, but a second client "
            f"(Python's urllib) fetched it with the locked sha256 {locked}, so the file is fine and the "
            "failure is Bazel's download (e.g. a proxy, TLS, or a partial/interrupted transfer"
        )
        cached = ws.repository_cache / "content_addressable/sha256" / locked / "file"
        try:
            fx = Fixture(ws, index, artifacts)
            fx.configure()
            code, output = fx.build("//third_party/vllm:pristine_tree")
            assert code != 0
            assert explanation in output, output
            assert "sha256 mismatch" not in output
            # Bazel's own error (its second download, cut again) follows the explanation.
            after = output[output.index(explanation) :]
            assert re.search(rf"Error downloading \[{re.escape(url)}\] to ", after), output
            assert index.bazel_cuts[SDIST] == 0
            assert index.requests[f"/packages/{SDIST}"] == 3  # Bazel, the second client, Bazel again
            assert index.requests["/simple/vllm/"] == 1  # no restart of the rule repeats the lookup
            assert not cached.exists()

            index.bazel_cuts[SDIST] = 1
            code, output = fx.build("//third_party/vllm:pristine_tree")
            assert code == 0, output
            assert explanation in output
            assert index.requests[f"/packages/{SDIST}"] == 6
            assert cached.read_bytes() == artifacts[SDIST]
        finally:
            ws.shutdown()


def test_lock_hash_differs_from_index(fixture: Fixture) -> None:
    wrong = "ab" * 32
    lock = fixture.lock(sdist={"filename": SDIST, "sha256": wrong})
    fixture.configure(lock=lock)
    code, output = fixture.build("//third_party/vllm:pristine_tree")
    assert code != 0
    assert SDIST in output
    assert wrong in output
    assert _sha(fixture.artifacts[SDIST]) in output


def test_file_not_listed_by_the_index(fixture: Fixture) -> None:
    missing = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_riscv64.whl"
    wheels = {p: {"filename": f, "sha256": _sha(fixture.artifacts[f])} for p, f in WHEELS.items()}
    wheels["linux_x86_64"] = {"filename": missing, "sha256": "cd" * 32}
    fixture.configure(lock=fixture.lock(wheels=wheels))
    code, output = fixture.build("//third_party/vllm:wheel_linux_x86_64")
    assert code != 0
    assert f"{missing} is not listed by the index" in output


def test_missing_lock_entry(fixture: Fixture) -> None:
    wheels = {"linux_aarch64": {"filename": WHEELS["linux_aarch64"], "sha256": "cd" * 32}}
    fixture.configure(lock=fixture.lock(wheels=wheels))
    code, output = fixture.build("//third_party/vllm:pristine_tree")
    assert code != 0
    assert (
        "sparkseal: //third_party/vllm:vllm.lock.json: field `wheels.linux_x86_64`: expected an object, "
        "actual nothing"
    ) in output


def test_sdist_of_another_commit_is_refused(fixture: Fixture) -> None:
    other = "fedcba9876543210fedcba9876543210fedcba98"
    fixture.configure(lock=fixture.lock(commit=other))
    code, output = fixture.build("//third_party/vllm:pristine_tree")
    assert code != 0
    assert f"commit id is '{COMMIT[:9]}', but the lock expects commit '{other}'" in output


@pytest.mark.parametrize("helper", ["sparkseal/fetch/series.py", "sparkseal/core/patchset.py"])
def test_editing_a_series_helper_reruns_the_series_rule(fixture: Fixture, helper: str) -> None:
    """@vllm_patches runs sparkseal.fetch.series (which reads the series with core.patchset): editing
    either source re-runs the repository rule, so no build uses an old helper's result."""
    fixture.configure()
    code, output = fixture.build("//third_party/vllm:patched_tree")
    assert code == 0, output
    source = fixture.ws.root / helper
    original = source.read_text()
    try:
        future = "from __future__ import annotations\n"
        assert future in original, f"{helper}: expected {future!r}"
        source.write_text(original.replace(future, future + 'raise SystemExit("the edited helper ran")\n', 1))
        code, output = fixture.build("//third_party/vllm:patched_tree")
        assert code != 0, output
        assert "the edited helper ran" in output
        assert "@vllm_patches" in output
    finally:
        source.write_text(original)
    code, output = fixture.build("//third_party/vllm:patched_tree")
    assert code == 0, output


def test_private_index_with_basic_auth(tmp_path_factory: pytest.TempPathFactory) -> None:
    """401 without credentials names the index; a wrong password is refused unprinted; the right
    credentials, in the index URL or in a netrc file, fetch and verify, and no output shows them."""
    tmp = tmp_path_factory.mktemp("private")
    artifacts = _artifacts(tmp, commit_id=COMMIT[:9])
    login, password, wrong = "ci-reader", "pw-" + secrets.token_hex(8), "wrong-" + secrets.token_hex(8)
    with FixtureIndex(artifacts, basic_auth=(login, password)) as index:
        ws = _workspace(tmp / "ws", tmp / "cache-none", index)
        hostport = index.url.split("://", 1)[1]
        ws.env["NETRC"] = str(tmp / "no-netrc")
        try:
            fx = Fixture(ws, index, artifacts)
            fx.configure()
            code, output = fx.build("//third_party/vllm:pristine_tree")
            assert code != 0
            assert (
                f"sparkseal: {SDIST}: index answered HTTP 401 Unauthorized for {index.url}/vllm/: "
                "the index needs credentials" in output
            )

            ws.env["PIP_INDEX_URL"] = f"http://{login}:{wrong}@{hostport}"
            code, output = fx.build("//third_party/vllm:pristine_tree")
            assert code != 0
            assert f"for http://***@{hostport}/vllm/: the credentials sent were refused" in output
            assert wrong not in output and login not in output

            ws.env["PIP_INDEX_URL"] = f"http://{login}:{password}@{hostport}"
            ws.repository_cache = tmp / "cache-url"
            code, output = fx.build("//third_party/vllm:pristine_tree")
            assert code == 0, output
            assert password not in output and login not in output
            assert index.authorized[f"/packages/{SDIST}"] == 1
            cached = ws.repository_cache / "content_addressable/sha256" / _sha(artifacts[SDIST]) / "file"
            assert cached.read_bytes() == artifacts[SDIST]

            netrc = tmp / "netrc"
            netrc.write_text(f"machine 127.0.0.1 login {login} password {password}\n")
            ws.env.update(PIP_INDEX_URL=index.url, NETRC=str(netrc))
            ws.repository_cache = tmp / "cache-netrc"
            code, output = fx.build("//third_party/vllm:pristine_tree")
            assert code == 0, output
            assert password not in output
            assert index.authorized[f"/packages/{SDIST}"] == 2
        finally:
            ws.shutdown()
            remove_tree(ws.output_base)
