"""The source record: a git remote as a credential-free URI, Bazel's status keys read back, and the record a
statement carries (`sparkseal.core.source`). The status program that asks git: test_workspace_status.py;
the statement and `provenance check`: test_provenance.py, test_provenance_check.py."""

from __future__ import annotations

import pytest

from sparkseal.core import source
from sparkseal.core.source import Source, SourceError, parse_status, repository_uri, statement_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "ghp_0123456789abcdefSECRET"
LOCAL = "the remote is a local path, which names no repository another machine can fetch"


@pytest.mark.parametrize(
    ("remote", "expected"),
    [
        ("https://github.com/acme/sparkseal.git", "git+https://github.com/acme/sparkseal.git"),
        (f"https://x-access-token:{TOKEN}@github.com/acme/sparkseal.git", "git+https://github.com/acme/sparkseal.git"),
        (f"https://{TOKEN}@GitHub.com/acme/sparkseal", "git+https://github.com/acme/sparkseal"),
        (f"https://git.example.org:8443/acme/sparkseal.git?token={TOKEN}#x", "git+https://git.example.org:8443/acme/sparkseal.git"),
        ("git@github.com:acme/sparkseal.git", "git+ssh://github.com/acme/sparkseal.git"),
        (f"ssh://git:{TOKEN}@git.example.org:2222/acme/sparkseal.git", "git+ssh://git.example.org:2222/acme/sparkseal.git"),
        ("http://[::1]:8080/sparkseal.git", "git+http://[::1]:8080/sparkseal.git"),
    ],
)  # fmt: skip
def test_a_remote_becomes_a_uri_without_credentials(remote: str, expected: str) -> None:
    assert repository_uri(remote) == (expected, None)
    assert TOKEN not in expected


@pytest.mark.parametrize(
    ("remote", "reason"),
    [
        ("", "the checkout has no remote"),
        ("/work/main", LOCAL),
        ("../sparkseal", LOCAL),
        ("file:///srv/git/sparkseal.git", LOCAL),
        (f"ftp://u:{TOKEN}@host/sparkseal", "the remote's scheme is not one of https, http, ssh, git"),
        (f"https://u:{TOKEN}@host:port/x", "the remote's port is not a number"),
    ],
)  # fmt: skip
def test_a_remote_that_names_nothing_fetchable_says_why_without_quoting_it(remote: str, reason: str) -> None:
    assert repository_uri(remote) == (None, reason)
    assert TOKEN not in reason


def _status(**keys: str) -> str:
    return "BUILD_HOST builder\nBUILD_USER someone\n" + "".join(
        f"STABLE_SPARKSEAL_SOURCE_{key.upper()} {value}\n" for key, value in keys.items()
    )


def test_status_lines_read_back() -> None:
    known = Source(COMMIT, "dirty", "git+https://h/x@refs/heads/main", None)
    text = "BUILD_HOST h\n" + "".join(line + "\n" for line in known.status_lines())
    assert parse_status(text, "stable-status.txt") == known
    unknown = Source(unknown="the workspace is not a git checkout")
    assert unknown.status_lines() == ["STABLE_SPARKSEAL_SOURCE_UNKNOWN the workspace is not a git checkout"]
    assert parse_status("\n".join(unknown.status_lines()), "s") == unknown


