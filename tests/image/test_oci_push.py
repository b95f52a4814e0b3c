"""Push and image index: a real distribution registry on loopback, skopeo reading back what was pushed."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkseal.actions import oci_image_index as index_action
from sparkseal.actions import oci_push as push
from sparkseal.core.oci import INDEX_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, blob_path
from tests.bazel_util import BAZEL, REPO, Workspace
from tests.image.test_oci import IMAGE_BUILD, TAG, Image, _bazel_workspace, assemble, blob
from tests.servers.nginx_cache import NginxCache
from tests.servers.registry_server import REGISTRY, Registry

pytestmark = pytest.mark.skipif(
    not Path(REGISTRY).exists(), reason="docker-registry is not installed (apt-get install docker-registry)"
)


def _skopeo(*args: str) -> str:
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        pytest.skip("skopeo is not installed (CI installs it)")
    result = subprocess.run(
        [skopeo, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "HOME": "/"},
    )
    assert result.returncode == 0, f"skopeo {args}: {result.stderr}"
    return result.stdout


def _push(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object], str]:
    """Run the push program; return its status, its JSON report (empty on failure) and its stderr."""
    code = push.main([*args, "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out.splitlines()[-1]) if code == 0 else {}
    return code, report, captured.err


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with Registry(tmp_path / "registry") as server:
        yield server


@pytest.fixture
def image(tmp_path: Path) -> Image:
    return assemble(tmp_path / "image")


def _blob_puts(registry: Registry) -> list[str]:
    return [line for line in registry.requests() if line.startswith("PUT ") and "/blobs/uploads/" in line]


def test_push_uploads_every_blob_then_a_second_push_uploads_none(
    registry: Registry, image: Image, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = f"{registry.host}/sparkseal/fixture"
    code, report, err = _push(capsys, reference, "--layout", str(image.layout))
    assert code == 0, err
    manifest = json.loads(
        (image.layout / "blobs" / "sha256" / image.digest.removeprefix("sha256:")).read_bytes()
    )
    blobs = [manifest["config"]["digest"], *(layer.digest for layer in image.layers)]
    assert report["digest"] == image.digest
    assert report["reference"] == f"{reference}:test"  # the layout's own tag when none is given
    assert sorted(report["uploaded"]) == sorted(blobs)  # type: ignore[arg-type]
    assert report["skipped"] == [] and report["manifests"] == [image.digest]
    assert len(_blob_puts(registry)) == 3

    inspected = json.loads(_skopeo("inspect", "--tls-verify=false", f"docker://{reference}:test"))
    assert inspected["Digest"] == image.digest
    assert inspected["Layers"] == [layer.digest for layer in image.layers]
    raw = _skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{reference}:test").encode()
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == image.digest

    # Again, under another tag: every blob is there, nothing is uploaded, and the new tag names the image.
    code, report, err = _push(capsys, f"{reference}:again", "--layout", str(image.layout))
    assert code == 0, err
    assert report["uploaded"] == [] and report["uploaded_bytes"] == 0
    assert sorted(report["skipped"]) == sorted(blobs)  # type: ignore[arg-type]
    assert len(_blob_puts(registry)) == 3  # the server saw no upload either
    inspected = json.loads(_skopeo("inspect", "--tls-verify=false", f"docker://{reference}:again"))
    assert inspected["Digest"] == image.digest


def test_a_blob_the_registry_rejects_fails_naming_registry_digest_status_and_message(
    registry: Registry, image: Image, capsys: pytest.CaptureFixture[str]
) -> None:
    # Same size, other bytes: only the registry's digest check can tell.
    layer = image.layers[1]
    path = blob_path(image.layout, layer.digest)  # the layer writer's file, which the layout names
    assert path.resolve() == layer.blob.resolve()
    path.write_bytes(bytes(len(path.read_bytes())))
    code, _, err = _push(capsys, f"{registry.host}/sparkseal/fixture:bad", "--layout", str(image.layout))
    assert code == 1
    assert f"registry http://{registry.host}: upload of blob {layer.digest} to sparkseal/fixture (PUT)" in err
    assert "HTTP 400: DIGEST_INVALID: provided digest did not match uploaded content" in err
    assert "PUT /v2/sparkseal/fixture/manifests/bad" not in " ".join(registry.requests())  # no tag made


def test_a_read_only_registry_refuses_the_first_upload(
    tmp_path: Path, image: Image, capsys: pytest.CaptureFixture[str]
) -> None:
    with Registry(tmp_path / "read-only", read_only=True) as server:
        host = server.host
        code, _, err = _push(capsys, f"{host}/sparkseal/fixture:x", "--layout", str(image.layout))
    assert code == 1
    assert f"registry http://{host}: upload of blob sha256:" in err
    assert "(POST): HTTP 405: Method not allowed" in err  # the registry's own words


def _cache_blob(cache: NginxCache, layer_blob: Path, data: bytes | None = None) -> None:
    """Store a layer blob in the cache's CAS as Bazel uploads an output file: under its sha256."""
    content = layer_blob.read_bytes()
    cas = cache.root / "cas"
    cas.mkdir(mode=0o755, exist_ok=True)
    (cas / hashlib.sha256(content).hexdigest()).write_bytes(content if data is None else data)


