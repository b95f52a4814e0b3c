"""The one Python lock reader (sparkseal.core.locks): every lock of third_party/ in its kind's current format
and in the form its writer writes, every broken copy refused naming the file, the field and the expected
value, a file checked against its locked sha256 in one place.

The Starlark reader gets the same locks and the same broken copies in tests/bazel/test_locks.py.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from sparkseal.core import locks
from tests.lock_cases import BROKEN, NOT_LOCKS, REPO, Broken, lock_kind, third_party_json
from tests.lock_cases import locks as third_party_locks

WHERE = "//third_party/x:lock.json"


def test_every_json_of_third_party_is_a_lock_of_a_kind_or_named_as_none() -> None:
    found = third_party_json()
    assert set(NOT_LOCKS) <= set(found), "a file NOT_LOCKS names is gone: drop it there"
    kinds = {rel: lock_kind(rel) for rel in found if rel not in NOT_LOCKS}
    assert sorted(set(kinds.values())) == sorted(locks.FORMATS)
    assert kinds["third_party/vllm/vllm.lock.json"] == "vllm"
    assert kinds["third_party/toolchains/cc_bookworm_arm64.lock.json"] == "debian"
    assert kinds["third_party/zstd/zstandard.lock.json"] == "wheels"
    assert kinds["third_party/python/tools.files.json"] == "python"
    with pytest.raises(ValueError, match=r"third_party/python/replaces\.json: not a lock"):
        lock_kind("third_party/python/replaces.json")


@pytest.mark.parametrize(("rel", "kind"), sorted(third_party_locks().items()))
def test_every_lock_is_read_in_its_current_format_and_written_as_it_is(rel: str, kind: str) -> None:
    path = REPO / rel
    text = path.read_text()
    lock = locks.read_lock(kind, path)
    assert lock.format == locks.FORMATS[kind]
    # The writers' form: re-rendering the lock gives its bytes (the format was added without other change).
    assert locks.render_lock(kind, json.loads(text), path) == text


def test_what_each_kind_returns() -> None:
    vllm = locks.read_vllm_lock(REPO / "third_party/vllm/vllm.lock.json")
    assert (vllm.name, len(vllm.commit), sorted(vllm.wheels)) == (
        "vllm",
        40,
        ["linux_aarch64", "linux_x86_64"],
    )
    assert vllm.sdist.filename == f"vllm-{vllm.version}.tar.gz"
    zstd = locks.read_wheels_lock(REPO / "third_party/zstd/zstandard.lock.json")
    assert sorted(zstd.wheels["zstandard"].files) == ["linux_aarch64", "linux_x86_64"]
    tools = locks.read_python_lock(REPO / "third_party/python/tools.files.json")
    assert (tools.platform, tools.requirements) == ("any", "tools.txt")
    assert tools.wheels["installer"].filename.endswith("-py3-none-any.whl")
    debian = locks.read_debian_lock(REPO / "third_party/toolchains/python_bookworm_amd64.lock.json")
    assert (debian.architecture, debian.suite) == ("amd64", "bookworm")
    assert {"python3.11-minimal", "libpython3.11-stdlib"} <= {p.package for p in debian.packages}
    assert all(locks.TIMESTAMP.fullmatch(p.snapshot) for p in debian.packages)


@pytest.mark.parametrize("case", BROKEN, ids=[case.id for case in BROKEN])
def test_a_broken_lock_names_the_file_the_field_and_the_expected_value(case: Broken) -> None:
    with pytest.raises(locks.LockError) as info:
        locks.PARSERS[case.kind](case.document(), WHERE)
    assert str(info.value) == f"{WHERE}: {case.message}"


def test_a_lock_is_read_from_its_file_or_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "vllm.lock.json"
    with pytest.raises(locks.LockError, match=rf"^{path}: expected a lock file, found none$"):
        locks.read_vllm_lock(path)
    path.write_text("{")
    with pytest.raises(locks.LockError, match=rf"^{path}: expected a JSON lock, actual unreadable content: "):
        locks.read_vllm_lock(path)
    with pytest.raises(
        ValueError, match="unknown lock kind 'pip': expected one of vllm, wheels, python, debian"
    ):
        locks.read_lock("pip", path)


def test_render_lock_adds_the_format_and_refuses_what_the_reader_refuses() -> None:
    document = json.loads((REPO / "third_party/zstd/zstandard.lock.json").read_text())
    del document["format"]
    assert json.loads(locks.render_lock("wheels", document, WHERE))["format"] == locks.FORMATS["wheels"]
    document["wheels"]["zstandard"]["files"]["linux_x86_64"]["sha256"] = "0" * 63
    with pytest.raises(locks.LockError) as info:
        locks.render_lock("wheels", document, WHERE)
    assert str(info.value) == (
        f"{WHERE}: field `wheels.zstandard.files.linux_x86_64.sha256`: expected 64 lowercase hex digits, "
        f'actual "{"0" * 63}"'
    )


def test_an_abbreviated_commit_is_a_lock_but_only_a_full_one_is_a_provenance() -> None:
    document = json.loads((REPO / "third_party/vllm/vllm.lock.json").read_text())
    document["commit"] = document["commit"][:9]
    assert locks.parse_vllm_lock(document, WHERE).commit == document["commit"]
    document["commit"] = document["commit"][:6]
    with pytest.raises(locks.LockError, match=r"field `commit`: expected 7 to 40 lowercase hex digits"):
        locks.parse_vllm_lock(document, WHERE)


def test_older_debian_formats_are_read_only_when_asked() -> None:
    document = json.loads((REPO / "third_party/debian/bookworm_arm64.lock.json").read_text())
    document["format"] = 1
    for entry in document["packages"]:
        del entry["archive"], entry["path"], entry["snapshot"]
    with pytest.raises(locks.LockError, match=r"field `format`: expected 3 \(a Debian lock.*, actual 1$"):
        locks.parse_debian_lock(document, WHERE)
    formats = (locks.FORMATS["debian"], *locks.DEBIAN_OLDER_FORMATS)
    lock = locks.parse_debian_lock(document, WHERE, formats)
    assert lock.format == 1
    assert {(p.archive, p.path, p.snapshot) for p in lock.packages} == {("", "", "")}


def test_check_file_passes_the_locked_file_and_names_both_digests_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "x.deb"
    path.write_bytes(b"locked")
    locked = hashlib.sha256(b"locked").hexdigest()
    locks.check_file(path, locked, "locked in x.lock.json")
    path.write_bytes(b"other")
    with pytest.raises(locks.LockError) as info:
        locks.check_file(path, locked, "locked in x.lock.json")
    assert str(info.value) == (
        f"{path}: sha256 mismatch: expected {locked} (locked in x.lock.json), "
        f"actual {hashlib.sha256(b'other').hexdigest()}"
    )


def test_a_sha256_is_64_lowercase_hex_digits() -> None:
    assert locks.is_sha256("a" * 64)
    assert not any(locks.is_sha256(v) for v in ("A" * 64, "a" * 63, "a" * 65, "g" * 64, None, 64))
    assert locks.check_sha256("0" * 64, WHERE, "sha256") == "0" * 64
    with pytest.raises(
        locks.LockError, match=r"field `x.sha256`: expected 64 lowercase hex digits, actual null$"
    ):
        locks.check_sha256(None, WHERE, "x.sha256")


def _starlark_constants(path: Path) -> dict[str, Any]:
    """The top-level constants of a .bzl file that are plain values (strings, numbers, lists, dicts)."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                value = compile(ast.Expression(node.value), str(path), "eval")
                found[node.targets[0].id] = eval(value, {"__builtins__": {}})
            except (NameError, TypeError):
                continue  # computed from a loaded name
    return found


def test_the_starlark_reader_knows_the_same_kinds_formats_and_texts() -> None:
    constants = _starlark_constants(REPO / "rules/private/locks.bzl")
    assert constants["LOCK_FORMATS"] == locks.FORMATS
    assert constants["LOCK_DESCRIPTIONS"] == locks.DESCRIPTIONS
    assert constants["COMMIT_EXPECTED"] == locks.COMMIT_EXPECTED
    assert dataclasses.fields(locks.DebianPackage)[-1].name == "snapshot"
