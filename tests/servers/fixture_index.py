"""A loopback package index speaking the PEP 691 JSON simple API, for tests.

    with FixtureIndex({"pkg-1.0.tar.gz": b"...", "pkg-1.0-py3-none-any.whl": b"..."}) as idx:
        idx.url                      # http://127.0.0.1:PORT/simple
        idx.requests["/simple/pkg/"] # how often a path was requested

Project pages live at ``/simple/<normalised project>/`` and list each file with ``hashes.sha256`` and a
relative URL (``absolute_urls=True`` lists absolute ones); files are served from ``/packages/<filename>``.
Knobs for failure tests:

- ``listed_sha256_override``: filename -> sha256 to list instead of the true one (``None``: list no hash);
- ``unlisted``: filenames served under ``/packages/`` but left off their project page;
- ``served_bytes_override``: filename -> bytes served instead of the listed content (a corrupt download);
- ``bazel_cuts``: filename -> how many of Bazel's requests for it get a cut-short answer (``send_cut_short``);
  other clients, and Bazel's later requests, get the whole file: the file is fine, Bazel's transfer fails.
- ``json_pages=False``: pages answer HTML (as a PEP 503-only index does). A request whose ``Accept``
  header does not ask for the JSON type gets HTML too.
- ``basic_auth=(login, password)``: a private index; every request without those credentials (HTTP basic
  authentication) gets 401. ``authorized`` counts the requests that carried them, per path.

The server binds 127.0.0.1 on a free port, serves from a thread, and stops when the block ends.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import BaseRequestHandler
from types import TracebackType

from sparkseal.fetch.index import JSON_CONTENT_TYPE, project_name


def start_loopback(
    handler: Callable[..., BaseRequestHandler],
) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Serve ``handler`` on 127.0.0.1 (a free port) from a daemon thread; stop it with ``stop_loopback``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    return server, thread


def stop_loopback(server: ThreadingHTTPServer | None, thread: threading.Thread | None) -> None:
    """Stop a server started by ``start_loopback`` and wait for its thread."""
    assert server is not None and thread is not None
    server.shutdown()
    server.server_close()
    thread.join()


def bazel_cut_due(handler: BaseHTTPRequestHandler, cuts: Counter[str], name: str) -> bool:
    """Whether to cut this answer short (``send_cut_short``): Bazel asks for ``name`` while ``cuts`` lasts.

    Stands in for a proxy or a network that breaks Bazel's downloads but not other clients': only a request
    whose ``User-Agent`` is Bazel's (``Bazel/<version>``) is cut, so Python's urllib in the same build gets
    the whole file. Each cut uses one of ``cuts[name]``; the caller holds whatever lock guards ``cuts``.
    """
    if not handler.headers.get("User-Agent", "").startswith("Bazel/") or cuts[name] <= 0:
        return False
    cuts[name] -= 1
    return True


def send_cut_short(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    """An interrupted transfer: announce all of ``body`` (``Content-Length``), send half, close.

    Bazel 4.2.3 hashes what arrived and reports a checksum mismatch; a client that checks the length
    reports a short read. Either way the download fails without the file being wrong.
    """
    handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(body[: len(body) // 2])
    handler.close_connection = True


LOGIN = "ci-reader"
"""The login of a private index (``basic_auth=(LOGIN, password)``); tests make the password."""


def with_credentials(url: str, login: str, password: str) -> str:
    """``url`` with ``login:password@`` before its host: how a private index's URL carries credentials."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{login}:{password}@{rest}"