def test_blobs_no_layout_holds_stream_from_the_remote_cache(
    tmp_path: Path, registry: Registry, image: Image, capsys: pytest.CaptureFixture[str]
) -> None:
    # As after a build with --remote_download_minimal: the layer files are in the cache, not on disk.
    with NginxCache() as cache:
        for layer in image.layers:
            _cache_blob(cache, layer.blob)
            layer.blob.unlink()
        reference = f"{registry.host}/sparkseal/fixture:cached"
        code, _, err = _push(capsys, reference, "--layout", str(image.layout))
        assert code == 1 and f"blob {image.layers[0].digest}: in none of the image layouts" in err

        code, report, err = _push(capsys, reference, "--layout", str(image.layout), "--blob-cache", cache.url)
        assert code == 0, err
        hexes = [layer.digest.removeprefix("sha256:") for layer in image.layers]
        assert [line for line in cache.access_log() if line.startswith("GET")] == [
            f"GET /cas/{h} HTTP/1.1" for h in hexes
        ]
    # The config came from the layout in the first attempt, before it stopped at the first layer.
    assert report["uploaded"] == [layer.digest for layer in image.layers]
    assert len(report["skipped"]) == 1  # type: ignore[arg-type]
    inspected = json.loads(_skopeo("inspect", "--tls-verify=false", f"docker://{reference}"))
    assert inspected["Digest"] == image.digest
    assert inspected["Layers"] == [layer.digest for layer in image.layers]