def test_no_source_key_means_the_status_command_did_not_run() -> None:
    assert parse_status("BUILD_HOST h\nBUILD_USER u\n", "s") == Source(unknown=source.NO_STATUS)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"commit": "abc", "tree": "clean", "uri": "git+https://h/x"},
         "s: STABLE_SPARKSEAL_SOURCE_COMMIT: expected a git commit (40 or 64 hex digits), found 'abc'"),
        ({"commit": COMMIT, "tree": "modified", "uri": "git+https://h/x"},
         "s: STABLE_SPARKSEAL_SOURCE_TREE: expected one of clean, dirty, found 'modified'"),
        ({"commit": COMMIT, "tree": "clean"},
         "s: expected exactly one of STABLE_SPARKSEAL_SOURCE_URI and STABLE_SPARKSEAL_SOURCE_URI_UNKNOWN, "
         "found neither"),
        ({"commit": COMMIT, "tree": "clean", "uri": f"git+https://u:{TOKEN}@h/x"},
         "s: STABLE_SPARKSEAL_SOURCE_URI: expected git+SCHEME://HOST/PATH without user name or password, "
         "found another form (not shown: it may hold a credential)"),
        ({"unknown": "no git", "commit": COMMIT},
         "s: expected STABLE_SPARKSEAL_SOURCE_UNKNOWN with a reason and no other source key, found "
         "STABLE_SPARKSEAL_SOURCE_UNKNOWN='no git' and STABLE_SPARKSEAL_SOURCE_COMMIT"),
    ],
)  # fmt: skip
def test_a_malformed_status_is_refused_naming_the_key(keys: dict[str, str], message: str) -> None:
    with pytest.raises(SourceError) as error:
        parse_status(_status(**keys), "s")
    assert str(error.value) == message
    assert TOKEN not in str(error.value)


def test_the_revision_says_dirty_and_refuses_an_unknown_source() -> None:
    assert Source(COMMIT, "clean", "git+https://h/x").revision() == COMMIT
    assert Source(COMMIT, "dirty", "git+https://h/x").revision() == COMMIT + "-dirty"
    with pytest.raises(SourceError) as error:
        Source(unknown="the workspace is not a git checkout").revision()
    assert str(error.value) == (
        "the revision label needs the source commit, which is unknown: the workspace is not a git checkout"
    )


def _statement(dependencies: list[dict], internal: dict | None = None) -> dict:
    definition = {"resolvedDependencies": dependencies, "internalParameters": internal or {}}
    return {"predicate": {"buildDefinition": definition}}


def test_a_statement_source_reads_back_and_describes_itself() -> None:
    known = Source(COMMIT, "clean", "git+https://h/x@refs/heads/main")
    descriptor = known.descriptor()
    assert descriptor is not None
    assert statement_source(_statement([{"annotations": {"role": "deb"}}, descriptor])) == known
    assert source.describe(known) == f"source: git+https://h/x@refs/heads/main commit {COMMIT} (clean tree)"
    dirty = Source(COMMIT, "dirty", None, "the checkout has no remote")
    assert statement_source(_statement([dirty.descriptor() or {}])) == dirty
    assert source.describe(dirty) == (
        f"source: repository unknown (the checkout has no remote) commit {COMMIT}, DIRTY tree: built with "
        "changes that commit does not hold, so the commit alone cannot rebuild it"
    )
    unknown = _statement([], {"source": {"unknown": "the workspace is not a git checkout"}})
    assert source.describe(statement_source(unknown)) == (
        "source: UNKNOWN: the workspace is not a git checkout"
    )
    assert statement_source(_statement([])) is None
    assert source.describe(None) == "source: not recorded (a statement from before sources were recorded)"


def test_a_malformed_statement_source_is_refused() -> None:
    entry = Source(COMMIT, "clean", "git+https://h/x").descriptor() or {}
    with pytest.raises(SourceError, match=r"expected one record of the source .*, found 2"):
        statement_source(_statement([entry], {"source": {"unknown": "x"}}))
    bad = {**entry, "uri": f"git+https://{TOKEN}@h/x"}
    with pytest.raises(SourceError) as error:
        statement_source(_statement([bad]))
    assert str(error.value) == (
        "predicate.buildDefinition.resolvedDependencies[0].uri: expected git+SCHEME://HOST/PATH without "
        "user name or password, found another form (not shown: it may hold a credential)"
    )
    tree = {**entry, "annotations": {"role": "source", "tree": "unknown"}}
    with pytest.raises(SourceError, match=r"\[0\]\.annotations\.tree: expected one of clean, dirty"):
        statement_source(_statement([tree]))
    with pytest.raises(SourceError, match=r"internalParameters\.source: expected \{\"unknown\": REASON\}"):
        statement_source(_statement([], {"source": {"unknown": ""}}))