class FixtureIndex:
    """A threaded loopback HTTP server holding a few files and their project pages."""

    def __init__(
        self,
        files: Mapping[str, bytes],
        *,
        listed_sha256_override: Mapping[str, str | None] | None = None,
        unlisted: Iterable[str] = (),
        served_bytes_override: Mapping[str, bytes] | None = None,
        bazel_cuts: Mapping[str, int] | None = None,
        absolute_urls: bool = False,
        json_pages: bool = True,
        basic_auth: tuple[str, str] | None = None,
    ) -> None:
        self.files = dict(files)
        self.listed_sha256_override = dict(listed_sha256_override or {})
        self.unlisted = set(unlisted)
        self.served_bytes_override = dict(served_bytes_override or {})
        self.bazel_cuts: Counter[str] = Counter(bazel_cuts or {})
        self.absolute_urls = absolute_urls
        self.json_pages = json_pages
        self.basic_auth = basic_auth
        self.requests: Counter[str] = Counter()
        self.authorized: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server."""
        if self._server is None:
            raise RuntimeError("FixtureIndex is not running; use it as a context manager")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def url(self) -> str:
        """The index URL (no trailing slash, like pip's default)."""
        return f"{self.base}/simple"

    def file_url(self, filename: str) -> str:
        """The absolute download URL of ``filename``."""
        return f"{self.base}/packages/{filename}"

    def page_url(self, project: str) -> str:
        """The absolute URL of ``project``'s page."""
        return f"{self.url}/{project}/"

    def sha256(self, filename: str) -> str:
        """The true sha256 of ``filename``'s content."""
        return hashlib.sha256(self.files[filename]).hexdigest()

    def listed_sha256(self, filename: str) -> str | None:
        """The sha256 the project page lists for ``filename``."""
        if filename in self.listed_sha256_override:
            return self.listed_sha256_override[filename]
        return self.sha256(filename)

    def __enter__(self) -> FixtureIndex:
        handler = type("Handler", (_Handler,), {"index": self})
        self._server, self._thread = start_loopback(handler)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stop_loopback(self._server, self._thread)

    def _count(self, path: str) -> None:
        with self._lock:
            self.requests[path] += 1

    def _page_files(self, project: str) -> list[dict[str, object]]:
        entries = []
        for filename in sorted(self.files):
            if filename in self.unlisted or project_name(filename) != project:
                continue
            url = self.file_url(filename) if self.absolute_urls else f"../../packages/{filename}"
            sha256 = self.listed_sha256(filename)
            entries.append({"filename": filename, "url": url, "hashes": {"sha256": sha256} if sha256 else {}})
        return entries

    def _projects(self) -> set[str]:
        return {project_name(filename) for filename in self.files}


class _Handler(BaseHTTPRequestHandler):
    index: FixtureIndex

    def log_message(self, *args: object) -> None:
        """Keep test output quiet."""

    def do_GET(self) -> None:
        """Serve a project page or a file."""
        index = self.index
        index._count(self.path)
        if index.basic_auth is not None:
            login, password = index.basic_auth
            expected = "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="fixture index"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with index._lock:
                index.authorized[self.path] += 1
        parts = self.path.split("?", 1)[0].split("/")
        # "/simple/<project>/" splits into ["", "simple", project, ""].
        if len(parts) == 4 and parts[1] == "simple" and parts[3] == "" and parts[2] in index._projects():
            self._send_page(parts[2])
        elif len(parts) == 3 and parts[1] == "packages" and parts[2] in index.files:
            body = index.served_bytes_override.get(parts[2], index.files[parts[2]])
            with index._lock:
                cut = bazel_cut_due(self, index.bazel_cuts, parts[2])
            if cut:
                send_cut_short(self, body)
            else:
                self._send(200, "application/octet-stream", body)
        else:
            self._send(404, "text/plain", b"not found\n")

    def _send_page(self, project: str) -> None:
        files = self.index._page_files(project)
        if self.index.json_pages and JSON_CONTENT_TYPE in self.headers.get("Accept", ""):
            page = {"meta": {"api-version": "1.0"}, "name": project, "files": files}
            self._send(200, JSON_CONTENT_TYPE, json.dumps(page).encode())
            return
        anchors = "".join(
            f'<a href="{html.escape(str(f["url"]))}">{html.escape(str(f["filename"]))}</a>\n' for f in files
        )
        self._send(200, "text/html", f"<!DOCTYPE html>\n<html><body>\n{anchors}</body></html>\n".encode())

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
