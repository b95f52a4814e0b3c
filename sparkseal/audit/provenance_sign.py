"""Signed provenance: the in-toto statement in a DSSE envelope, signed with the operator's ed25519 key.

SLSA Build L2 asks that provenance be bound to a builder key: ``sparkseal provenance sign --key KEY``
wraps the statement (payload type ``application/vnd.in-toto+json``) in a DSSE envelope, and
``sparkseal provenance check --pubkey KEY`` verifies the signature before it trusts a single subject.
Keys are PEM files the operator provides (``openssl genpkey -algorithm ed25519 -out key.pem``,
``openssl pkey -in key.pem -pubout -out key.pub.pem``); the DSSE encoding and the ed25519 signature come
from securesystemslib and cryptography (hash-locked in ``.ci/requirements-trust.txt``), never from code
of ours. Ed25519 signatures are deterministic, so one key signs one statement to the same bytes.

Imported only by the commands that sign or verify: the image's runtime does not ship these libraries.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

PAYLOAD_TYPE = "application/vnd.in-toto+json"
# An environment variable, not an option, so the passphrase of an encrypted key stays out of `ps`.
PASSPHRASE_ENV = "SPARKSEAL_KEY_PASSPHRASE"


class SigningInputError(Exception):
    """A key or an envelope cannot be read, or is of the wrong kind; the message names the file."""


class SignatureError(Exception):
    """The envelope's signature does not verify with the given key; the message says how it failed."""


def _libraries() -> tuple[Any, Any, Any]:
    try:
        from cryptography.hazmat.primitives import serialization
        from securesystemslib import dsse
        from securesystemslib.signer import CryptoSigner, SSlibKey
    except ImportError as error:
        raise SigningInputError(
            f"signing needs securesystemslib and cryptography (make setup installs them from "
            f".ci/requirements-trust.txt): {error}"
        ) from None
    return serialization, dsse, (CryptoSigner, SSlibKey)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise SigningInputError(f"{path}: expected {what}, cannot read it: {error.strerror}") from None


def load_private_key(path: Path) -> Any:
    """The ed25519 private key in the PEM file at ``path`` (encrypted: passphrase from PASSPHRASE_ENV)."""
    serialization, _, _ = _libraries()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    passphrase = os.environ.get(PASSPHRASE_ENV)
    try:
        key = serialization.load_pem_private_key(
            _read(path, "a PEM private key"), password=passphrase.encode() if passphrase else None
        )
    except (ValueError, TypeError) as error:
        # cryptography's messages name the problem (not PEM, encrypted, wrong passphrase), never the key.
        raise SigningInputError(
            f"{path}: expected an ed25519 private key in PEM, cannot load it: {error}"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningInputError(f"{path}: expected an ed25519 private key, found {type(key).__name__}")
    return key


def load_public_key(path: Path) -> Any:
    """The ed25519 public key in the PEM file at ``path``."""
    serialization, _, _ = _libraries()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(_read(path, "a PEM public key"))
    except (ValueError, TypeError) as error:
        raise SigningInputError(
            f"{path}: expected an ed25519 public key in PEM, cannot load it: {error}"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningInputError(f"{path}: expected an ed25519 public key, found {type(key).__name__}")
    return key


def envelope_path(statement: Path) -> Path:
    """Where ``sign`` writes by default: ``provenance_X.intoto.json`` -> ``provenance_X.intoto.dsse.json``."""
    name = statement.name.removesuffix(".json")
    return statement.with_name(f"{name}.dsse.json")


def _write_atomically(path: Path, data: bytes) -> None:
    fd, part = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(part, path)
    finally:
        Path(part).unlink(missing_ok=True)


def sign(statement: Path, key: Path, out: Path | None = None) -> Path:
    """Sign the statement at ``statement`` with the private key at ``key``; return where the envelope went."""
    from sparkseal.audit.provenance_check import load_statement

    _, dsse, (crypto_signer, sslib_key) = _libraries()
    payload = _read(statement, "a provenance statement")
    load_statement(statement, payload)  # sign only what check would accept
    private = load_private_key(key)
    signer = crypto_signer(private, sslib_key.from_crypto(private.public_key()))
    envelope = dsse.Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    target = out or envelope_path(statement)
    text = json.dumps(envelope.to_dict(), indent=2, sort_keys=True) + "\n"
    _write_atomically(target, text.encode("ascii"))
    return target


def is_envelope(data: Any) -> bool:
    """True for a decoded DSSE envelope (it has a payload type, a payload and signatures)."""
    return isinstance(data, dict) and {"payload", "payloadType", "signatures"} <= set(data)


def verify(path: Path, pubkey: Path) -> bytes:
    """The payload of the envelope at ``path`` once its signature verifies with ``pubkey``.

    :class:`SignatureError` when it does not (a changed payload or signature, or another signer's key);
    :class:`SigningInputError` when the envelope or the key cannot be read.
    """
    _, dsse, (_, sslib_key) = _libraries()
    from securesystemslib.exceptions import VerificationError

    try:
        data = json.loads(_read(path, "a DSSE envelope"))
    except ValueError as error:
        raise SigningInputError(
            f"{path}: expected a DSSE envelope (JSON), found unreadable content: {error}"
        ) from None
    if not is_envelope(data):
        raise SigningInputError(
            f"{path}: expected a DSSE envelope (payload, payloadType, signatures), "
            f"found {sorted(data) if isinstance(data, dict) else type(data).__name__}"
        )
    if data["payloadType"] != PAYLOAD_TYPE:
        raise SigningInputError(f"{path}: expected payloadType {PAYLOAD_TYPE}, found {data['payloadType']!r}")
    try:
        envelope = dsse.Envelope.from_dict(data)
    except (KeyError, TypeError, ValueError) as error:
        raise SigningInputError(f"{path}: not a readable DSSE envelope: {error!r}") from None
    key = sslib_key.from_crypto(load_public_key(pubkey))
    signers = sorted(envelope.signatures)
    if key.keyid not in signers:
        raise SignatureError(
            f"{path}: signature: expected one by the key of {pubkey} (keyid {key.keyid}), "
            f"found signatures by keyid {', '.join(signers) or 'none'}: signed with another key"
        )
    try:
        envelope.verify([key], 1)
    except VerificationError:
        raise SignatureError(
            f"{path}: signature: the signature of keyid {key.keyid} does not verify with {pubkey}: "
            "the payload or the signature was changed after signing"
        ) from None
    return envelope.payload