def test_a_cache_without_the_blob_or_with_other_bytes_is_named(
    tmp_path: Path, registry: Registry, image: Image, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = image.layers
    with NginxCache() as cache:
        first_bytes = first.blob.read_bytes()
        _cache_blob(cache, first.blob, first_bytes + b"x")  # one byte too many
        for layer in image.layers:
            layer.blob.unlink()
        url = cache.url.replace("://", "://puller:pw-s3cr3t@")
        reference = f"{registry.host}/sparkseal/fixture:x"
        code, _, err = _push(capsys, reference, "--layout", str(image.layout), "--blob-cache", url)
        shown = cache.url.replace("://", "://***@")
        assert code == 1
        too_long = len(first_bytes) + 1
        assert (
            f"blob {first.digest}: the remote cache {shown} has {too_long} bytes of it, expected {first.size}"
            in err
        )
        assert "s3cr3t" not in err and "puller" not in err

        (cache.root / "cas" / first.digest.removeprefix("sha256:")).write_bytes(first_bytes)
        code, _, err = _push(capsys, reference, "--layout", str(image.layout), "--blob-cache", cache.url)
        assert code == 1
        assert f"blob {second.digest}: not in the remote cache {cache.url} (HTTP 404)" in err
        assert "PUT /v2/sparkseal/fixture/manifests/x" not in " ".join(registry.requests())

    code, _, err = _push(
        capsys, reference, "--layout", str(image.layout), "--blob-cache", "ftp://cache.example/c"
    )
    assert code == 1
    assert "--blob-cache ftp://cache.example/c: expected the http:// or https:// URL of a remote cache" in err


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("sparkseal/vllm:1", "expected REGISTRY/REPOSITORY[:TAG] with a registry host first"),
        ("127.0.0.1:5000/Sparkseal/vllm", "repository 'Sparkseal/vllm' is not valid"),
        ("127.0.0.1:5000/sparkseal/vllm:-x", "tag '-x' is not valid"),
    ],
)
def test_a_bad_reference_is_a_clear_error(
    image: Image, reference: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _push(capsys, reference, "--layout", str(image.layout))
    assert code == 1 and expected in err and reference in err


def test_plain_http_only_for_loopback_unless_asked() -> None:
    assert [push.is_loopback(h) for h in ("localhost:5000", "127.0.0.1:5000", "[::1]:5000", "127.1.2.3")] == [
        True
    ] * 4
    assert not push.is_loopback("registry.example:5000")
    reference = push.parse_reference("registry.example:5000/sparkseal/vllm:1")
    assert push.Registry(reference, plain_http=False).base == "https://registry.example:5000"
    assert push.Registry(reference, plain_http=True).base == "http://registry.example:5000"


def test_netrc_credentials_are_sent_and_never_printed(
    tmp_path: Path, image: Image, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login pusher password s3cr3t-pw\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    registry = push.Registry(push.parse_reference("127.0.0.1:1/sparkseal/vllm:1"), plain_http=False)
    assert registry._authorization == "Basic cHVzaGVyOnMzY3IzdC1wdw=="  # base64 of pusher:s3cr3t-pw
    # nothing listens on port 1: the error names the registry and the request, not the credentials
    code, _, err = _push(capsys, "127.0.0.1:1/sparkseal/vllm:1", "--layout", str(image.layout))
    assert code == 1 and "registry http://127.0.0.1:1: HEAD /v2/sparkseal/vllm/blobs/sha256:" in err
    assert "s3cr3t" not in err and "pusher" not in err and "cHVzaGVy" not in err


# --- the image index -------------------------------------------------------------------------------


def _two_platforms(root: Path) -> tuple[Image, Image]:
    return assemble(root / "arm64", "linux_aarch64"), assemble(root / "amd64", "linux_x86_64")


def test_index_lists_each_platform_manifest_in_order(tmp_path: Path) -> None:
    arm64, amd64 = _two_platforms(tmp_path)
    args = ["--image", str(arm64.layout), "--image", str(amd64.layout)]
    assert (
        index_action.main([*args, "--index", str(tmp_path / "i.json"), "--digest", str(tmp_path / "d")]) == 0
    )
    data = (tmp_path / "i.json").read_bytes()
    assert (tmp_path / "d").read_text() == "sha256:" + hashlib.sha256(data).hexdigest()
    manifests = [(m.layout, m.digest) for m in (arm64, amd64)]
    assert json.loads(data) == {
        "manifests": [
            {
                "digest": digest,
                "mediaType": MANIFEST_MEDIA_TYPE,
                "platform": platform,
                "size": (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).stat().st_size,
            }
            for (layout, digest), platform in zip(
                manifests,
                [
                    {"architecture": "arm64", "os": "linux", "variant": "v8"},
                    {"architecture": "amd64", "os": "linux"},
                ],
                strict=True,
            )
        ],
        "mediaType": INDEX_MEDIA_TYPE,
        "schemaVersion": 2,
    }


def test_index_is_the_same_bytes_from_other_dirs_umask_and_tz(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[2]); "
        "from tests.image.test_oci_push import _two_platforms; "
        "from sparkseal.actions import oci_image_index as m; "
        "r = Path(sys.argv[1]); a, b = _two_platforms(r); "
        "sys.exit(m.main(['--image', str(a.layout), '--image', str(b.layout), "
        "'--index', str(r / 'index.json'), '--digest', str(r / 'index.digest')]))"
    )
    for run, (umask, tz) in {"a": (0o022, "UTC"), "b/c": (0o077, "Asia/Kolkata")}.items():
        (tmp_path / run).mkdir(parents=True)
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / run), str(REPO)],
            env={**os.environ, "TZ": tz},
            check=True,
            preexec_fn=lambda umask=umask: os.umask(umask),
        )
    for name in ("index.json", "index.digest"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b/c" / name).read_bytes()


def test_index_refuses_two_images_of_one_platform(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = assemble(tmp_path / "one"), assemble(tmp_path / "two")
    args = ["--image", str(first.layout), "--image", str(second.layout)]
    assert index_action.main([*args, "--index", str(tmp_path / "i"), "--digest", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err
    assert f"{second.layout}: platform linux/arm64/v8 is already the image of {first.layout}" in err
    assert not (tmp_path / "i").exists()


def test_push_index_pushes_both_manifests_then_the_index(
    tmp_path: Path, registry: Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    arm64, amd64 = _two_platforms(tmp_path)
    index = tmp_path / "index.json"
    layouts = ["--layout", str(arm64.layout), "--layout", str(amd64.layout)]
    assert (
        index_action.main(
            [
                "--image",
                layouts[1],
                "--image",
                layouts[3],
                "--index",
                str(index),
                "--digest",
                str(tmp_path / "d"),
            ]
        )
        == 0
    )
    reference = f"{registry.host}/sparkseal/multi:1"
    code, report, err = _push(capsys, reference, "--index", str(index), *layouts)
    assert code == 0, err
    digest = (tmp_path / "d").read_text()
    assert report["manifests"] == [arm64.digest, amd64.digest, digest]
    # The two images have the same layers and differ in their configs: each blob goes up once.
    configs = [json.loads(blob(image, image.digest))["config"]["digest"] for image in (arm64, amd64)]
    assert report["uploaded"] == [configs[0], *(layer.digest for layer in arm64.layers), configs[1]]
    assert report["skipped"] == []
    raw = _skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{reference}").encode()
    assert raw == index.read_bytes()
    repository = f"docker://{registry.host}/sparkseal/multi"
    for arch, image in (("arm64", arm64), ("amd64", amd64)):
        # a client of each architecture resolves the index to its own image (configs differ only there)
        config = json.loads(
            _skopeo(
                "inspect", "--config", "--override-arch", arch, "--tls-verify=false", f"docker://{reference}"
            )
        )
        assert config["architecture"] == arch
        inspected = json.loads(_skopeo("inspect", "--tls-verify=false", f"{repository}@{image.digest}"))
        assert inspected["Digest"] == image.digest and inspected["Architecture"] == arch
    code, report, err = _push(capsys, reference, "--index", str(index), *layouts)
    assert code == 0 and report["uploaded"] == [], err


# --- Bazel: image.push, image_index and its push on a fixture workspace ----------------------------

INDEX_BUILD = """
oci_image(
    name = "image_amd64",
    layers = [":base", ":app"],
    platform = "linux_x86_64",
    tag = "sparkseal/fixture:amd64",
)

oci_image_index(name = "index", images = [":image", ":image_amd64"])
"""


@pytest.fixture(scope="module")
def bazel_ws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    if BAZEL is None:
        pytest.skip("bazel is not installed (make setup installs it)")
    ws = _bazel_workspace(tmp_path_factory.mktemp("push-bazel") / "ws")
    build = ws.root / "image" / "BUILD"
    text = IMAGE_BUILD.format(content="X = 1", tag=TAG).replace(
        'load(":tree.bzl"', 'load("//rules/private:oci_image_index.bzl", "oci_image_index")\nload(":tree.bzl"'
    )
    build.write_text(text + INDEX_BUILD)
    yield ws
    ws.shutdown()


@pytest.mark.bazel
def test_bazel_run_push_and_index_push(bazel_ws: Workspace, tmp_path: Path) -> None:
    result = bazel_ws.bazel("build", "//image:index", "//image:index.push", "//image:image.push")
    assert result.returncode == 0, result.output
    digest = bazel_ws.bin_path("image/index.digest").read_text()
    index = bazel_ws.bin_path("image/index.json").read_bytes()
    assert digest == "sha256:" + hashlib.sha256(index).hexdigest()
    # the Bazel action writes what the program writes from the same layouts
    layouts = [str(bazel_ws.bin_path(f"image/{name}")) for name in ("image", "image_amd64")]
    args = ["--image", layouts[0], "--image", layouts[1], "--index", str(tmp_path / "i.json")]
    assert index_action.main([*args, "--digest", str(tmp_path / "d")]) == 0
    assert (tmp_path / "i.json").read_bytes() == index

    with Registry(tmp_path / "registry") as registry:
        result = bazel_ws.bazel("run", "//image:image.push", "--", f"{registry.host}/sparkseal/fixture")
        assert result.returncode == 0, result.output
        image_digest = bazel_ws.bin_path("image/image.digest").read_text()
        assert (
            f"pushed {registry.host}/sparkseal/fixture:test@{image_digest}: 3 blobs uploaded" in result.output
        )
        result = bazel_ws.bazel("run", "//image:index.push", "--", f"{registry.host}/sparkseal/fixture:multi")
        assert result.returncode == 0, result.output
        # the arm64 image's blobs are there already: only the amd64 config is new (the layers are shared)
        assert f"pushed {registry.host}/sparkseal/fixture:multi@{digest}: 1 blobs uploaded" in result.output
        raw = _skopeo(
            "inspect", "--raw", "--tls-verify=false", f"docker://{registry.host}/sparkseal/fixture:multi"
        )
        assert raw.encode() == index
        result = bazel_ws.bazel("run", "//image:index.push")
        assert (
            result.returncode == 2
            and "usage: bazel run //image:index.push -- REGISTRY/REPOSITORY" in result.output
        )


# --- bearer-token authentication ------------------------------------------------------------------
# Debian's registry signs tokens only with a token service of its own (certificates, JWTs); the client's
# side of the exchange is checked against a loopback server that speaks it: a 401 with a Bearer challenge,
# a token service that wants basic credentials, then the token on every request.

TOKEN = "t0ken-for-push"


class _TokenRegistry(http.server.BaseHTTPRequestHandler):
    login = "pusher:s3cr3t-pw"
    token_queries: list[dict[str, list[str]]] = []  # noqa: RUF012 - shared by the handler's instances
    stored: dict[str, bytes] = {}  # noqa: RUF012

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {TOKEN}":
            return True
        realm = f"http://{self.headers['Host']}/token"
        challenge = f'Bearer realm="{realm}",service="fixture",scope="repository:sparkseal/fixture:pull,push"'
        self._answer(401, {"WWW-Authenticate": challenge}, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
        return False

    def do_GET(self) -> None:
        parts = urllib.parse.urlsplit(self.path)
        type(self).token_queries.append(urllib.parse.parse_qs(parts.query))
        expected = "Basic " + base64.b64encode(self.login.encode()).decode()
        if parts.path != "/token" or self.headers.get("Authorization") != expected:
            self._answer(401)
            return
        self._answer(200, {"Content-Type": "application/json"}, json.dumps({"token": TOKEN}).encode())

    def do_HEAD(self) -> None:
        if self._authorized():
            self._answer(200 if self.path.rsplit("/", 1)[1] in self.stored else 404)

    def do_POST(self) -> None:
        if self._authorized():
            self._answer(202, {"Location": "/v2/sparkseal/fixture/blobs/uploads/1?state=x"})

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if not self._authorized():
            return
        parts = urllib.parse.urlsplit(self.path)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if "/manifests/" in parts.path:
            self._answer(201, {"Docker-Content-Digest": digest})
            return
        assert urllib.parse.parse_qs(parts.query) == {"state": ["x"], "digest": [digest]}
        type(self).stored[digest] = body
        self._answer(201)


@pytest.fixture
def token_registry() -> Iterator[str]:
    _TokenRegistry.token_queries, _TokenRegistry.stored = [], {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TokenRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("netrc_line", "error"),
    [
        ("machine 127.0.0.1 login pusher password s3cr3t-pw", ""),
        ("machine 127.0.0.1 login pusher password wrong-pw", "answered HTTP 401 (credentials refused)"),
        (
            "machine other.example login pusher password s3cr3t-pw",
            "answered HTTP 401 (no netrc credentials for this host)",
        ),
    ],
)
def test_bearer_token_from_netrc_credentials(
    token_registry: str,
    image: Image,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    netrc_line: str,
    error: str,
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text(netrc_line + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    code, report, err = _push(capsys, f"{token_registry}/sparkseal/fixture:1", "--layout", str(image.layout))
    assert "s3cr3t" not in err and "wrong-pw" not in err and TOKEN not in err
    if not error:
        assert code == 0, err
        assert sorted(_TokenRegistry.stored) == sorted(report["uploaded"])  # type: ignore[arg-type]
        assert _TokenRegistry.token_queries[0] == {
            "scope": ["repository:sparkseal/fixture:pull,push"],
            "service": ["fixture"],
        }
        return
    assert code == 1
    assert f"registry http://{token_registry}: token service http://{token_registry}/token {error}" in err
