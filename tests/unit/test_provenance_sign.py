"""`sparkseal provenance sign` and `check --pubkey`: DSSE envelopes with ed25519 keys made at test time."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from sparkseal import cli
from tests.unit.test_provenance import Build, make_build


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = cli.main(["provenance", *args])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _keys(directory: Path, name: str) -> tuple[Path, Path]:
    """A fresh ed25519 key pair as PEM files: (private, public)."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = directory / f"{name}.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public = directory / f"{name}.pub.pem"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


@pytest.fixture
def signed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Build, Path, Path]:
    build = make_build(tmp_path / "build")
    keys = tmp_path / "keys"
    keys.mkdir()
    private, public = _keys(keys, "builder")
    code, out, err = _run(capsys, "sign", str(build.statement), "--key", str(private))
    envelope = build.bin / "provenance_linux_aarch64.intoto.dsse.json"
    assert (code, out, err) == (0, f"signed {build.statement} -> {envelope}\n", "")
    return build, envelope, public


def test_signed_statement_verifies_then_its_subjects_are_checked(
    signed: tuple[Build, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    build, envelope, public = signed
    document = json.loads(envelope.read_text())
    assert document["payloadType"] == "application/vnd.in-toto+json"
    assert base64.b64decode(document["payload"]) == build.statement.read_bytes()
    [signature] = document["signatures"]
    assert set(signature) == {"keyid", "sig"}
    code, out, _ = _run(capsys, "check", str(envelope), "--pubkey", str(public))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == f"ok signature (ed25519) verifies with {public}"
    assert lines[-1] == "PASSED: 8 checks, 0 differ"


def test_signing_is_deterministic(
    signed: tuple[Build, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build, envelope, _ = signed
    again = tmp_path / "again.json"
    key = tmp_path / "keys" / "builder.pem"
    assert _run(capsys, "sign", str(build.statement), "--key", str(key), "--out", str(again))[0] == 0
    assert again.read_bytes() == envelope.read_bytes()


def test_a_changed_payload_fails_the_signature(
    signed: tuple[Build, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, envelope, public = signed
    document = json.loads(envelope.read_text())
    statement = json.loads(base64.b64decode(document["payload"]))
    statement["subject"][0]["digest"]["sha256"] = "0" * 64
    document["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    envelope.write_text(json.dumps(document))
    code, out, err = _run(capsys, "check", str(envelope), "--pubkey", str(public))
    assert (code, out) == (1, "")
    keyid = document["signatures"][0]["keyid"]
    assert err == (
        f"sparkseal provenance check: FAILED: {envelope}: signature: the signature of keyid {keyid} "
        f"does not verify with {public}: the payload or the signature was changed after signing\n"
    )


def test_another_key_fails_the_signature(
    signed: tuple[Build, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, envelope, _ = signed
    _, other = _keys(tmp_path / "keys", "other")
    code, out, err = _run(capsys, "check", str(envelope), "--pubkey", str(other))
    assert (code, out) == (1, "")
    assert err.startswith(
        f"sparkseal provenance check: FAILED: {envelope}: signature: expected one by the key of {other}"
    )
    assert err.endswith(": signed with another key\n")


def test_an_envelope_needs_a_pubkey_and_a_statement_needs_a_signature(
    signed: tuple[Build, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    build, envelope, public = signed
    code, _, err = _run(capsys, "check", str(envelope))
    assert code == 2
    assert (
        "a signed statement (DSSE envelope): pass --pubkey KEY to verify its signature before its subjects"
        in err
    )
    code, _, err = _run(capsys, "check", str(build.statement), "--pubkey", str(public))
    assert code == 2
    assert f"{build.statement}: --pubkey {public}: expected a signed statement" in err


def test_keys_of_another_kind_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build = make_build(tmp_path / "build")
    ec_key = tmp_path / "ec.pem"
    ec_key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    code, _, err = _run(capsys, "sign", str(build.statement), "--key", str(ec_key))
    assert code == 2
    assert f"{ec_key}: expected an ed25519 private key, found " in err
    not_pem = tmp_path / "junk.pem"
    not_pem.write_text("junk\n")
    code, _, err = _run(capsys, "sign", str(build.statement), "--key", str(not_pem))
    assert code == 2
    assert f"{not_pem}: expected an ed25519 private key in PEM, cannot load it" in err
    assert not (build.bin / "provenance_linux_aarch64.intoto.dsse.json").exists()


def test_only_a_statement_is_signed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, _ = _keys(tmp_path, "k")
    other = tmp_path / "other.json"
    other.write_text('{"hello": "world"}')
    code, _, err = _run(capsys, "sign", str(other), "--key", str(private))
    assert code == 2
    assert f"{other}: expected _type https://in-toto.io/Statement/v1" in err
    assert not (tmp_path / "other.dsse.json").exists()
