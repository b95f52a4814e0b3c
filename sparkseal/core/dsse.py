"""The DSSE envelope of a signed provenance statement: what it looks like, and checking its signature.

Both ends of signed provenance need it: ``sparkseal.audit.provenance_sign`` writes envelopes and
``sparkseal.audit.provenance_check`` verifies one before it trusts a single subject. Kept here, below
both, so that neither auditor imports the other for it. The DSSE encoding and the ed25519 signature come
from securesystemslib and cryptography (hash-locked in ``.ci/requirements-trust.txt``), never from code
of ours; they are imported only when a key or a signature is handled, so importing this module costs
nothing and the image's runtime, which ships the core library but not those packages, never needs them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PAYLOAD_TYPE = "application/vnd.in-toto+json"


class SigningInputError(Exception):
    """A key or an envelope cannot be read, or is of the wrong kind; the message names the file."""


class SignatureError(Exception):
    """The envelope's signature does not verify with the given key; the message says how it failed."""


def trust_libraries() -> tuple[Any, Any, Any]:
    """cryptography's serialization, securesystemslib's dsse and its (CryptoSigner, SSlibKey).

    Imported here, at use, with a message that says how to install them: a plain error would only say
    which module is missing.
    """
    try:
        from cryptography.hazmat.primitives import serialization
        from securesystemslib import dsse
        from securesystemslib.signer import CryptoSigner, SSlibKey
    except ImportError as error:
        raise SigningInputError(
            f"signing needs securesystemslib and cryptography (`make tools` installs them from "
            f".ci/requirements-trust.txt): {error}"
        ) from None
    return serialization, dsse, (CryptoSigner, SSlibKey)


def read_input(path: Path, what: str) -> bytes:
    """The bytes of ``path``; a failure names the file and what it should have held."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise SigningInputError(f"{path}: expected {what}, cannot read it: {error.strerror}") from None


def load_public_key(path: Path) -> Any:
    """The ed25519 public key in the PEM file at ``path``."""
    serialization, _, _ = trust_libraries()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(read_input(path, "a PEM public key"))
    except (ValueError, TypeError) as error:
        raise SigningInputError(
            f"{path}: expected an ed25519 public key in PEM, cannot load it: {error}"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningInputError(f"{path}: expected an ed25519 public key, found {type(key).__name__}")
    return key


def is_envelope(data: Any) -> bool:
    """True for a decoded DSSE envelope (it has a payload type, a payload and signatures)."""
    return isinstance(data, dict) and {"payload", "payloadType", "signatures"} <= set(data)


def verify(path: Path, pubkey: Path) -> bytes:
    """The payload of the envelope at ``path`` once its signature verifies with ``pubkey``.

    :class:`SignatureError` when it does not (a changed payload or signature, or another signer's key);
    :class:`SigningInputError` when the envelope or the key cannot be read.
    """
    _, dsse, (_, sslib_key) = trust_libraries()
    from securesystemslib.exceptions import VerificationError

    try:
        data = json.loads(read_input(path, "a DSSE envelope"))
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
