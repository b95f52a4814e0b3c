"""Our own secret and private-data rules, run over one file's bytes: what no maintained catalogue knows.

Private data (private addresses, people's home directories), password and generic key assignments, and
key files by name; vendor token formats are the maintained catalogue's (``sparkseal.scan.catalogue``), so
none is kept by hand here. The rules read text and binary alike (build paths and keys leak into shared
objects too). Each finding is reported as ``path:line:rule: <redacted match>``; the secret itself is never
printed.

The rules keep false positives low: the generic key rule needs a high-entropy value with letters and
digits, a password needs a literal value (unquoted only in configuration files), a private IPv4 address
needs four octets that are not part of a longer dotted number or a CIDR range and that name a host (not
``.0`` or ``.255``), a home directory needs a user name that is not a documentation placeholder.
``/root`` is not reported: it names no person.

The allow-list's matching lives here too (reading it, which checks rule ids against the catalogue's, is
``sparkseal.scan.scanner``'s): an entry that names a module's source also covers its bytecode. Pure: bytes
and names in, findings out, no process started; it lives beside the scanner that walks files, layers and
images and runs the catalogue (``sparkseal.scan.scanner``), since the scan is all that reads it.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO

CHUNK = 1 << 20  # bytes read at a time
_MAX_LINE = 1 << 20  # a longer line (minified or binary data) is scanned in pieces of this size


@dataclass(frozen=True)
class Finding:
    """One match: where (``layer`` set for an image member), which rule, and the redacted text."""

    path: str
    line: int | None
    rule: str
    match: str
    layer: str | None = None

    def location(self) -> str:
        """``[layer:]path:line:rule`` (``-`` as the line of a name rule)."""
        line = "-" if self.line is None else str(self.line)
        where = f"{self.layer}:{self.path}" if self.layer else self.path
        return f"{where}:{line}:{self.rule}"


@dataclass(frozen=True)
class AllowEntry:
    """One allow-list entry: a path glob, a rule id and why it is allowed."""

    path: str
    rule: str
    reason: str


@dataclass
class Report:
    """The result of a scan."""

    files: int = 0
    findings: list[Finding] = field(default_factory=list)
    allowed: list[Finding] = field(default_factory=list)
    unused_allow: list[AllowEntry] = field(default_factory=list)
    scanner: dict[str, object] = field(default_factory=dict)  # the catalogue's name, version, rule count
    archives: int = 0  # archives opened (their members are among ``files``)
    notes: list[str] = field(default_factory=list)  # archives nested too deep to open

    @property
    def clean(self) -> bool:
        """True when every match was allowed."""
        return not self.findings


def _entropy(value: bytes) -> float:
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def _has_letters_and_digits(value: bytes) -> bool:
    return any(c in b"0123456789" for c in value) and any(chr(c).isalpha() for c in value)


_PLACEHOLDER_WORDS = (
    b"example",
    b"your",
    b"xxxx",
    b"placeholder",
    b"dummy",
    b"sample",
    b"redacted",
    b"changeit",
)


def _placeholder(value: bytes) -> bool:
    lowered = value.lower()
    return any(word in lowered for word in _PLACEHOLDER_WORDS) or lowered.strip(b"*x.-_") == b""


def _high_entropy_key(match: re.Match[bytes]) -> bool:
    value = match.group("value")
    return _entropy(value) >= 3.5 and _has_letters_and_digits(value) and not _placeholder(value)


_PASSWORD_WORDS = {b"password", b"passwd", b"passphrase", b"none", b"null", b"true", b"false", b"string"}


def _literal_password(match: re.Match[bytes]) -> bool:
    value = match.group("value")
    return value[:1] not in b"$<%{" and value.lower() not in _PASSWORD_WORDS and not _placeholder(value)


# What precedes a four-part version: a requirement operator, a "version" or SPDX "versionInfo" key, or
# the "@" of a package URL (pkg:pypi/nvidia-curand@10.4.0.35).
_VERSION_CONTEXT = re.compile(rb"(?i)(?:[=<>~!]=|version(?:info)?\W{0,4}|pkg:[a-z]+/[^\s\"'@]+@)$")
_VERSION_LOOKBEHIND = 128


def _host_ipv4(match: re.Match[bytes]) -> bool:
    """Four octets naming a host, and not a four-part version (``==10.4.0.35``, ``"version": "..."``)."""
    octets = [int(o) for o in match.group(0).split(b".")]
    before = match.string[max(0, match.start() - _VERSION_LOOKBEHIND) : match.start()]
    version = _VERSION_CONTEXT.search(before) is not None
    return all(o <= 255 for o in octets) and octets[3] not in (0, 255) and not version


# Names used in documentation for "some user"; CI runners' accounts are not people either.
_PLACEHOLDER_USERS = {
    b"user",
    b"username",
    b"you",
    b"yourname",
    b"me",
    b"name",
    b"someone",
    b"runner",
    b"jdoe",
}


def _person_home(match: re.Match[bytes]) -> bool:
    return match.group("user").lower() not in _PLACEHOLDER_USERS


def _redact_value(match: re.Match[bytes]) -> str:
    value = match.group("value").decode("latin-1")
    return f"{match.group('key').decode('latin-1')}=***({len(value)} chars)"


def _redact_ipv4(match: re.Match[bytes]) -> str:
    octets = match.group(0).decode().split(".")
    kept = 2 if octets[0] == "192" else 1
    return ".".join(octets[:kept] + ["x"] * (4 - kept))


def _redact_home(match: re.Match[bytes]) -> str:
    return f"{match.group('root').decode()}/{match.group('user')[:1].decode('latin-1')}***"


@dataclass(frozen=True)
class Rule:
    """A content rule: a bytes pattern, a check of each match, and how to print it redacted."""

    id: str
    description: str
    pattern: re.Pattern[bytes]
    redact: Callable[[re.Match[bytes]], str]
    # Literal strings one of which every match contains; the pattern runs only on the lines holding one,
    # which keeps the scan at memory speed on large binaries. ``fold``: look for them case-insensitively.
    anchors: tuple[bytes, ...]
    accept: Callable[[re.Match[bytes]], bool] = lambda _match: True
    config_only: bool = False  # the rule applies to configuration files only
    fold: bool = False


_CONFIG_SUFFIXES = {".env", ".ini", ".cfg", ".conf", ".yaml", ".yml", ".properties", ".toml"}

CONTENT_RULES = (
    Rule(
        "generic-api-key",
        "api_key / secret_key assigned a high-entropy literal",
        re.compile(
            rb"(?i)(?<![a-z0-9])(?P<key>(?:api|secret)[_-]?key)['\"]?\s*[:=]\s*['\"]?(?P<value>[A-Za-z0-9_\-+/=.]{16,})"
        ),
        _redact_value,
        (b"api_key", b"api-key", b"apikey", b"secret_key", b"secret-key", b"secretkey"),
        _high_entropy_key,
        fold=True,
    ),
    Rule(
        "password-assignment",
        "password assigned a quoted literal",
        re.compile(
            rb"(?i)(?<![a-z0-9])(?P<key>password|passwd|passphrase)['\"]?\s*[:=]\s*(?P<q>['\"])(?P<value>[^'\"\s]{4,})(?P=q)"
        ),
        _redact_value,
        (b"passw", b"passphrase"),
        _literal_password,
        fold=True,
    ),
    Rule(
        "password-assignment",
        "password assigned an unquoted value in a configuration file",
        re.compile(
            rb"(?im)(?<![a-z0-9])(?P<key>password|passwd|passphrase)\s*[:=]\s*(?P<value>[^\s'\"#;]{4,})\s*$"
        ),
        _redact_value,
        (b"passw", b"passphrase"),
        _literal_password,
        fold=True,
        config_only=True,
    ),
    Rule(
        "private-ipv4",
        "private IPv4 host address (10/8, 172.16/12, 192.168/16)",
        re.compile(
            rb"(?<![\w.-])(?:10\.\d{1,3}|172\.(?:1[6-9]|2\d|3[01])|192\.168)\.\d{1,3}\.\d{1,3}(?!\.?\d)(?![\w-])(?!/\d)"
        ),
        _redact_ipv4,
        (b"10.", b"172.", b"192.168."),
        _host_ipv4,
    ),
    Rule(
        "home-path",
        "a person's home directory (/home/NAME, /Users/NAME)",
        re.compile(
            rb"(?<![\w.-])(?P<root>/home|/Users)/(?P<user>[A-Za-z_][A-Za-z0-9_.-]{1,31})(?![A-Za-z0-9_-])"
        ),
        _redact_home,
        (b"/home/", b"/Users/"),
        _person_home,
    ),
)

NAME_RULE = "secret-file"
RULES = {
    **{rule.id: rule.description for rule in CONTENT_RULES if not rule.config_only},
    NAME_RULE: "key or credential file by name (.env, *.key, id_rsa, *.p12, ...; .pem without certificates)",
}

_SECRET_NAMES = {"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", ".netrc", ".pgpass", ".git-credentials"}
_SECRET_SUFFIXES = {".key", ".p12", ".pfx", ".jks", ".keystore"}
_ENV_SAMPLES = {"example", "sample", "template", "dist"}
_PEM_PUBLIC = re.compile(rb"-----BEGIN (?:TRUSTED )?(?:CERTIFICATE|PUBLIC KEY|X509 CRL)-----")


def secret_name(path: str) -> bool:
    """True when the file name alone marks a key or credential file (``.pem`` files are judged by content)."""
    name = PurePosixPath(path).name
    if name in _SECRET_NAMES or PurePosixPath(name).suffix in _SECRET_SUFFIXES:
        return True
    return name == ".env" or (name.startswith(".env.") and name.split(".")[-1] not in _ENV_SAMPLES)


def _is_config(path: str) -> bool:
    name = PurePosixPath(path).name
    return PurePosixPath(name).suffix in _CONFIG_SUFFIXES or name.startswith(".env") or name == ".netrc"


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(first line number, bytes)`` pieces of whole lines, at most about ``CHUNK`` bytes each."""
    line, pending = 1, b""
    while True:
        block = stream.read(CHUNK)
        data = pending + block
        if not block:
            if data:
                yield line, data
            return
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < _MAX_LINE:
            pending = data
            continue
        cut = cut or len(data)
        yield line, data[:cut]
        line += data.count(b"\n", 0, cut)
        pending = data[cut:]


