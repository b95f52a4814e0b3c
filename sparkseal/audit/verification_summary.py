"""The verdict of ``sparkseal verify`` as a SLSA Verification Summary Attestation (VSA v1).

``verify`` prints a report for people; other tools read a verdict in the supply chain's standard form:
an in-toto Statement v1 with the predicate ``https://slsa.dev/verification_summary/v1``, one per target,
whose subject is the artifact verified (an image by its OCI manifest digest, a PEX by its tree digest,
else the target's one file) and whose predicate says:

* ``verifier.id``: :data:`VERIFIER_ID` (the rebuild-and-compare of this repository);
* ``timeVerified``: when the comparison ended (UTC; the one clock time here: a verdict is an event);
* ``resourceUri``: the Bazel target, ``urn:sparkseal:bazel-target://:image``;
* ``policy``: :data:`POLICY_URI` and the sha256 of :data:`POLICY`, the rule applied, in words;
* ``verificationResult``: ``PASSED`` or ``FAILED``; ``verifiedLevels``: :data:`REBUILT` or ``FAILED``.
  A rebuild verifies no level of SLSA's build track (those rate the build platform, and our builds run
  on the builder's own machine), so no ``SLSA_BUILD_LEVEL_*`` is claimed; the spec allows custom values
  that do not start with ``SLSA_``. ``dependencyLevels`` is empty: no dependency's level was verified.
* ``slsaVersion``: ``1.0``;
* :data:`INPUTS` (an extension field named by a URI, as the spec allows): what the rebuild was made from
  and how: the source (this repository's commit, clean or dirty, or why it is unknown,
  ``sparkseal.core.source``), the targets, the Bazel arguments passed through, the variations, the
  published digest of ``--against``, and on failure every difference, with the image layers that differ.

No input attestation is listed: the verdict rests on the rebuild, not on any statement it read.
Signed like the provenance (``sparkseal.audit.provenance_sign``: DSSE, ed25519) when a key is given.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sparkseal.core.slsa import NAMESPACE, STATEMENT_TYPE, dumps
from sparkseal.core.source import Source

PREDICATE_TYPE = "https://slsa.dev/verification_summary/v1"
VERIFIER_ID = f"{NAMESPACE}:verifier:rebuild-and-compare:v1"
POLICY_URI = f"{NAMESPACE}:policy:identical-rebuild:v1"
POLICY = (
    "sparkseal identical-rebuild policy v1: the target is rebuilt by `sparkseal verify` from a copy of the "
    "checkout (its tracked and untracked, not ignored, files) at another path, with a new output base, "
    "no disk or remote cache, another HOME, TZ, locale and umask and files created in reverse order, "
    "downloads only from the repository cache where every file is checked against its locked sha256. "
    "PASSED when every output of the rebuild has the bytes of the first build's (or, with --against, when "
    "the rebuilt digest equals the published one); FAILED otherwise.\n"
)
POLICY_DIGEST = hashlib.sha256(POLICY.encode("utf-8")).hexdigest()
SLSA_VERSION = "1.0"
PASSED, FAILED = "PASSED", "FAILED"
# A custom SlsaResult (the spec reserves the SLSA_ prefix): the target was rebuilt to the same bytes.
REBUILT = "SPARKSEAL_REBUILT_IDENTICAL"
INPUTS = f"{NAMESPACE}:verify:inputs:v1"
TARGET_URI = f"{NAMESPACE}:bazel-target:"


@dataclass
class Verdict:
    """One target's verification: what was verified, from what, and what differed."""

    target: str
    digest: str  # sha256:<hex> of the artifact verified
    source: Source
    bazel_args: list[str] = field(default_factory=list)
    variations: dict[str, str] = field(default_factory=dict)
    against: str | None = None
    differences: list[dict[str, Any]] = field(default_factory=list)

    @property
    def result(self) -> str:
        """``PASSED`` when nothing differs, else ``FAILED``."""
        return FAILED if self.differences else PASSED


def _source_record(source: Source) -> dict[str, Any]:
    descriptor = source.descriptor()
    return descriptor if descriptor is not None else {"unknown": source.unknown}


def timestamp(moment: datetime | None = None) -> str:
    """RFC 3339 UTC to the second (``2026-12-08T10:00:00Z``), as the in-toto Timestamp field asks."""
    moment = (moment or datetime.now(UTC)).astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def statement(verdict: Verdict, verified_at: str) -> dict[str, Any]:
    """The in-toto Statement v1 with the VSA v1 predicate of ``verdict``."""
    algorithm, _, hex_digest = verdict.digest.partition(":")
    inputs: dict[str, Any] = {
        "source": _source_record(verdict.source),
        "target": verdict.target,
        "bazelArgs": list(verdict.bazel_args),
        "variations": dict(verdict.variations),
    }
    if verdict.against:
        inputs["against"] = verdict.against
    if verdict.differences:
        inputs["differences"] = verdict.differences
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": verdict.target, "digest": {algorithm: hex_digest}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "verifier": {"id": VERIFIER_ID},
            "timeVerified": verified_at,
            "resourceUri": TARGET_URI + verdict.target,
            "policy": {"uri": POLICY_URI, "digest": {"sha256": POLICY_DIGEST}},
            "verificationResult": verdict.result,
            "verifiedLevels": [REBUILT if verdict.result == PASSED else FAILED],
            "dependencyLevels": {},
            "slsaVersion": SLSA_VERSION,
            INPUTS: inputs,
        },
    }


def file_name(target: str) -> str:
    """Where a target's VSA goes in the report directory: ``//:image`` -> ``image.vsa.intoto.json``."""
    stem = "_".join(part for part in target.lstrip("@").replace(":", "/").split("/") if part)
    return f"{stem or 'target'}.vsa.intoto.json"


def write(verdict: Verdict, directory: Path, verified_at: str) -> Path:
    """Write the VSA of ``verdict`` into ``directory``; return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / file_name(verdict.target)
    path.write_text(dumps(statement(verdict, verified_at)), encoding="ascii")
    return path
