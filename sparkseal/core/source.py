"""The source a build was made from: this repository's URI, the commit, and whether the tree was clean.

Bazel asks before every build: the workspace status command that ``.bazelrc`` names
(``sparkseal.fetch.workspace_status``, which runs git) prints the ``STABLE_SPARKSEAL_SOURCE_*`` keys
below, and Bazel writes them into its stable status file (``ctx.info_file``). Only the provenance action
reads that file, so a new commit re-runs that small action and nothing else: the layers and the image
digest do not move with a commit (unless ``--stamp`` asks for the image's revision label,
``rules/private/oci_image.bzl``). This module is the one home of the keys, of reading them back, of the
statement's source descriptor, and of turning a git remote into a URI that carries no credentials: the
status program writes through it and the actions read through it.

Pure: no program is run here, no file is opened; callers hand in text.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

KEY_COMMIT = "STABLE_SPARKSEAL_SOURCE_COMMIT"
KEY_TREE = "STABLE_SPARKSEAL_SOURCE_TREE"
KEY_URI = "STABLE_SPARKSEAL_SOURCE_URI"
KEY_URI_UNKNOWN = "STABLE_SPARKSEAL_SOURCE_URI_UNKNOWN"
KEY_UNKNOWN = "STABLE_SPARKSEAL_SOURCE_UNKNOWN"
KEYS = (KEY_COMMIT, KEY_TREE, KEY_URI, KEY_URI_UNKNOWN, KEY_UNKNOWN)

CLEAN, DIRTY = "clean", "dirty"
TREES = (CLEAN, DIRTY)
# The name and role of the source in the statement's resolvedDependencies.
NAME = "sparkseal"
ROLE = "source"
# What a statement says when Bazel's status file holds none of the keys: a build that bypassed the
# .bazelrc (`--workspace_status_command=`, another rc file) or a Bazel run without it.
NO_STATUS = (
    "the build ran without sparkseal's workspace status command "
    "(.bazelrc: --workspace_status_command), so nothing asked git"
)
# git commit ids: SHA-1 (40 hex digits) or, in a SHA-256 repository, 64.
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# scp-like remotes (`git@github.com:owner/repo.git`): git's own rule is "a colon before any slash".
_SCP = re.compile(r"(?:[^@/]*@)?(?P<host>[^:/]+):(?P<path>.*)")
_URL_SCHEMES = ("https", "http", "ssh", "git")


class SourceError(Exception):
    """A status file's source keys are malformed; the message names the file, the key and the value."""


def repository_uri(remote: str) -> tuple[str | None, str | None]:
    """A git remote as the statement's repository URI (``git+https://host/path``), or None and why not.

    Any user name, password or token in the remote (``https://user:token@host/...``), its query and its
    fragment are dropped: a credential must never reach a statement or a message, so no reason quotes
    the remote either. A local path or ``file://`` remote names nothing another machine can fetch.
    """
    remote = remote.strip()
    if not remote:
        return None, "the checkout has no remote"
    if "://" not in remote:
        match = _SCP.fullmatch(remote)
        if match is None or remote.startswith(("/", ".")):
            return None, "the remote is a local path, which names no repository another machine can fetch"
        path = match["path"].lstrip("/")
        return f"git+ssh://{match['host'].lower()}/{path}", None
    parts = urllib.parse.urlsplit(remote)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return None, "the remote is a local path, which names no repository another machine can fetch"
    if scheme not in _URL_SCHEMES:
        return None, f"the remote's scheme is not one of {', '.join(_URL_SCHEMES)}"
    host = (parts.hostname or "").lower()
    if not host:
        return None, "the remote names no host"
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        return None, "the remote's port is not a number"
    netloc = host if port is None else f"{host}:{port}"
    return f"git+{scheme}://{netloc}{parts.path}", None


def has_credentials(uri: str) -> bool:
    """True when ``uri`` carries a user name or password (``scheme://user@host``)."""
    return "@" in urllib.parse.urlsplit(uri.removeprefix("git+")).netloc


