"""The module manifest of an installed tree and of a PEX: content, digests, determinism and every error.

The action that writes it: test_module_manifest.py.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from sparkseal.core import manifest as mm
from tests.installed_tree import SITE, install, make_venv


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_tree_manifest_groups_files_by_record(tmp_path: Path) -> None:
    site = make_venv(tmp_path)
    (site / "stray.py").write_text("print('not from any wheel')\n")
    manifest = mm.tree_manifest(tmp_path, "/opt/venv")

    assert manifest["format"] == mm.FORMAT
    assert manifest["source"] == {"kind": "tree", "prefix": "/opt/venv", "site_packages": SITE}
    dists = manifest["distributions"]
    assert sorted(dists) == [mm.UNOWNED, "sparkseal", "torch", "vllm"]
    vllm = dists["vllm"]
    assert (vllm["name"], vllm["version"]) == ("vllm", "0.25.1")
    assert sorted(vllm["files"]) == [
        "vllm-0.25.1.dist-info/METADATA",
        "vllm-0.25.1.dist-info/WHEEL",
        "vllm/_C.abi3.so",
        "vllm/__init__.py",
        "vllm/config.py",
    ]
    assert sorted(vllm["install_files"]) == [
        "../../../bin/vllm",
        "vllm-0.25.1.dist-info/INSTALLER",
        "vllm-0.25.1.dist-info/RECORD",
    ]
    assert vllm["files"]["vllm/config.py"] == _sha(b"MAX_MODEL_LEN = 4096\n")
    assert dists[mm.UNOWNED]["files"] == {"stray.py": _sha(b"print('not from any wheel')\n")}
    assert list(dists[mm.UNOWNED]["install_files"]) == ["../../../pyvenv.cfg"]
    assert vllm["digest"] == mm.listing_digest(vllm["files"])


def test_given_digests_are_used_and_must_name_exactly_the_files(tmp_path: Path) -> None:
    make_venv(tmp_path)
    venv = tmp_path / "opt/venv"
    read = {p.relative_to(venv).as_posix(): _sha(p.read_bytes()) for p in venv.rglob("*") if p.is_file()}
    assert mm.tree_manifest(tmp_path, "/opt/venv", read) == mm.tree_manifest(tmp_path, "/opt/venv")
    # The digests are taken as given (the layer writer computed them from the bytes it wrote).
    given = {**read, f"{SITE}/vllm/config.py": "0" * 64}
    files = mm.tree_manifest(tmp_path, "/opt/venv", given)["distributions"]["vllm"]["files"]
    assert files["vllm/config.py"] == "0" * 64

    short = {k: v for k, v in read.items() if k != f"{SITE}/vllm/config.py"}
    with pytest.raises(mm.ManifestError) as error:
        mm.tree_manifest(tmp_path, "/opt/venv", {**short, "gone.py": "1" * 64})
    assert str(error.value) == (
        f"{venv}: the given digests do not name the files there: files without a digest "
        f"['{SITE}/vllm/config.py'], digests without a file ['gone.py']"
    )


def test_digests_match_coreutils_sha256sum(tmp_path: Path) -> None:
    """The module docstring promises that sha256sum alone reproduces the digests."""
    site = make_venv(tmp_path)
    manifest = mm.tree_manifest(tmp_path, "/opt/venv")
    script = "find . -type f -printf '%P\\0' | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum"
    top = subprocess.run(["sh", "-c", script], cwd=tmp_path / "opt/venv", capture_output=True, text=True)
    assert top.returncode == 0, top.stderr
    assert top.stdout.split()[0] == manifest["digest"]
    module_files = " ".join(sorted(manifest["distributions"]["torch"]["files"]))
    torch = subprocess.run(
        ["sh", "-c", f"LC_ALL=C sha256sum {module_files} | sha256sum"],
        cwd=site,
        capture_output=True,
        text=True,
    )
    assert torch.stdout.split()[0] == manifest["distributions"]["torch"]["digest"]


def test_manifest_is_byte_identical_across_locations(tmp_path: Path) -> None:
    make_venv(tmp_path / "a")
    make_venv(tmp_path / "b" / "deeper")
    first = mm.dumps(mm.tree_manifest(tmp_path / "a", "/opt/venv"))
    second = mm.dumps(mm.tree_manifest(tmp_path / "b" / "deeper", "/opt/venv"))
    assert first == second
    assert first.endswith("}\n") and first.startswith('{\n  "digest": ')
    assert json.loads(first)["distributions"]["torch"]["version"] == "2.11.0"


def test_a_changed_byte_changes_module_and_top_digest_only_there(tmp_path: Path) -> None:
    make_venv(tmp_path / "a")
    site_b = make_venv(tmp_path / "b")
    (site_b / "torch/nn/functional.py").write_bytes(b"def relu(x):\n    return -x\n")
    a = mm.tree_manifest(tmp_path / "a", "/opt/venv")
    b = mm.tree_manifest(tmp_path / "b", "/opt/venv")
    assert a["digest"] != b["digest"]
    assert a["distributions"]["torch"]["digest"] != b["distributions"]["torch"]["digest"]
    assert a["distributions"]["vllm"] == b["distributions"]["vllm"]


def test_record_naming_a_missing_file_is_an_error(tmp_path: Path) -> None:
    site = make_venv(tmp_path)
    (site / "vllm/config.py").unlink()
    with pytest.raises(mm.ManifestError) as error:
        mm.tree_manifest(tmp_path, "/opt/venv")
    assert str(error.value) == (
        f"{site / 'vllm-0.25.1.dist-info/RECORD'}: names vllm/config.py, which is not a file "
        f"({tmp_path / 'opt/venv' / SITE / 'vllm/config.py'})"
    )


def test_record_escaping_the_venv_is_an_error(tmp_path: Path) -> None:
    site = make_venv(tmp_path)
    install(site, "evil", "1.0", {"../../../../etc/motd": b"hello\n"})
    with pytest.raises(mm.ManifestError, match=r"names \.\./\.\./\.\./\.\./etc/motd, which lies outside"):
        mm.tree_manifest(tmp_path, "/opt/venv")


def test_two_records_naming_one_file_is_an_error(tmp_path: Path) -> None:
    site = make_venv(tmp_path)
    install(site, "torch-shadow", "1.0", {"torch/__init__.py": b"import torch._C\n"})
    with pytest.raises(mm.ManifestError) as error:
        mm.tree_manifest(tmp_path, "/opt/venv")
    assert str(error.value) == (
        f"{site}: torch/__init__.py is named by the RECORD of torch-2.11.0.dist-info "
        "and of torch_shadow-1.0.dist-info"
    )


def test_metadata_without_version_is_an_error(tmp_path: Path) -> None:
    site = make_venv(tmp_path)
    metadata = site / "torch-2.11.0.dist-info/METADATA"
    metadata.write_text("Metadata-Version: 2.1\nName: torch\n")
    with pytest.raises(mm.ManifestError) as error:
        mm.tree_manifest(tmp_path, "/opt/venv")
    assert (
        str(error.value) == f"{metadata}: expected Name and Version headers, found Name='torch' Version=None"
    )


def test_site_packages_must_be_unique(tmp_path: Path) -> None:
    make_venv(tmp_path)
    (tmp_path / "opt/venv/lib/python3.12/site-packages").mkdir(parents=True)
    with pytest.raises(mm.ManifestError) as error:
        mm.tree_manifest(tmp_path, "/opt/venv")
    assert str(error.value) == (
        f"{tmp_path / 'opt/venv'}: expected one lib/python3.*/site-packages directory, found "
        "lib/python3.11/site-packages, lib/python3.12/site-packages"
    )


def test_record_paths_must_be_relative() -> None:
    with pytest.raises(mm.ManifestError, match=r"RECORD: path '/etc/passwd' is not a relative POSIX path"):
        mm.parse_record("/etc/passwd,,\n", "RECORD")
    assert mm.parse_record("a/./b.py,sha256=x,1\n\n../../bin/x,,\n", "RECORD") == ("a/b.py", "../../bin/x")


def test_load_manifest_errors(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    with pytest.raises(mm.ManifestError, match=f"^{missing}: no manifest there$"):
        mm.load_manifest(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(mm.ManifestError, match=f"^{bad}: not a readable JSON manifest: "):
        mm.load_manifest(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something-else/9"}))
    with pytest.raises(mm.ManifestError) as error:
        mm.load_manifest(other)
    assert str(error.value) == (
        f"{other}: expected format 'sparkseal-module-manifest/1' with a distributions object, "
        "found 'something-else/9'"
    )


# A PEX is shaped as pex 2.x writes it: one chroot per wheel under .deps/<wheel file name>, holding the
# site-packages content, a .layout.json naming the stash directory, and scripts in that stash.
_WHEEL = "torch-2.11.0-py3-none-any.whl"


def _chroot_entries(site: Path) -> dict[str, bytes]:
    """The torch chroot a pex would write for the same wheel: same module bytes, its own installer files."""
    entries = {
        path: (site / path).read_bytes()
        for path in ("torch/__init__.py", "torch/nn/functional.py", "torch-2.11.0.dist-info/METADATA")
    }
    entries["torch-2.11.0.dist-info/WHEEL"] = (site / "torch-2.11.0.dist-info/WHEEL").read_bytes()
    entries["torch-2.11.0.dist-info/INSTALLER"] = b"pex\n"
    entries["torch-2.11.0.dist-info/RECORD"] = b"torch/__init__.py,,\n"
    entries[".layout.json"] = json.dumps({"stash_dir": ".prefix", "record_relpath": "x"}).encode()
    entries[".prefix/bin/torchrun"] = b"#!/usr/bin/env python3\n"
    return entries


def _write_zip(path: Path, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in sorted(entries.items()):
            archive.writestr(name, data)


def test_pex_gives_the_same_module_digest_as_the_image(tmp_path: Path) -> None:
    site = make_venv(tmp_path / "tree")
    image = mm.tree_manifest(tmp_path / "tree", "/opt/venv")
    chroot = _chroot_entries(site)
    pex = tmp_path / "app.pex"
    _write_zip(
        pex,
        {
            "PEX-INFO": b"{}",
            "__main__.py": b"",
            ".deps/": b"",
            **{f".deps/{_WHEEL}/{p}": d for p, d in chroot.items()},
        },
    )
    manifest = mm.pex_manifest(pex)
    torch = manifest["distributions"]["torch"]
    assert torch["digest"] == image["distributions"]["torch"]["digest"]
    assert torch["files"] == image["distributions"]["torch"]["files"]
    assert sorted(torch["install_files"]) == [
        ".layout.json",
        ".prefix/bin/torchrun",
        "torch-2.11.0.dist-info/INSTALLER",
        "torch-2.11.0.dist-info/RECORD",
    ]
    assert sorted(manifest["distributions"][mm.UNOWNED]["install_files"]) == ["PEX-INFO", "__main__.py"]
    assert manifest["source"] == {"kind": "pex"}

    packed = tmp_path / "packed"
    (packed / ".deps").mkdir(parents=True)
    _write_zip(packed / ".deps" / _WHEEL, chroot)
    (packed / "PEX-INFO").write_bytes(b"{}")
    (packed / "__main__.py").write_bytes(b"")
    assert mm.pex_manifest(packed) == manifest


def test_raw_wheel_in_a_pex_maps_purelib_data(tmp_path: Path) -> None:
    site = make_venv(tmp_path / "tree")
    image = mm.tree_manifest(tmp_path / "tree", "/opt/venv")
    data = "torch-2.11.0.data"
    entries = {
        f".deps/{_WHEEL}/torch/__init__.py": (site / "torch/__init__.py").read_bytes(),
        f".deps/{_WHEEL}/{data}/purelib/torch/nn/functional.py": (
            site / "torch/nn/functional.py"
        ).read_bytes(),
        f".deps/{_WHEEL}/{data}/scripts/torchrun": b"#!python\n",
        **{
            f".deps/{_WHEEL}/torch-2.11.0.dist-info/{n}": (site / f"torch-2.11.0.dist-info/{n}").read_bytes()
            for n in ("METADATA", "WHEEL", "RECORD")
        },
    }
    pex = tmp_path / "raw.pex"
    _write_zip(pex, entries)
    torch = mm.pex_manifest(pex)["distributions"]["torch"]
    assert torch["digest"] == image["distributions"]["torch"]["digest"]
    assert sorted(torch["install_files"]) == [f"{data}/scripts/torchrun", "torch-2.11.0.dist-info/RECORD"]


def test_pex_errors(tmp_path: Path) -> None:
    not_zip = tmp_path / "broken.pex"
    not_zip.write_text("not a zip")
    with pytest.raises(mm.ManifestError, match=f"^{not_zip}: expected a zip archive: "):
        mm.pex_manifest(not_zip)
    with pytest.raises(mm.ManifestError, match="expected a PEX file or directory, found nothing"):
        mm.pex_manifest(tmp_path / "absent.pex")
    two = tmp_path / "two.pex"
    _write_zip(
        two, {f".deps/{_WHEEL}/a-1.dist-info/METADATA": b"", f".deps/{_WHEEL}/b-1.dist-info/METADATA": b""}
    )
    with pytest.raises(mm.ManifestError) as error:
        mm.pex_manifest(two)
    assert str(error.value) == (
        f"{two}!.deps/{_WHEEL}: expected one *.dist-info directory, found ['a-1.dist-info', 'b-1.dist-info']"
    )
    bad_layout = tmp_path / "layout.pex"
    _write_zip(
        bad_layout,
        {
            f".deps/{_WHEEL}/t-1.dist-info/METADATA": b"Name: t\nVersion: 1\n",
            f".deps/{_WHEEL}/.layout.json": b"{}",
        },
    )
    with pytest.raises(mm.ManifestError, match=r"\.layout\.json: expected a stash_dir string, found None"):
        mm.pex_manifest(bad_layout)


def test_dist_info_without_record_is_an_error(tmp_path: Path) -> None:
    site = make_venv(tmp_path)
    record = site / "sparkseal-0.1.0.dist-info/RECORD"
    record.unlink()
    with pytest.raises(mm.ManifestError) as error:
        mm.tree_manifest(tmp_path, "/opt/venv")
    assert str(error.value) == f"{record}: expected a file in every installed *.dist-info, found none"


def test_one_project_installed_twice_is_an_error(tmp_path: Path) -> None:
    site = make_venv(tmp_path)
    install(site, "Torch", "2.12.0", {"torch_next/__init__.py": b""})
    with pytest.raises(mm.ManifestError) as error:
        mm.tree_manifest(tmp_path, "/opt/venv")
    assert str(error.value) == f"{site}: distribution torch is installed twice (2.12.0, 2.11.0)"


def test_pex_chroot_without_metadata_is_an_error(tmp_path: Path) -> None:
    pex = tmp_path / "nometa.pex"
    _write_zip(pex, {f".deps/{_WHEEL}/t-1.dist-info/RECORD": b""})
    with pytest.raises(mm.ManifestError) as error:
        mm.pex_manifest(pex)
    assert str(error.value) == f"{pex}!.deps/{_WHEEL}: expected t-1.dist-info/METADATA, found none"


def test_layer_manifests_of_other_prefixes_or_formats_are_refused(tmp_path: Path) -> None:
    make_venv(tmp_path / "tree")
    part = mm.tree_manifest(tmp_path / "tree", "/opt/venv")
    other = {**part, "source": {**part["source"], "prefix": "/srv/venv"}}
    with pytest.raises(
        mm.ManifestError, match=r"a\.json: expected tree manifests of one prefix and site-packages"
    ):
        mm.merge_manifests([("a.json", part), ("b.json", other)])
    with pytest.raises(mm.ManifestError, match="no layer manifests to merge"):
        mm.merge_manifests([])
    broken = {**part, "distributions": {"vllm": {"name": "vllm"}}}
    with pytest.raises(mm.ManifestError, match=r"b\.json: expected distributions of name, version, files"):
        mm.merge_manifests([("a.json", {**part, "distributions": {}}), ("b.json", broken)])
