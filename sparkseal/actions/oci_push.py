"""``bazel run`` program of ``oci_push``: push an image (or an image index) to a registry, by digest.

It speaks the OCI distribution API with the standard library only. Every blob is first asked for with
``HEAD``; only the ones the registry lacks are uploaded (``POST`` an upload, then one ``PUT ?digest=`` that
streams the file), so pushing an image whose layers the registry holds moves kilobytes. Manifests follow
their blobs, an index follows its manifests, and the tag goes last: a registry never shows a tag whose
content is incomplete. The registry checks each blob against its digest; the digest the registry reports
for each manifest is checked against ours.

Blobs are read from the image layout directories that ``oci_image`` writes; an index (``oci_image_index``)
is a small document whose manifests live in those layouts. A blob that no layout holds on this disk (a
build with ``--remote_download_minimal`` leaves the layer files in the remote cache) is streamed from
Bazel's HTTP remote cache given with ``--blob-cache``: Bazel stores every output file there under
``/cas/<sha256 of the file>``, and a blob's OCI digest is that same sha256. Its size is checked before the
upload and its digest while it streams through.

Plain HTTP is used for loopback registries only (``localhost``, ``127.0.0.0/8``, ``::1``), or for any host
given with ``--plain-http``; everything else is HTTPS. Credentials come from a netrc entry for the registry
host (``NETRC`` or ``~/.netrc``), sent as basic authentication or exchanged for a bearer token where the
registry asks for one; the cache's from its URL or from netrc. They never appear in output.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import ipaddress
import json
import re
import sys
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkseal.core.credentials import REDACTED, Credentials, CredentialsError, from_netrc
from sparkseal.core.oci import (
    DIGEST_RE,
    INDEX_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    REF_NAME,
    REPOSITORY_PATH_RE,
    TAG_RE,
    LayoutError,
    blob_path,
    read_image_entry,
)
from sparkseal.core.tar import CHUNK

TIMEOUT_S = 300.0
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def _connect(scheme: str, netloc: str) -> http.client.HTTPConnection:
    """One HTTP(S) connection to ``netloc``, with the push's timeout and read size."""
    kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    return kind(netloc, timeout=TIMEOUT_S, blocksize=CHUNK)


class PushError(Exception):
    """The push cannot go on; the message names the registry, the object and what the registry said."""


@dataclass(frozen=True)
class Reference:
    """``REGISTRY/REPOSITORY[:TAG]``, split."""

    registry: str
    repository: str
    tag: str

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "")


def parse_reference(text: str) -> Reference:
    """Split ``REGISTRY/REPOSITORY[:TAG]``; the registry is the first component and must be a host."""
    registry, slash, rest = text.partition("/")
    if not slash or not rest or not ("." in registry or ":" in registry or registry == "localhost"):
        raise PushError(
            f"reference {text!r}: expected REGISTRY/REPOSITORY[:TAG] with a registry host first "
            f"(e.g. registry.example:5000/sparkseal/vllm:0.25.1)"
        )
    repository, colon, tag = rest.partition(":")
    if not REPOSITORY_PATH_RE.fullmatch(repository):
        raise PushError(
            f"reference {text!r}: repository {repository!r} is not valid "
            f"(expected lower-case components separated by '/')"
        )
    if colon and not TAG_RE.fullmatch(tag):
        raise PushError(
            f"reference {text!r}: tag {tag!r} is not valid (expected [A-Za-z0-9_][A-Za-z0-9_.-]*)"
        )
    return Reference(registry, repository, tag)


def is_loopback(registry: str) -> bool:
    """True for ``localhost`` and loopback addresses, with or without a port."""
    host = urllib.parse.urlsplit("//" + registry).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BlobCache:
    """Bazel's HTTP remote cache, read for the blobs that no layout holds on this disk."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.hostname or ""
        if parts.port is not None:
            netloc += f":{parts.port}"
        # The URL as messages show it: no user name or password.
        self.shown = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        if parts.username is not None:
            self.shown = self.shown.replace("://", f"://{REDACTED}@", 1)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise PushError(
                f"--blob-cache {self.shown}: expected the http:// or https:// URL of a remote cache, as "
                f"given to Bazel's --remote_cache"
            )
        self.scheme, self.netloc, self.path = parts.scheme, netloc, parts.path.rstrip("/")
        if parts.username is not None:
            login = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            self.credentials: Credentials | None = Credentials(login, password, "the --blob-cache URL")
        else:
            self.credentials = _credentials(parts.hostname)

    def open(self, digest: str, size: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Start reading blob ``digest`` of ``size`` bytes; the caller reads the response and closes both."""
        connection = _connect(self.scheme, self.netloc)
        headers = {"Authorization": self.credentials.header()} if self.credentials else {}
        where = f"the remote cache {self.shown}"
        try:
            connection.request("GET", f"{self.path}/cas/{digest.removeprefix('sha256:')}", headers=headers)
            response = connection.getresponse()
        except OSError as exc:
            connection.close()
            raise PushError(f"blob {digest}: {where}: {exc}") from exc
        if response.status != 200:
            connection.close()
            raise PushError(f"blob {digest}: not in {where} (HTTP {response.status})")
        length = response.getheader("Content-Length")
        if length != str(size):
            connection.close()
            raise PushError(f"blob {digest}: {where} has {length} bytes of it, expected {size}")
        return connection, response


