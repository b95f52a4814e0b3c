"""`sparkseal scan`: every rule with positive and negative cases, allow-lists, images, and the repository.

Secrets in this file are assembled from pieces at run time so that the file itself stays clean.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sparkseal.scan import scanner as scan
from sparkseal.scan import secret_rules
from sparkseal.scan.catalogue import Catalogue

REPO = Path(__file__).resolve().parents[2]

AWS = "AKIA" + "Q3EGHT7ZKD2MX5PN"
GITHUB = "ghp" + "_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
HF = "hf" + "_" + "qWeRtYuIoPaSdFgHjKlZxCvBnMqWeRtYuI"
KEY_HEADER = "-----BEGIN " + "RSA PRIVATE KEY-----"
ENTROPIC = "q8Zr2LmX9vTb4Nc7Wd1Ks6Hf"
HOST_IP = ".".join(["10", "20", "30", "40"])
HOME = "/" + "home/" + "alice"
# The end of the summary line: how many rules of ours and of the locked catalogue ran.
RULES_NOTE = f"(rules: {len(scan.RULES)} of sparkseal, {len(Catalogue.find().rules)} of kingfisher 2.14.0)"


def _scan_text(text: str, path: str = "notes.txt") -> list[tuple[int | None, str, str]]:
    findings = scan.scan_stream(path, io.BytesIO(text.encode()))
    return [(f.line, f.rule, f.match) for f in findings]


def test_vendor_token_formats_are_left_to_the_catalogue() -> None:
    """Our rules keep no token format: those come from the maintained catalogue (test_scan_catalogue.py)."""
    assert _scan_text(f"{KEY_HEADER}\nMIIEow...\naws_access_key_id = {AWS}\ntoken: {GITHUB}\n") == []
    assert set(scan.RULES) == {
        "generic-api-key",
        "password-assignment",
        "private-ipv4",
        "home-path",
        "secret-file",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f'API_KEY = "{ENTROPIC}"', [(1, "generic-api-key", "API_KEY=***(24 chars)")]),
        (f'{{"secret_key": "{ENTROPIC}"}}', [(1, "generic-api-key", "secret_key=***(24 chars)")]),
        (f"api-key: {ENTROPIC}", [(1, "generic-api-key", "api-key=***(24 chars)")]),
        ('api_key = "your_api_key_here_12345"', []),  # placeholder
        ('api_key = "aaaaaaaaaaaaaaaaaaaaaaaa"', []),  # low entropy
        ('secret_key = "abcdefghijklmnopqrstuvwx"', []),  # letters only
        ("api_key = os.environ['API_KEY']", []),
        (f"capi_keys = {ENTROPIC}", []),  # not the key name
    ],
)
def test_generic_api_key_rule(text: str, expected: list[tuple[int, str, str]]) -> None:
    assert _scan_text(text) == expected


@pytest.mark.parametrize(
    ("path", "text", "expected"),
    [
        (
            "app.py",
            'db_password = "' + "hunter2x" + '"',
            [(1, "password-assignment", "password=***(8 chars)")],
        ),
        ("conf.yaml", "password: " + "s3cretvalue\n", [(1, "password-assignment", "password=***(11 chars)")]),
        (".env", "PASSWD=" + "tops3cret\n", [(1, "password-assignment", "PASSWD=***(9 chars)")]),
        ("app.py", "password = args.password", []),  # code: only quoted literals count
        ("app.py", 'parser.add_argument("--password", help="the password")', []),
        ("conf.yaml", "password: ${DB_PASSWORD}", []),
        ("conf.yaml", 'password: "<your password>"', []),
        ("app.py", 'password = "password"', []),
        ("app.py", 'password = "***"', []),
    ],
)
def test_password_rule(path: str, text: str, expected: list[tuple[int, str, str]]) -> None:
    assert [f for f in _scan_text(text, path) if f[1] != "secret-file"] == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"MASTER_ADDR={HOST_IP}", [(1, "private-ipv4", "10.x.x.x")]),
        ("url = http://" + "192.168." + "1.20:8000/v1", [(1, "private-ipv4", "192.168.x.x")]),
        ("peer " + "172.31." + "0.7.", [(1, "private-ipv4", "172.x.x.x")]),
        ("172.32." + "0.7", []),  # outside 172.16/12
        ("10.0.0.0/8 and 192.168.0.0/16", []),  # ranges, not hosts
        ("10.1.2.0 network, 10.1.2.255 broadcast", []),
        ("nvidia-curand==10.4." + "0.35", []),  # a four-part version
        ('"version": "10.4.' + '0.35"', []),
        ('"versionInfo": "10.4.' + '0.35"', []),  # SPDX
        ("pkg:pypi/nvidia-curand@10.4." + "0.35?arch=aarch64", []),  # a package URL
        ("pkg:pypi/nvidia-curand host 10.4." + "0.35", [(1, "private-ipv4", "10.x.x.x")]),
        ("cuda-10.2." + "89.1", []),
        ("1.10.2." + "3.4", []),
        ("10.300.1.2", []),
        ("127.0.0.1 and 8.8.8.8", []),
    ],
)
def test_private_ipv4_rule(text: str, expected: list[tuple[int, str, str]]) -> None:
    assert _scan_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"cache at {HOME}/.cache/x", [(1, "home-path", "/home/a***")]),
        ("built in /" + "Users/Bob/src", [(1, "home-path", "/Users/B***")]),
        ("/home/user/project and /home/runner/work", []),  # documentation and CI placeholders
        ("/home/a/x", []),  # one letter: too short to name anyone (redacted output looks like this)
        ("/root/.cache/sparkseal", []),
        ("/data/home/alice", []),  # not a home directory at the root
        ("/home/<user>", []),
    ],
)
def test_home_path_rule(text: str, expected: list[tuple[int, str, str]]) -> None:
    assert _scan_text(text) == expected


@pytest.mark.parametrize(
    ("path", "content", "flagged"),
    [
        (".env", b"", True),
        ("deploy/.env.production", b"", True),
        (".env.example", b"", False),
        ("keys/server.key", b"", True),
        ("home/.ssh/id_rsa", b"", True),
        ("home/.ssh/id_rsa.pub", b"", False),
        ("certs/store.p12", b"", True),
        ("certs/ca.pem", b"-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n", False),
        ("certs/opaque.pem", b"binary", True),
        ("keyboard.py", b"", False),
    ],
)
def test_secret_file_rule(path: str, content: bytes, flagged: bool) -> None:
    findings = [f for f in scan.scan_stream(path, io.BytesIO(content)) if f.rule == "secret-file"]
    assert [(f.line, f.match) for f in findings] == ([(None, Path(path).name)] if flagged else [])


def test_binary_content_and_long_lines_are_scanned() -> None:
    blob = b"\x00\x7fELF" + b"\x01" * (3 << 20) + f"{HOME}/build/x.o".encode() + b"\x00" * 10
    findings = scan.scan_stream("lib/libx.so", io.BytesIO(blob))
    assert [(f.line, f.rule, f.match) for f in findings] == [(1, "home-path", "/home/a***")]
    many = ("\n" * 70000 + f"ip {HOST_IP}\n") * 20
    lines = [f.line for f in scan.scan_stream("big.txt", io.BytesIO(many.encode()))]
    assert lines == [70001 * k for k in range(1, 21)]


def test_finding_location_format() -> None:
    assert scan.Finding("a/b.py", 3, "home-path", "/home/a***").location() == "a/b.py:3:home-path"
    named = scan.Finding("x/.env", None, "secret-file", ".env", layer="sha256:0123456789ab")
    assert named.location() == "sha256:0123456789ab:x/.env:-:secret-file"


def _allow(tmp_path: Path, entries: object) -> Path:
    path = tmp_path / "allow.json"
    path.write_text(json.dumps(entries))
    return path


def test_allowlist_allows_and_reports_unused_entries(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/setup.md").write_text(f"MASTER_ADDR={HOST_IP}\nat {HOME}/x\n")
    allow = _allow(
        tmp_path,
        {
            "allow": [
                {"path": "*/docs/*.md", "rule": "private-ipv4", "reason": "example address in the guide"},
                {"path": "nothing/*", "rule": "home-path", "reason": "kept for a later fixture"},
            ]
        },
    )
    report = scan.run_scan([tmp_path / "docs"], None, allow)
    assert [f.location() for f in report.findings] == [f"{tmp_path}/docs/setup.md:2:home-path"]
    assert [f.rule for f in report.allowed] == ["private-ipv4"]
    assert report.unused_allow == [scan.AllowEntry("nothing/*", "home-path", "kept for a later fixture")]
    text = scan.render(report, as_json=False).splitlines()
    assert text == [
        f"{tmp_path}/docs/setup.md:2:home-path: /home/a***",
        "note: allow-list entry nothing/* home-path matched nothing",
        f"1 files scanned, 1 finding(s), 1 allowed {RULES_NOTE}",
    ]


def test_an_entry_for_a_source_covers_its_bytecode_only() -> None:
    site = "opt/venv/lib/python3.11/site-packages"
    allow = [scan.AllowEntry(f"{site}/pkg/net.py", "private-ipv4", "a documented example address")]
    findings = [
        scan.Finding(f"{site}/pkg/__pycache__/net.cpython-311.pyc", None, "private-ipv4", "10.2***"),
        scan.Finding(f"{site}/pkg/__pycache__/net.cpython-311.pyc", None, "home-path", "/home/a***"),
        scan.Finding(f"{site}/pkg/__pycache__/other.cpython-311.pyc", None, "private-ipv4", "10.2***"),
        scan.Finding(f"{site}/pkg/sub/__pycache__/net.cpython-311.pyc", None, "private-ipv4", "10.2***"),
        scan.Finding(f"{site}/pkg/net.pyc", None, "private-ipv4", "10.2***"),
    ]
    report = secret_rules.apply_allowlist(findings, allow)
    assert [f.path for f in report.allowed] == [f"{site}/pkg/__pycache__/net.cpython-311.pyc"]
    assert [(f.path.removeprefix(site), f.rule) for f in report.findings] == [
        ("/pkg/__pycache__/net.cpython-311.pyc", "home-path"),
        ("/pkg/__pycache__/other.cpython-311.pyc", "private-ipv4"),
        ("/pkg/sub/__pycache__/net.cpython-311.pyc", "private-ipv4"),
        ("/pkg/net.pyc", "private-ipv4"),
    ]
    assert secret_rules.allow_paths("__pycache__/top.cpython-311.opt-1.pyc") == (
        "__pycache__/top.cpython-311.opt-1.pyc",
        "top.py",
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"allow": [{"path": "a/*", "rule": "home-path"}]},
            "allow[0]: expected the keys path, rule, reason, found",
        ),
        (
            {"allow": [{"path": "a/*", "rule": "home-path", "reason": "  "}]},
            "allow[0]: expected a reason for allowing home-path in a/*, found none",
        ),
        (
            {"allow": [{"path": "a/*", "rule": "home-dir", "reason": "r"}]},
            "allow[0]: expected a rule among generic-api-key, password-assignment",
        ),
        (
            {"allow": [{"path": "", "rule": "home-path", "reason": "r"}]},
            "expected a path glob, found an empty one",
        ),
        (
            {"allow": [{"path": 1, "rule": "home-path", "reason": "r"}]},
            "path, rule and reason must be strings",
        ),
        ([], 'expected an object {"allow": [...]}, found []'),
        ({"allow": [], "extra": 1}, 'expected an object {"allow": [...]}'),
    ],
)
def test_allowlist_errors(tmp_path: Path, document: object, message: str) -> None:
    allow = _allow(tmp_path, document)
    with pytest.raises(scan.ScanInputError) as error:
        scan.load_allowlist(allow)
    assert str(error.value).startswith(f"{allow}: ")
    assert message in str(error.value)


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkseal", "scan", *args],
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    clean = tmp_path / "clean.txt"
    clean.write_text("nothing to see\n")
    done = _cli(str(clean))
    assert (done.returncode, done.stdout) == (0, f"1 files scanned, 0 finding(s), 0 allowed {RULES_NOTE}\n")

    dirty = tmp_path / "dirty.txt"
    dirty.write_text(f"\nexport HF_TOKEN={HF}\n")
    done = _cli(str(dirty), "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["findings"] == [
        {
            "path": str(dirty),
            "line": 2,
            "rule": "betterleaks.huggingface-access-token",
            "match": "hf_q***(37 chars)",
            "layer": None,
        }
    ]
    assert HF not in done.stdout

    no_reason = _allow(tmp_path, {"allow": [{"path": "*", "rule": "betterleaks.jwt", "reason": ""}]})
    done = _cli(str(dirty), "--allow", str(no_reason))
    assert done.returncode == 2
    assert "expected a reason for allowing betterleaks.jwt in *, found none" in done.stderr

    done = _cli(str(tmp_path / "absent"))
    assert done.returncode == 2
    assert f"{tmp_path / 'absent'}: no such file or directory" in done.stderr
    done = _cli(cwd=tmp_path)
    assert done.returncode == 2
    assert f"{tmp_path}: not a git checkout" in done.stderr
    assert _cli("--help").returncode == 0


# --- images -------------------------------------------------------------------------------------------


def _layer(files: dict[str, bytes], compress: bool = True) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0) if compress else raw.getvalue()


def _blob(root: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs/sha256").mkdir(parents=True, exist_ok=True)
    (root / "blobs/sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


def _oci_layout(root: Path, layers: list[bytes], nested: bool = False) -> list[str]:
    descriptors = [{"mediaType": LAYER_TYPE, **_blob(root, layer)} for layer in layers]
    manifest = {"schemaVersion": 2, "layers": descriptors}
    top = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **_blob(root, json.dumps(manifest).encode()),
    }
    if nested:
        index = {"schemaVersion": 2, "manifests": [top]}
        top = {
            "mediaType": "application/vnd.oci.image.index.v1+json",
            **_blob(root, json.dumps(index).encode()),
        }
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return [str(d["digest"])[:19] for d in descriptors]


IMAGE_FILES = [
    {"opt/venv/bin/python3": b"\x7fELF", "etc/app.conf": f"upstream = {HOST_IP}\n".encode()},
    {"./opt/venv/lib/x.py": f"\n\nCACHE = '{HOME}/.cache'\n".encode(), "etc/.wh.app.conf": b""},
]


def test_oci_layout_directory_and_archive(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    ids = _oci_layout(layout, [_layer(IMAGE_FILES[0]), _layer(IMAGE_FILES[1], compress=False)], nested=True)
    expected = [
        f"{ids[0]}:etc/app.conf:1:private-ipv4",
        f"{ids[1]}:opt/venv/lib/x.py:3:home-path",
    ]
    report = scan.run_scan([], layout, None, root=tmp_path)
    assert [f.location() for f in report.findings] == expected
    assert report.files == 3  # the whiteout carries no content

    dotted = tmp_path / "dotted.tar"
    with tarfile.open(dotted, "w") as tar:
        tar.add(layout, arcname=".", recursive=True)
    assert [f.location() for f in scan.run_scan([], dotted, None, root=tmp_path).findings] == expected
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as tar:
        for path in sorted(layout.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=path.relative_to(layout).as_posix())
    assert [f.location() for f in scan.run_scan([], plain, None, root=tmp_path).findings] == expected

    allow = _allow(tmp_path, {"allow": [{"path": "etc/*.conf", "rule": "private-ipv4", "reason": "test"}]})
    done = _cli("--image", str(plain), "--allow", str(allow))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"{ids[1]}:opt/venv/lib/x.py:3:home-path: /home/a***",
        f"3 files scanned, 1 finding(s), 1 allowed {RULES_NOTE}",
    ]


def test_an_image_scan_reads_the_checkouts_image_allow_list(tmp_path: Path) -> None:
    """``--image`` without ``--allow`` reads third_party/scan/image-allow.json of the checkout it runs in,
    the list the image build's layer scans read, and not the checkout's own list (whose paths name the
    repository's files, so its entries would all read as stale); without that file, a note says that
    every match is a finding."""
    layout = tmp_path / "layout"
    passwd = f"vllm:x:1000:1000::{HOME}:/bin/sh\n".encode()
    ids = _oci_layout(layout, [_layer({"etc/passwd": passwd, "etc/app.conf": f"at {HOST_IP}\n".encode()})])
    checkout = tmp_path / "checkout"
    (checkout / "third_party/scan").mkdir(parents=True)
    home = {"path": "etc/passwd", "rule": "home-path", "reason": "the service account's home"}
    (checkout / "third_party/scan/image-allow.json").write_text(json.dumps({"allow": [home]}))
    repository = {"path": "etc/app.conf", "rule": "private-ipv4", "reason": "a repository file"}
    (checkout / scan.DEFAULT_ALLOW).write_text(json.dumps({"allow": [repository]}))

    report = scan.run_scan([], layout, None, root=checkout)
    assert [f.location() for f in report.findings] == [f"{ids[0]}:etc/app.conf:1:private-ipv4"]
    assert [f.location() for f in report.allowed] == [f"{ids[0]}:etc/passwd:1:home-path"]
    assert report.unused_allow == [] and report.notes == []
    done = _cli("--image", str(layout), cwd=checkout)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == [
        f"{ids[0]}:etc/app.conf:1:private-ipv4: 10.x.x.x",
        f"2 files scanned, 1 finding(s), 1 allowed {RULES_NOTE}",
    ]

    (checkout / "third_party/scan/image-allow.json").unlink()
    report = scan.run_scan([], layout, None, root=checkout)
    assert len(report.findings) == 2 and report.allowed == []
    assert report.notes == [
        f"no image allow-list: expected third_party/scan/image-allow.json in {checkout} (run the scan in a "
        "checkout of the commit that built the image, or pass --allow), found none: every match is a finding"
    ]


def test_docker_archive(tmp_path: Path) -> None:
    archive = tmp_path / "docker.tar"
    layer = _layer(IMAGE_FILES[0], compress=False)
    manifest = json.dumps([{"Config": "config.json", "Layers": ["abc/layer.tar"]}]).encode()
    with tarfile.open(archive, "w") as tar:
        for name, data in (("manifest.json", manifest), ("abc/layer.tar", layer)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    report = scan.run_scan([], archive, None, root=tmp_path)
    assert [f.location() for f in report.findings] == ["abc/layer.tar:etc/app.conf:1:private-ipv4"]


def test_image_errors(tmp_path: Path) -> None:
    with pytest.raises(scan.ScanInputError, match="no such file or directory"):
        scan.run_scan([], tmp_path / "absent", None, root=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(scan.ScanInputError) as error:
        scan.run_scan([], empty, None, root=tmp_path)
    assert (
        str(error.value)
        == f"{empty}: expected index.json (OCI) or manifest.json (docker archive), found none"
    )
    not_tar = tmp_path / "image.tar"
    not_tar.write_text("hello")
    with pytest.raises(
        scan.ScanInputError, match=f"^{not_tar}: expected an OCI layout directory or an image"
    ):
        scan.run_scan([], not_tar, None, root=tmp_path)
    broken = tmp_path / "broken"
    ids = _oci_layout(broken, [b"\x28\xb5\x2f\xfd not a tar"])
    with pytest.raises(scan.ScanInputError) as error:
        scan.run_scan([], broken, None, root=tmp_path)
    assert str(error.value).startswith(f"{broken}: layer {ids[0]}")
    assert "is not a readable tar" in str(error.value)
    missing_blob = tmp_path / "missing"
    _oci_layout(missing_blob, [_layer({})])
    for blob in (missing_blob / "blobs/sha256").iterdir():
        blob.unlink()
    with pytest.raises(
        scan.ScanInputError, match=r"expected blobs/sha256/[0-9a-f]{64} in the image, found none"
    ):
        scan.run_scan([], missing_blob, None, root=tmp_path)


def test_repository_is_clean() -> None:
    """The real scan over the repository: every finding is fixed or allowed with a reason, no stale entry."""
    report = scan.run_scan([], None, None, root=REPO)
    assert report.files > 50
    assert report.findings == [], scan.render(report, as_json=False)
    assert report.unused_allow == [], scan.render(report, as_json=False)