@dataclass(frozen=True)
class Source:
    """What is known of the source: either a commit (with its tree state, and the repository URI or why
    there is none) or why nothing is known (``unknown``)."""

    commit: str | None = None
    tree: str | None = None
    uri: str | None = None
    uri_unknown: str | None = None
    unknown: str | None = None

    def status_lines(self) -> list[str]:
        """The lines a workspace status command prints (``KEY value``), in :data:`KEYS` order."""
        values = {
            KEY_COMMIT: self.commit,
            KEY_TREE: self.tree,
            KEY_URI: self.uri,
            KEY_URI_UNKNOWN: self.uri_unknown,
            KEY_UNKNOWN: self.unknown,
        }
        return [f"{key} {value}" for key, value in values.items() if value]

    def descriptor(self) -> dict[str, Any] | None:
        """The statement's resolved dependency for the source: ``uri`` (with the ref), ``digest.gitCommit``
        and ``annotations.tree`` (``clean`` or ``dirty``); None when the commit is unknown."""
        if self.commit is None:
            return None
        annotations: dict[str, Any] = {"role": ROLE, "tree": self.tree}
        if self.uri_unknown:
            annotations["uriUnknown"] = self.uri_unknown
        entry: dict[str, Any] = {
            "name": NAME,
            "digest": {"gitCommit": self.commit},
            "annotations": annotations,
        }
        if self.uri:
            entry["uri"] = self.uri
        return entry

    def revision(self) -> str:
        """The image's ``org.opencontainers.image.revision``: the commit, ``-dirty`` appended for a tree
        with changes git has not committed (``git describe --dirty``'s convention)."""
        if self.commit is None:
            raise SourceError(f"the revision label needs the source commit, which is unknown: {self.unknown}")
        return self.commit + ("-dirty" if self.tree == DIRTY else "")


def source_uri(repository: str, ref: str | None) -> str:
    """The SLSA form of a git source: ``git+https://host/path@refs/heads/main`` (without a ref, no ``@``)."""
    return f"{repository}@{ref}" if ref else repository


def parse_status(text: str, where: str) -> Source:
    """The source recorded in a Bazel status file's text (``where`` names it in messages).

    No source key at all: the source is unknown (:data:`NO_STATUS`). Otherwise a commit and a tree state
    (or ``UNKNOWN`` alone), each well formed, and a repository URI without credentials.
    """
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in KEYS:
            values[key] = value.strip()
    if not values:
        return Source(unknown=NO_STATUS)
    if KEY_UNKNOWN in values:
        extra = sorted(set(values) - {KEY_UNKNOWN})
        if extra or not values[KEY_UNKNOWN]:
            raise SourceError(
                f"{where}: expected {KEY_UNKNOWN} with a reason and no other source key, "
                f"found {KEY_UNKNOWN}={values[KEY_UNKNOWN]!r} and {', '.join(extra) or 'nothing else'}"
            )
        return Source(unknown=values[KEY_UNKNOWN])
    commit, tree = values.get(KEY_COMMIT, ""), values.get(KEY_TREE, "")
    if not _COMMIT.fullmatch(commit):
        raise SourceError(
            f"{where}: {KEY_COMMIT}: expected a git commit (40 or 64 hex digits), found {commit!r}"
        )
    if tree not in TREES:
        raise SourceError(f"{where}: {KEY_TREE}: expected one of {', '.join(TREES)}, found {tree!r}")
    uri, uri_unknown = values.get(KEY_URI) or None, values.get(KEY_URI_UNKNOWN) or None
    if (uri is None) == (uri_unknown is None):
        raise SourceError(
            f"{where}: expected exactly one of {KEY_URI} and {KEY_URI_UNKNOWN}, "
            f"found {'both' if uri else 'neither'}"
        )
    if uri is not None and (not uri.startswith("git+") or has_credentials(uri)):
        # The value is not shown: it may hold the very credential that must not be printed.
        raise SourceError(
            f"{where}: {KEY_URI}: expected git+SCHEME://HOST/PATH without user name or password, "
            "found another form (not shown: it may hold a credential)"
        )
    return Source(commit=commit, tree=tree, uri=uri, uri_unknown=uri_unknown)