class _Verified:
    """A body for ``http.client`` that hashes what it hands on, so a streamed blob is checked too."""

    def __init__(self, stream: http.client.HTTPResponse) -> None:
        self._stream = stream
        self.sha256 = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.sha256.update(data)
        return data


@dataclass
class Source:
    """What to push: the top document, the layouts that hold its blobs, and a cache for the rest."""

    document: bytes
    media_type: str
    default_tag: str
    layouts: list[Path]
    cache: BlobCache | None = None

    def find(self, digest: str) -> Path | None:
        """The file of ``digest`` in one of the layouts, if one holds it on this disk."""
        for layout in self.layouts:
            path = blob_path(layout, digest)
            if path.is_file():
                return path
        return None

    def blob(self, digest: str) -> Path:
        """The file of ``digest`` in one of the layouts."""
        path = self.find(digest)
        if path is None:
            places = ", ".join(str(layout) for layout in self.layouts)
            raise PushError(f"blob {digest}: in none of the image layouts {places}")
        return path


def read_source(layouts: list[Path], index: Path | None, cache: BlobCache | None = None) -> Source:
    """The image of the one layout, or the index document ``index`` over the layouts' images."""
    if not layouts:
        raise PushError("nothing to push: no image layout given (--layout)")
    if index is not None:
        try:
            data = index.read_bytes()
        except OSError as exc:
            raise PushError(f"image index {index}: not readable: {exc}") from exc
        return Source(data, INDEX_MEDIA_TYPE, "", layouts, cache)
    if len(layouts) != 1:
        raise PushError(f"{len(layouts)} layouts given without --index: expected one image layout")
    try:
        entry = read_image_entry(layouts[0])
    except LayoutError as exc:
        raise PushError(str(exc)) from exc
    path = blob_path(layouts[0], entry["digest"])
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PushError(f"{path}: the manifest that index.json names is not readable: {exc}") from exc
    tag = (entry.get("annotations") or {}).get(REF_NAME, "")
    return Source(data, str(entry.get("mediaType") or MANIFEST_MEDIA_TYPE), tag, layouts, cache)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _parse(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise PushError(f"{what}: not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise PushError(f"{what}: expected a JSON object")
    return value


def _credentials(host: str) -> Credentials | None:
    try:
        return from_netrc(host)
    except CredentialsError as exc:
        raise PushError(str(exc)) from None


@dataclass
class Report:
    """What a push did, blob by blob."""

    uploaded: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[tuple[str, int]] = field(default_factory=list)
    manifests: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "manifests": self.manifests,
            "skipped": [d for d, _ in self.skipped],
            "skipped_bytes": sum(n for _, n in self.skipped),
            "uploaded": [d for d, _ in self.uploaded],
            "uploaded_bytes": sum(n for _, n in self.uploaded),
        }


class Registry:
    """One repository of one registry, over one HTTP(S) connection at a time."""

    def __init__(self, reference: Reference, plain_http: bool) -> None:
        self.reference = reference
        self.scheme = "http" if plain_http or is_loopback(reference.registry) else "https"
        self.base = f"{self.scheme}://{reference.registry}"
        self._credentials = _credentials(urllib.parse.urlsplit("//" + reference.registry).hostname or "")
        self._authorization = ""
        if self._credentials is not None:
            self._authorization = self._credentials.header()

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """One request; on a bearer challenge, fetch a token with the netrc credentials and retry once."""
        for attempt in range(2):
            if hasattr(body, "seekable") and body.seekable():
                body.seek(0)
            elif hasattr(body, "read") and attempt:
                # A stream from the remote cache cannot be sent twice.
                raise PushError(f"registry {self.base}: {method} {path}: a second challenge mid-stream")
            sent = dict(headers or {})
            if self._authorization:
                sent["Authorization"] = self._authorization
            connection = _connect(self.scheme, self.reference.registry)
            try:
                connection.request(method, path, body=body, headers=sent)
                response = connection.getresponse()
                data = response.read()
                answer = (response.status, {k.lower(): v for k, v in response.getheaders()}, data)
            except OSError as exc:
                raise PushError(f"registry {self.base}: {method} {path}: {exc}") from exc
            finally:
                connection.close()
            challenge = answer[1].get("www-authenticate", "")
            if answer[0] == 401 and attempt == 0 and challenge.lower().startswith("bearer "):
                self._bearer(challenge)
                continue
            return answer
        return answer

    def _bearer(self, challenge: str) -> None:
        params = dict(_CHALLENGE.findall(challenge))
        realm = params.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise PushError(f"registry {self.base}: bearer challenge without a usable realm")
        url = realm + "?" + urllib.parse.urlencode(sorted(params.items()))
        parts = urllib.parse.urlsplit(url)
        connection = _connect(parts.scheme, parts.netloc)
        headers = {}
        if self._credentials is not None:
            headers["Authorization"] = self._credentials.header()
        try:
            connection.request("GET", parts.path + "?" + parts.query, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except OSError as exc:
            raise PushError(f"registry {self.base}: token service {realm}: {exc}") from exc
        finally:
            connection.close()
        if response.status != 200:
            raise PushError(
                f"registry {self.base}: token service {realm} answered HTTP {response.status} "
                f"({'credentials refused' if self._credentials else 'no netrc credentials for this host'})"
            )
        body = _parse(data, f"registry {self.base}: token service {realm}")
        token = body.get("token") or body.get("access_token")
        if not isinstance(token, str):
            raise PushError(f"registry {self.base}: token service {realm} returned no token")
        self._authorization = f"Bearer {token}"

    def fail(self, what: str, status: int, body: bytes) -> PushError:
        """The error for an unexpected answer: registry, object, HTTP status and the registry's message."""
        detail = ""
        try:
            errors = json.loads(body).get("errors") or []
            detail = "; ".join(f"{e.get('code', '?')}: {e.get('message', '')}" for e in errors)
        except (ValueError, AttributeError):
            detail = body[:200].decode("utf-8", "replace").strip()
        if status == 401:
            detail += " (no netrc credentials for this host)" if not self._credentials else " (refused)"
        return PushError(f"registry {self.base}: {what}: HTTP {status}" + (f": {detail}" if detail else ""))

    def _path(self, kind: str, name: str) -> str:
        return f"/v2/{self.reference.repository}/{kind}/{name}"

    def has_blob(self, digest: str) -> bool:
        status, _, body = self.request("HEAD", self._path("blobs", digest))
        if status == 200:
            return True
        if status == 404:
            return False
        raise self.fail(f"HEAD blob {digest} of {self.reference.repository}", status, body)

    def upload_blob(self, digest: str, stream: Any, size: int) -> None:
        """Upload ``size`` bytes read from ``stream`` (a file or a verifying HTTP body) as ``digest``."""
        what = f"upload of blob {digest} to {self.reference.repository}"
        status, headers, body = self.request("POST", self._path("blobs", "uploads/"))
        if status != 202 or "location" not in headers:
            raise self.fail(what + " (POST)", status, body)
        location = urllib.parse.urlsplit(urllib.parse.urljoin(self.base + "/", headers["location"]))
        query = [*urllib.parse.parse_qsl(location.query), ("digest", digest)]
        target = location.path + "?" + urllib.parse.urlencode(query)
        status, _, body = self.request(
            "PUT",
            target,
            body=stream,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        if status != 201:
            raise self.fail(what + " (PUT)", status, body)

    def put_manifest(self, reference: str, data: bytes, media_type: str) -> None:
        status, headers, body = self.request(
            "PUT", self._path("manifests", reference), body=data, headers={"Content-Type": media_type}
        )
        if status not in (200, 201):
            raise self.fail(f"PUT manifest {_digest(data)} as {reference}", status, body)
        returned = headers.get("docker-content-digest")
        if returned and returned != _digest(data):
            raise PushError(
                f"registry {self.base}: manifest {reference}: the registry stored digest {returned}, "
                f"expected {_digest(data)}"
            )


def _push_blob(registry: Registry, source: Source, descriptor: dict[str, Any], report: Report) -> None:
    digest, size = descriptor.get("digest"), descriptor.get("size")
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest) or not isinstance(size, int):
        raise PushError(f"descriptor {descriptor!r}: expected a sha256 digest and a size")
    if any(digest == d for d, _ in report.uploaded + report.skipped):
        return
    if registry.has_blob(digest):
        report.skipped.append((digest, size))
        print(f"exists   {digest} ({size} bytes)", flush=True)
        return
    path = source.find(digest)
    if path is None and source.cache is not None:
        connection, response = source.cache.open(digest, size)
        body = _Verified(response)
        try:
            registry.upload_blob(digest, body, size)
        finally:
            connection.close()
        if "sha256:" + body.sha256.hexdigest() != digest:
            raise PushError(
                f"blob {digest}: the remote cache {source.cache.shown} sent bytes with digest "
                f"sha256:{body.sha256.hexdigest()}, and the registry took them"
            )
        report.uploaded.append((digest, size))
        print(f"uploaded {digest} ({size} bytes, from the remote cache)", flush=True)
        return
    path = path or source.blob(digest)
    if path.stat().st_size != size:
        raise PushError(f"blob {digest}: {path} has {path.stat().st_size} bytes, expected {size}")
    with path.open("rb") as stream:
        registry.upload_blob(digest, stream, size)
    report.uploaded.append((digest, size))
    print(f"uploaded {digest} ({size} bytes)", flush=True)


def _push_image(registry: Registry, source: Source, manifest: bytes, report: Report, tag: str) -> None:
    document = _parse(manifest, f"manifest {_digest(manifest)}")
    _push_blob(registry, source, document.get("config") or {}, report)
    for layer in document.get("layers") or []:
        _push_blob(registry, source, layer, report)
    registry.put_manifest(tag or _digest(manifest), manifest, MANIFEST_MEDIA_TYPE)
    report.manifests.append(_digest(manifest))


def push(source: Source, reference: Reference, plain_http: bool = False) -> tuple[str, Report]:
    """Push ``source`` to ``reference``; return the top digest and what was uploaded and skipped."""
    registry = Registry(reference, plain_http)
    report = Report()
    tag = reference.tag or source.default_tag
    top = _digest(source.document)
    if source.media_type == INDEX_MEDIA_TYPE:
        index = _parse(source.document, f"image index {top}")
        for entry in index.get("manifests") or []:
            digest = entry.get("digest", "")
            try:
                manifest = source.blob(digest).read_bytes()
            except OSError as exc:
                raise PushError(f"manifest {digest}: not readable: {exc}") from exc
            if _digest(manifest) != digest:
                raise PushError(f"manifest {digest}: the layouts hold bytes with digest {_digest(manifest)}")
            _push_image(registry, source, manifest, report, "")
        registry.put_manifest(tag or top, source.document, INDEX_MEDIA_TYPE)
        report.manifests.append(top)
    else:
        _push_image(registry, source, source.document, report, tag)
    return top, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", help="REGISTRY/REPOSITORY[:TAG] (the tag defaults to the image's own)")
    parser.add_argument("--layout", action="append", type=Path, default=[], help="an OCI image layout")
    parser.add_argument("--index", type=Path, help="an image index document over the layouts' images")
    parser.add_argument("--plain-http", action="store_true", help="HTTP for a registry that is not loopback")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on the last line")
    parser.add_argument(
        "--blob-cache",
        metavar="URL",
        help="Bazel's HTTP remote cache (the --remote_cache URL): read the blobs no layout holds from it",
    )
    args = parser.parse_args(argv)
    try:
        reference = parse_reference(args.reference)
        cache = BlobCache(args.blob_cache) if args.blob_cache else None
        source = read_source(args.layout, args.index, cache)
        top, report = push(source, reference, args.plain_http)
    except PushError as exc:
        print(f"sparkseal: push: {exc}", file=sys.stderr)
        return 1
    tag = reference.tag or source.default_tag
    where = f"{reference.registry}/{reference.repository}" + (f":{tag}" if tag else "")
    print(
        f"pushed {where}@{top}: {len(report.uploaded)} blobs uploaded "
        f"({sum(n for _, n in report.uploaded)} bytes), {len(report.skipped)} already there",
        flush=True,
    )
    if args.json:
        print(json.dumps({"digest": top, "reference": where, **report.as_dict()}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