# Every match holds an anchor at most _BEFORE bytes after its start and ends at most _AFTER bytes past it.
_BEFORE, _AFTER = 64, 1024


def _windows(rule: Rule, data: bytes, folded: bytes) -> Iterator[tuple[int, int]]:
    """The spans of ``data`` around each anchor of the rule, cut at the line's ends."""
    haystack = folded if rule.fold else data
    spans = set()
    for anchor in rule.anchors:
        at = haystack.find(anchor)
        while at >= 0:
            start = data.rfind(b"\n", max(0, at - _BEFORE), at) + 1 or max(0, at - _BEFORE)
            end = data.find(b"\n", at, at + _AFTER)
            spans.add((start, min(len(data), at + _AFTER) if end < 0 else end))
            at = haystack.find(anchor, at + 1)
    yield from sorted(spans)


def _matches(rule: Rule, data: bytes, folded: bytes) -> Iterator[re.Match[bytes]]:
    seen = set()
    for start, end in _windows(rule, data, folded):
        for match in rule.pattern.finditer(data, start, end):
            if match.start() not in seen and rule.accept(match):
                seen.add(match.start())
                yield match


def scan_stream(path: str, stream: IO[bytes], layer: str | None = None) -> list[Finding]:
    """Every content and name finding of one file."""
    config = _is_config(path)
    pem = path.endswith(".pem")
    pem_public = False
    findings = []
    for first_line, data in _lines(stream):
        folded = data.lower()
        for rule in CONTENT_RULES:
            if rule.config_only and not config:
                continue
            for match in _matches(rule, data, folded):
                line = first_line + data.count(b"\n", 0, match.start())
                findings.append(Finding(path, line, rule.id, rule.redact(match), layer))
        pem_public = pem_public or (pem and _PEM_PUBLIC.search(data) is not None)
    if secret_name(path) or (pem and not pem_public):
        findings.append(Finding(path, None, NAME_RULE, PurePosixPath(path).name, layer))
    return sorted(findings, key=lambda f: (f.line or 0, f.rule))