# Where a statement says the source is unknown (beside the Bazel record, sparkseal.core.slsa).
UNKNOWN_RECORD = "predicate.buildDefinition.internalParameters.source"


def statement_source(statement: Any) -> Source | None:
    """The source a parsed provenance statement records: its ``source`` dependency, or the reason in
    :data:`UNKNOWN_RECORD`; None for a statement that records neither (made before sources were
    recorded). A malformed record raises :class:`SourceError` naming the field."""
    predicate = statement.get("predicate") if isinstance(statement, dict) else None
    definition = predicate.get("buildDefinition") if isinstance(predicate, dict) else None
    definition = definition if isinstance(definition, dict) else {}
    dependencies = definition.get("resolvedDependencies")
    sources = [
        (index, d)
        for index, d in enumerate(dependencies if isinstance(dependencies, list) else [])
        if isinstance(d, dict)
        and isinstance(d.get("annotations"), dict)
        and d["annotations"].get("role") == ROLE
    ]
    internal = definition.get("internalParameters")
    unknown = internal.get("source") if isinstance(internal, dict) else None
    if len(sources) + (unknown is not None) > 1:
        raise SourceError(
            f"expected one record of the source (a resolvedDependencies entry with role {ROLE}, or "
            f"{UNKNOWN_RECORD}), found {len(sources) + (unknown is not None)}"
        )
    if unknown is not None:
        reason = unknown.get("unknown") if isinstance(unknown, dict) else None
        if not isinstance(reason, str) or not reason or sorted(unknown) != ["unknown"]:
            raise SourceError(f'{UNKNOWN_RECORD}: expected {{"unknown": REASON}}, found {unknown!r}')
        return Source(unknown=reason)
    if not sources:
        return None
    index, entry = sources[0]
    where = f"predicate.buildDefinition.resolvedDependencies[{index}]"
    commit = (entry.get("digest") or {}).get("gitCommit") if isinstance(entry.get("digest"), dict) else None
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise SourceError(f"{where}.digest.gitCommit: expected 40 or 64 hex digits, found {commit!r}")
    tree = entry["annotations"].get("tree")
    if tree not in TREES:
        raise SourceError(f"{where}.annotations.tree: expected one of {', '.join(TREES)}, found {tree!r}")
    uri, uri_unknown = entry.get("uri"), entry["annotations"].get("uriUnknown")
    if (uri is None) == (uri_unknown is None):
        raise SourceError(
            f"{where}: expected exactly one of uri and annotations.uriUnknown, "
            f"found {'both' if uri else 'neither'}"
        )
    if uri is not None and (not isinstance(uri, str) or not uri.startswith("git+") or has_credentials(uri)):
        raise SourceError(
            f"{where}.uri: expected git+SCHEME://HOST/PATH without user name or password, "
            "found another form (not shown: it may hold a credential)"
        )
    return Source(commit=commit, tree=tree, uri=uri, uri_unknown=uri_unknown)


def describe(source: Source | None) -> str:
    """One line for an auditor: where the build's source is, or plainly that it is not known."""
    if source is None:
        return "source: not recorded (a statement from before sources were recorded)"
    if source.commit is None:
        return f"source: UNKNOWN: {source.unknown}"
    where = source.uri or f"repository unknown ({source.uri_unknown})"
    if source.tree == DIRTY:
        return (
            f"source: {where} commit {source.commit}, DIRTY tree: built with changes that commit does not "
            "hold, so the commit alone cannot rebuild it"
        )
    return f"source: {where} commit {source.commit} (clean tree)"
