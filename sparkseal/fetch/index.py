"""Find a locked artifact on the configured package index through the PEP 691 JSON simple API.

Standard library only: repository rules run this module with the host ``python3``.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from sparkseal.core.credentials import CredentialsError, for_url, redact, split_credentials
from sparkseal.core.wheels import normalize_name

JSON_CONTENT_TYPE = "application/vnd.pypi.simple.v1+json"
TIMEOUT_S = 60

_SDIST_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tar", ".zip")
_SDIST_NAME = re.compile(r"^(?P<name>.+?)-(?P<version>\d.*)$")


class FetchError(Exception):
    """An artifact cannot be found on, or fetched from, the package index."""


@dataclass(frozen=True)
class IndexFile:
    """One file listed on a project page of the index."""

    filename: str
    url: str
    sha256: str | None
    page_url: str


@dataclass(frozen=True)
class ProjectPage:
    """A project page of the index: its final URL and the files it lists."""

    url: str
    files: tuple[IndexFile, ...]


def index_url() -> str:
    """Return the index URL pip would use: ``PIP_INDEX_URL``, else pip's configuration, else pip's default.

    The default is read from pip itself, so no host name is written here.
    """
    from_env = os.environ.get("PIP_INDEX_URL", "").strip()
    if from_env:
        return from_env
    try:
        from pip._internal.configuration import Configuration, ConfigurationError
        from pip._internal.models.index import PyPI
    except ImportError as exc:
        raise FetchError(
            f"PIP_INDEX_URL is not set and pip cannot be imported ({exc}); set PIP_INDEX_URL to the index URL"
        ) from exc
    config = Configuration(isolated=False)
    try:
        config.load()
    except ConfigurationError as exc:
        raise FetchError(f"cannot read pip's configuration: {exc}") from exc
    values = dict(config.items())
    # pip lets the command's own section override [global]; installing reads [install].
    for key in ("install.index-url", "global.index-url"):
        value = str(values.get(key, "")).strip()
        if value:
            return value
    return PyPI.simple_url


def project_name(filename: str) -> str:
    """Return the normalised project name of a wheel or sdist filename.

    ``vllm-0.25.1.tar.gz`` gives ``vllm``; ``python-dateutil-2.8.2.tar.gz`` gives ``python-dateutil``.
    """
    if filename.endswith(".whl"):
        parts = filename[: -len(".whl")].split("-")
        if len(parts) not in (5, 6) or not all(parts):
            raise FetchError(
                f"{filename}: not a wheel filename (expected NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl)"
            )
        return normalize_name(parts[0])
    for suffix in _SDIST_SUFFIXES:
        if filename.endswith(suffix):
            match = _SDIST_NAME.match(filename[: -len(suffix)])
            if match:
                return normalize_name(match["name"])
            break
    raise FetchError(f"{filename}: not a wheel or sdist filename (expected NAME-VERSION.tar.gz or a .whl)")


def page_url(project: str, index: str) -> str:
    """Return the URL of ``project``'s page on ``index`` (always with one trailing slash)."""
    return f"{index.rstrip('/')}/{normalize_name(project)}/"


def request(
    url: str, index: str | None = None, headers: dict[str, str] | None = None
) -> urllib.request.Request:
    """A request for ``url`` (credentials removed from it) carrying the credentials ``for_url`` finds.

    The ``Authorization`` header is not passed on to a redirect's target, which may be another host.
    """
    clean, _ = split_credentials(url)
    found = for_url(url, index)
    req = urllib.request.Request(clean, headers=headers or {})
    if found is not None:
        req.add_unredirected_header("Authorization", found.header())
    return req


def list_files(project: str, index: str | None = None) -> ProjectPage:
    """Fetch ``project``'s page from ``index`` (default: :func:`index_url`) and return the files it lists.

    Credentials in the index URL (``user:password@``) or a netrc entry for its host are sent as basic
    authentication; every message names the index with its credentials shown as ``***``.
    """
    index = index if index is not None else index_url()
    try:
        url = page_url(project, index)
        req = request(url, index, headers={"Accept": JSON_CONTENT_TYPE})
    except (ValueError, CredentialsError) as exc:
        raise FetchError(f"index URL {redact(index)}: {exc}") from exc
    shown = redact(url)
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise FetchError(f"index URL {shown}: scheme {scheme!r} is not supported (expected http or https)")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as response:
            final_url = response.geturl()
            content_type = response.headers.get_content_type()
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise FetchError(f"project page {shown} not found on the index (HTTP 404)") from exc
        if exc.code in (401, 403):
            raise FetchError(_refused(exc, shown, req.has_header("Authorization"), index)) from exc
        raise FetchError(f"index answered HTTP {exc.code} {exc.reason} for {shown}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise FetchError(f"index unreachable: {shown}: {reason}") from exc
    if content_type != JSON_CONTENT_TYPE:
        raise FetchError(
            f"index page {redact(final_url)} answered with content type {content_type!r}, "
            f"expected {JSON_CONTENT_TYPE!r}"
        )
    return ProjectPage(url=final_url, files=_parse_page(body, final_url))


def _refused(error: urllib.error.HTTPError, shown: str, sent: bool, index: str) -> str:
    """The message for a 401/403 answer: which index, and whether credentials were sent (never which)."""
    host = urllib.parse.urlsplit(index).hostname or "?"
    status = f"index answered HTTP {error.code} {error.reason} for {shown}"
    if sent:
        return f"{status}: the credentials sent were refused (check the password for {host})"
    return (
        f"{status}: the index needs credentials; give them in the index URL "
        f"(https://USER:PASSWORD@{host}/...) or in a netrc entry for {host} (NETRC or ~/.netrc)"
    )


def _parse_page(body: bytes, url: str) -> tuple[IndexFile, ...]:
    """Parse a PEP 691 project page; relative file URLs are resolved against ``url``."""
    try:
        page = json.loads(body)
        major = str(page.get("meta", {}).get("api-version", "1")).split(".")[0]
        entries = page["files"]
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        raise FetchError(f"index page {url} is not a PEP 691 project page: {exc!r}") from exc
    if major != "1":
        raise FetchError(f"index page {url} speaks simple API version {major}, expected version 1")
    files = []
    for entry in entries:
        try:
            filename, href, hashes = entry["filename"], entry["url"], entry.get("hashes") or {}
            sha256 = hashes.get("sha256")
            sha256 = sha256.lower() if isinstance(sha256, str) else None
        except (KeyError, TypeError, AttributeError) as exc:
            raise FetchError(f"index page {url} has a malformed file entry {entry!r}") from exc
        absolute = urllib.parse.urldefrag(urllib.parse.urljoin(url, href)).url
        files.append(IndexFile(filename=filename, url=absolute, sha256=sha256, page_url=url))
    return tuple(files)


def lookup(filename: str, index: str | None = None) -> IndexFile:
    """Return the index's entry for ``filename`` (its download URL and listed sha256)."""
    project = project_name(filename)
    try:
        page = list_files(project, index)
    except FetchError as exc:
        raise FetchError(f"{filename}: {exc}") from exc
    for file in page.files:
        if file.filename == filename:
            return file
    raise FetchError(f"{filename} is not listed by the index {page.url}")