# A module's bytecode (``pkg/__pycache__/mod.cpython-311.pyc``) holds its source's strings: docstrings and
# literals. An allow-list entry for the source covers its bytecode too, so images with pycs need no second
# entry per allowed module.
_BYTECODE = re.compile(r"(?:(?P<dir>.*)/)?__pycache__/(?P<module>[^/]+?)\.[a-z]+-\d+(?:\.opt-\d+)?\.pyc")


def allow_paths(path: str) -> tuple[str, ...]:
    """The paths an allow-list entry may name to cover ``path``: itself, and the source of bytecode."""
    found = _BYTECODE.fullmatch(path)
    if found is None:
        return (path,)
    source = f"{found['module']}.py"
    return (path, f"{found['dir']}/{source}" if found["dir"] else source)


def apply_allowlist_to(report: Report, findings: list[Finding], allow: list[AllowEntry]) -> None:
    """Add ``findings`` to ``report``: to ``allowed`` where an entry covers one, else to ``findings``.

    Entries that covered nothing are added to ``report.unused_allow`` (a stale entry is worth a note).
    """
    used = set()
    for finding in findings:
        entry = next(
            (
                e
                for e in allow
                if fnmatch.fnmatchcase(finding.rule, e.rule)
                and any(fnmatch.fnmatchcase(path, e.path) for path in allow_paths(finding.path))
            ),
            None,
        )
        if entry is None:
            report.findings.append(finding)
        else:
            used.add(entry)
            report.allowed.append(finding)
    report.unused_allow += [e for e in allow if e not in used]


def apply_allowlist(findings: list[Finding], allow: list[AllowEntry]) -> Report:
    """A report of ``findings``: those an allow-list entry covers are moved to ``allowed``."""
    report = Report()
    apply_allowlist_to(report, findings, allow)
    return report
