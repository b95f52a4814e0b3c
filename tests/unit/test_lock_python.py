"""``sparkseal lock python``: parsing, wheel selection, the written files, and the checked-in locks."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkseal.core.wheels import parse_wheel_filename, tag_rank
from sparkseal.fetch import lock_python as lp
from sparkseal.fetch.index import list_files
from tests.fixture_wheels import locked_installer_wheel, make_wheel
from tests.fixtures_vllm import make_sdist
from tests.servers import fixture_index
from tests.servers.fixture_index import FixtureIndex

REPO = Path(__file__).resolve().parents[2]
LOCK_DIR = REPO / "third_party/python"
HEX_A, HEX_B = "a" * 64, "b" * 64


# --- parsing -------------------------------------------------------------------------------------------


def test_parse_keeps_hashes_and_annotations() -> None:
    text = (
        "# header\n"
        "Foo_Bar==1.0 \\\n"
        f"    --hash=sha256:{HEX_A} \\\n"
        f"    --hash=sha256:{HEX_B}\n"
        "    # via\n"
        "    #   baz\n"
        f"baz==2.0.post1 --hash=sha256:{HEX_A}\n"
    )
    pins = lp.parse_requirements(text, "x.txt")
    assert pins == [
        lp.Pin("foo-bar", "1.0", (HEX_A, HEX_B), ("# via", "#   baz")),
        lp.Pin("baz", "2.0.post1", (HEX_A,), ()),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "foo>=1.0 \\\n    --hash=sha256:" + HEX_A + "\n",
            "x.txt:1: expected NAME==VERSION, found 'foo>=1.0'",
        ),
        ("foo==1.0\n", "x.txt:1: foo==1.0 has no --hash"),
        (
            "# c\nfoo==1.0 --hash=md5:abc\n",
            "x.txt:2: expected --hash=sha256:<64 hex digits>, found '--hash=md5:abc'",
        ),
        (
            f"foo==1.0 --hash=sha256:{HEX_A}\nFoo==2.0 --hash=sha256:{HEX_B}\n",
            "x.txt: expected one pin per project, found several for foo",
        ),
    ],
)
def test_parse_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(lp.LockError) as error:
        lp.parse_requirements(text, "x.txt")
    assert str(error.value) == message


# --- wheel selection against a loopback index ----------------------------------------------------------


def _wheel_bytes(
    tmp: Path, name: str, version: str, tag: str, requires: tuple[str, ...] = ()
) -> tuple[str, bytes]:
    module = name.replace("-", "_")
    path = make_wheel(tmp, name, version, tag=tag, files={f"{module}/__init__.py": b""}, requires=requires)
    return path.name, path.read_bytes()


@pytest.fixture
def wheels(tmp_path: Path) -> dict[str, bytes]:
    """A small index: beta has several wheels per platform; epsilon has none for glibc 2.36 on aarch64."""
    specs = [
        ("alpha", "1.0", "py3-none-any", ("beta>=2", "vllm")),
        ("beta", "1.0", "py3-none-any", ()),
        ("beta", "2.0", "cp311-cp311-manylinux_2_28_aarch64", ()),
        ("beta", "2.0", "cp38-abi3-manylinux_2_17_aarch64.manylinux2014_aarch64", ()),
        ("beta", "2.0", "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64", ()),
        ("beta", "2.0", "cp312-cp312-manylinux_2_28_aarch64", ()),
        ("gamma", "1.0", "py3-none-any", ()),
        ("delta", "3.0", "py3-none-any", ()),
        ("epsilon", "1.0", "cp311-cp311-manylinux_2_39_aarch64", ()),
        ("epsilon", "1.0", "cp311-cp311-manylinux_2_28_x86_64", ()),
        ("epsilon", "1.0", "cp311-cp311-win_amd64", ()),
        ("vllm", "0.25.1", "cp38-abi3-manylinux_2_28_aarch64", ("delta",)),
        ("vllm", "0.25.1", "cp38-abi3-manylinux_2_28_x86_64", ("delta",)),
    ]
    out = dict(_wheel_bytes(tmp_path, *spec) for spec in specs)
    out["beta-2.0.tar.gz"] = b"an sdist that must not be picked"
    return out


def _pin(files: dict[str, bytes], name: str, version: str) -> lp.Pin:
    shas = [
        hashlib.sha256(data).hexdigest() for f, data in files.items() if f.startswith(f"{name}-{version}")
    ]
    return lp.Pin(name, version, tuple(shas))


def test_selection_prefers_what_pip_prefers(wheels: dict[str, bytes]) -> None:
    with FixtureIndex(wheels) as index:
        pins = [_pin(wheels, "beta", "2.0"), _pin(wheels, "gamma", "1.0")]
        arm = lp.select_wheels(pins, "linux_aarch64", lambda p: list_files(p, index.url), "r.txt")
        x86 = lp.select_wheels(pins, "linux_x86_64", lambda p: list_files(p, index.url), "r.txt")
    assert [w.filename for w in arm] == [
        "beta-2.0-cp311-cp311-manylinux_2_28_aarch64.whl",
        "gamma-1.0-py3-none-any.whl",
    ]
    assert x86[0].filename == "beta-2.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    assert arm[0].sha256 == hashlib.sha256(wheels[arm[0].filename]).hexdigest()


def test_a_pin_without_a_wheel_for_the_target_is_named(wheels: dict[str, bytes]) -> None:
    pins = [_pin(wheels, "epsilon", "1.0"), _pin(wheels, "gamma", "1.0")]
    with FixtureIndex(wheels) as index, pytest.raises(lp.LockError) as error:
        lp.select_wheels(
            pins, "linux_aarch64", lambda p: list_files(p, index.url), "requirements_linux_aarch64.txt"
        )
    assert str(error.value) == (
        "requirements_linux_aarch64.txt: 1 of 2 pins have no wheel for CPython 3.11 on linux_aarch64, "
        "manylinux glibc <= 2.36:\n"
        f"  epsilon==1.0: {index.page_url('epsilon')} lists "
        "epsilon-1.0-cp311-cp311-manylinux_2_28_x86_64.whl, "
        "epsilon-1.0-cp311-cp311-manylinux_2_39_aarch64.whl, epsilon-1.0-cp311-cp311-win_amd64.whl"
    )


def test_a_wheel_whose_hash_the_resolver_did_not_lock_is_refused(wheels: dict[str, bytes]) -> None:
    pin = lp.Pin("gamma", "1.0", (HEX_A,))
    with FixtureIndex(wheels) as index:
        chosen = lp.select_wheel(pin, "linux_x86_64", list_files("gamma", index.url))
        sha = index.sha256("gamma-1.0-py3-none-any.whl")
    assert chosen == (
        f"gamma==1.0: gamma-1.0-py3-none-any.whl has sha256 {sha} on {index.page_url('gamma')}, "
        "which is not among the 1 hashes the resolver locked"
    )


def test_vllm_itself_must_not_be_locked(wheels: dict[str, bytes]) -> None:
    with pytest.raises(
        lp.LockError, match=r"^r\.txt: vllm must not be locked \(the build supplies its own wheel\)$"
    ):
        lp.select_wheels([_pin(wheels, "vllm", "0.25.1")], "linux_aarch64", lambda p: pytest.fail(p), "r.txt")


def test_rendered_lock_round_trips_with_one_hash_per_pin(wheels: dict[str, bytes], tmp_path: Path) -> None:
    pins = [lp.Pin("beta", "2.0", _pin(wheels, "beta", "2.0").hashes, ("# via alpha",))]
    with FixtureIndex(wheels) as index:
        lp.lock_one(
            "linux_aarch64",
            "".join(
                f"{p.name}=={p.version} "
                + " ".join(f"--hash=sha256:{h}" for h in p.hashes)
                + "\n    # via alpha\n"
                for p in pins
            ),
            lambda p: list_files(p, index.url),
            tmp_path,
            ["generated", "for a test"],
        )
    requirements, files = lp.lock_paths(tmp_path, "linux_aarch64")
    text = requirements.read_text()
    assert text.startswith("# generated\n# for a test\nbeta==2.0 \\\n")
    parsed = lp.parse_requirements(text, str(requirements))
    sidecar = json.loads(files.read_text())
    filename = "beta-2.0-cp311-cp311-manylinux_2_28_aarch64.whl"
    assert parsed == [
        lp.Pin("beta", "2.0", (hashlib.sha256(wheels[filename]).hexdigest(),), ("# via alpha",))
    ]
    assert sidecar["platform"] == "linux_aarch64"
    assert sidecar["requirements"] == "requirements_linux_aarch64.txt"
    assert sidecar["wheels"] == {
        "beta": {"filename": filename, "sha256": parsed[0].hashes[0], "version": "2.0"}
    }


# --- the vLLM requirement files of the sdist ----------------------------------------------------------


def test_requirements_are_read_from_the_sdist(tmp_path: Path) -> None:
    sdist = make_sdist(
        tmp_path / "vllm-0.25.1.tar.gz",
        "0.25.1",
        "752a3a504",
        {
            "requirements/common.txt": b"alpha\n",
            "requirements/cuda.txt": b"-r common.txt\nbeta==2.0\n",
            "requirements/test/cuda.txt": b"pytest\n",
            "vllm/__init__.py": b"",
        },
    )
    root = lp.extract_vllm_requirements(sdist, "0.25.1", tmp_path / "work")
    assert root == Path("vllm-0.25.1/requirements/cuda.txt")
    assert sorted(p.name for p in (tmp_path / "work/vllm-0.25.1/requirements").iterdir()) == [
        "common.txt",
        "cuda.txt",
    ]
    assert (tmp_path / "work" / root).read_bytes() == b"-r common.txt\nbeta==2.0\n"

    bare = make_sdist(
        tmp_path / "vllm-0.25.2.tar.gz", "0.25.2", "752a3a504", {"requirements/common.txt": b"x\n"}
    )
    with pytest.raises(lp.LockError) as error:
        lp.extract_vllm_requirements(bare, "0.25.2", tmp_path / "work2")
    assert str(error.value) == (
        f"{bare}: vllm-0.25.2/requirements/cuda.txt is missing (found ['common.txt'])"
    )


# --- the whole lock with the pinned uv, against the loopback index -------------------------------------


@pytest.fixture(scope="module")
def uv() -> Path:
    """The pinned uv, installed from third_party/python/uv.txt into the cache (once)."""
    from sparkseal.fetch.index import index_url

    venv = Path.home() / ".cache" / "sparkseal" / f"uv-{lp.UV_VERSION}"
    return lp.ensure_uv(LOCK_DIR / "uv.txt", venv, index_url())


def _no_head(handler: fixture_index.BaseHTTPRequestHandler) -> None:
    handler.send_response(405)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


@pytest.fixture
def workspace(
    tmp_path: Path, wheels: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, Path, FixtureIndex]]:
    """A lock directory, a vLLM lock naming a fixture sdist, and an index serving the fixture wheels."""
    # uv probes wheels with HEAD (for range requests) and gives up on the fixture's 501; a 405 makes it
    # download the whole file, as from an index without range support.
    monkeypatch.setattr(fixture_index._Handler, "do_HEAD", _no_head, raising=False)
    sdist = make_sdist(
        tmp_path / "vllm-0.25.1.tar.gz",
        "0.25.1",
        "752a3a504",
        {"requirements/common.txt": b"alpha\n", "requirements/cuda.txt": b"-r common.txt\nbeta==2.0\n"},
    )
    directory = tmp_path / "third_party/python"
    directory.mkdir(parents=True)
    (directory / "requirements.in").write_text("gamma  # ours\n")
    (directory / "tools.in").write_text("installer==1.1.0\n")
    vllm_lock = tmp_path / "vllm.lock.json"
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    # The checked-in lock (every field its reader requires), with the fixture's sdist in place of vLLM's.
    locked = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
    vllm_lock.write_text(json.dumps({**locked, "sdist": {"filename": sdist.name, "sha256": sha}}))
    installer = locked_installer_wheel()
    files = {**wheels, "installer-1.1.0-py3-none-any.whl": installer.read_bytes()}
    with FixtureIndex(files) as index:
        yield directory, vllm_lock, index


def _lock(
    uv: Path, directory: Path, vllm_lock: Path, index: FixtureIndex, platforms: tuple[str, ...]
) -> list:
    return lp.lock_platforms(
        uv, platforms, directory, vllm_lock, vllm_lock.parent, index.url, lambda p: list_files(p, index.url)
    )


@pytest.mark.network
def test_lock_with_uv_excludes_vllm_but_keeps_its_requirements(
    uv: Path, workspace: tuple[Path, Path, FixtureIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, vllm_lock, index = workspace
    monkeypatch.chdir(directory.parent.parent)
    rel = Path("third_party/python")
    assert _lock(uv, rel, vllm_lock, index, lp.PLATFORMS) == [
        ("any", 1),
        ("linux_aarch64", 4),
        ("linux_x86_64", 4),
    ]
    arm = lp.parse_requirements((directory / "requirements_linux_aarch64.txt").read_text(), "arm")
    assert [(p.name, p.version) for p in arm] == [
        ("alpha", "1.0"),
        ("beta", "2.0"),
        ("delta", "3.0"),
        ("gamma", "1.0"),
    ]
    by_name = {p.name: p for p in arm}
    assert "# via -r vllm-0.25.1/requirements/common.txt" in by_name["alpha"].comments
    assert "# via vllm" in by_name["delta"].comments
    sidecar = json.loads((directory / "requirements_linux_aarch64.files.json").read_text())
    assert sidecar["wheels"]["beta"]["filename"] == "beta-2.0-cp311-cp311-manylinux_2_28_aarch64.whl"
    x86 = json.loads((directory / "requirements_linux_x86_64.files.json").read_text())
    assert (
        x86["wheels"]["beta"]["filename"]
        == "beta-2.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    )
    header = (directory / "requirements_linux_aarch64.txt").read_text()
    assert "vllm-0.25.1/requirements/cuda.txt of vllm-0.25.1.tar.gz (sha256 " in header
    assert "127.0.0.1" not in header and "http" not in header
    tools = json.loads((directory / "tools.files.json").read_text())
    assert tools["platform"] == "any"
    assert list(tools["wheels"]) == ["installer"]

    # A second run on the same inputs writes the same bytes.
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    _lock(uv, rel, vllm_lock, index, lp.PLATFORMS)
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


@pytest.mark.network
def test_lock_with_uv_fails_naming_the_pin_without_a_wheel(
    uv: Path, workspace: tuple[Path, Path, FixtureIndex], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, vllm_lock, index = workspace
    monkeypatch.chdir(directory.parent.parent)
    (directory / "requirements.in").write_text("gamma\nepsilon\n")
    rel = Path("third_party/python")
    assert _lock(uv, rel, vllm_lock, index, ("linux_x86_64",))[-1] == ("linux_x86_64", 5)
    with pytest.raises(lp.LockError) as error:
        _lock(uv, rel, vllm_lock, index, ("linux_aarch64",))
    # uv itself refuses the resolution here (it sees the platform tags); select_wheels is the second check.
    message = str(error.value)
    assert message.startswith("uv could not resolve for linux_aarch64:\n"), message
    assert "epsilon" in message and "manylinux_2_39_aarch64" in message, message
    assert not (directory / "requirements_linux_aarch64.txt").exists()


# --- the checked-in locks -----------------------------------------------------------------------------


def _checked_in(platform: str) -> tuple[list[lp.Pin], dict]:
    requirements, files = lp.lock_paths(LOCK_DIR, platform)
    return lp.parse_requirements(requirements.read_text(), str(requirements)), json.loads(files.read_text())


@pytest.mark.parametrize("platform", [*lp.PLATFORMS, lp.TOOLS])
def test_checked_in_lock_is_consistent_with_its_sidecar(platform: str) -> None:
    pins, sidecar = _checked_in(platform)
    assert pins, platform
    assert sidecar["platform"] == platform
    assert sidecar["requirements"] == lp.lock_paths(LOCK_DIR, platform)[0].name
    assert sorted(sidecar["wheels"]) == [p.name for p in pins]
    for pin in pins:
        entry = sidecar["wheels"][pin.name]
        assert pin.hashes == (entry["sha256"],), pin.name
        assert entry["version"] == pin.version, pin.name
        name = parse_wheel_filename(entry["filename"])
        assert (name.project, name.version) == (pin.name, pin.version), entry["filename"]
        assert tag_rank(entry["filename"], platform) is not None, entry["filename"]
    assert not set(lp.EXCLUDED) & set(sidecar["wheels"])


def test_checked_in_locks_name_the_locked_vllm_sdist_and_agree_on_torch() -> None:
    vllm = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
    for platform in lp.PLATFORMS:
        header = lp.lock_paths(LOCK_DIR, platform)[0].read_text().split("\n# vllm is left out")[0]
        assert f"of {vllm['sdist']['filename']} (sha256 {vllm['sdist']['sha256']})" in header, platform
    versions = [{p.name: p.version for p in _checked_in(platform)[0]} for platform in lp.PLATFORMS]
    # vLLM pins these exactly (requirements/cuda.txt); both platforms must carry the same.
    for project in ("torch", "torchaudio", "torchvision", "flashinfer-python", "tilelang"):
        assert versions[0][project] == versions[1][project], project


def test_checked_in_uv_lock_pins_uv_version() -> None:
    pins = lp.parse_requirements((LOCK_DIR / "uv.txt").read_text(), "uv.txt")
    assert [(p.name, p.version, len(p.hashes)) for p in pins] == [("uv", lp.UV_VERSION, len(lp.UV_HOSTS))]


def test_exact_pin_takes_one_wheel_per_host(tmp_path: Path) -> None:
    files = dict(
        _wheel_bytes(tmp_path, "tool", "1.0", tag)
        for tag in ["py3-none-manylinux_2_17_aarch64", "py3-none-manylinux_2_17_x86_64", "py3-none-win_amd64"]
    )
    with FixtureIndex(files) as index:
        pin = lp.lock_exact("tool", "1.0", lp.UV_HOSTS, lambda p: list_files(p, index.url))
        with pytest.raises(lp.LockError) as error:
            lp.lock_exact("tool", "2.0", ("linux_x86_64",), lambda p: list_files(p, index.url))
    shas = {name.rsplit("-", 1)[1]: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    assert pin == lp.Pin(
        "tool", "1.0", (shas["manylinux_2_17_aarch64.whl"], shas["manylinux_2_17_x86_64.whl"])
    )
    assert lp.render_uv_lock(pin).endswith(
        f"tool==1.0 \\\n    --hash=sha256:{pin.hashes[0]} \\\n    --hash=sha256:{pin.hashes[1]}\n"
    )
    assert str(error.value) == (
        f"cannot pin tool==2.0:\n  linux_x86_64: tool==2.0: {index.page_url('tool')} lists no wheel at all"
    )
