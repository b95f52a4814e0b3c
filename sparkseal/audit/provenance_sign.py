"""Signed provenance: the in-toto statement in a DSSE envelope, signed with the operator's ed25519 key.

Signed provenance binds the statement to the builder's key: ``sparkseal provenance sign --key KEY``
wraps the statement (payload type ``application/vnd.in-toto+json``) in a DSSE envelope, and
``sparkseal provenance check --pubkey KEY`` verifies the signature before it trusts a single subject.
Keys are PEM files the operator provides (``openssl genpkey -algorithm ed25519 -out key.pem``,
``openssl pkey -in key.pem -pubout -out key.pub.pem``); the DSSE encoding and the ed25519 signature come
from securesystemslib and cryptography (hash-locked in ``.ci/requirements-trust.txt``), never from code
of ours. Ed25519 signatures are deterministic, so one key signs one statement to the same bytes.

The envelope's format and its verification live in ``sparkseal.core.dsse``, which the check uses too;
signing asks ``sparkseal.audit.provenance_check`` whether the statement is one it would accept, so the
dependency runs one way (sign -> check -> core). Imported only by the command that signs: the image's
runtime does not ship the signing libraries.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from sparkseal.audit.provenance_check import load_statement
from sparkseal.core.dsse import PAYLOAD_TYPE, SigningInputError, read_input, trust_libraries

# An environment variable, not an option, so the passphrase of an encrypted key stays out of `ps`.
PASSPHRASE_ENV = "SPARKSEAL_KEY_PASSPHRASE"


def load_private_key(path: Path) -> Any:
    """The ed25519 private key in the PEM file at ``path`` (encrypted: passphrase from PASSPHRASE_ENV)."""
    serialization, _, _ = trust_libraries()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    passphrase = os.environ.get(PASSPHRASE_ENV)
    try:
        key = serialization.load_pem_private_key(
            read_input(path, "a PEM private key"), password=passphrase.encode() if passphrase else None
        )
    except (ValueError, TypeError) as error:
        # cryptography's messages name the problem (not PEM, encrypted, wrong passphrase), never the key.
        raise SigningInputError(
            f"{path}: expected an ed25519 private key in PEM, cannot load it: {error}"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningInputError(f"{path}: expected an ed25519 private key, found {type(key).__name__}")
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
    payload = read_input(statement, "a provenance statement")
    load_statement(statement, payload)  # sign only what check would accept
    return sign_payload(payload, key, out or envelope_path(statement))


def sign_payload(payload: bytes, key: Path, target: Path) -> Path:
    """Write the DSSE envelope of the in-toto statement ``payload``, signed with ``key``, to ``target``.

    The one signer of the statements this project writes: the provenance, and ``verify``'s summaries.
    """
    _, dsse, (crypto_signer, sslib_key) = trust_libraries()
    private = load_private_key(key)
    signer = crypto_signer(private, sslib_key.from_crypto(private.public_key()))
    envelope = dsse.Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    text = json.dumps(envelope.to_dict(), indent=2, sort_keys=True) + "\n"
    _write_atomically(target, text.encode("ascii"))
    return target
