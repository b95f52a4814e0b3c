"""Tiny .debs and a loopback apt repository for the Debian lock, repository rule and rootfs tests.

    deb = make_deb(tmp, "tool", "1.0", "arm64", files={"bin/tool": Exec(b"...")}, depends="liba")
    with AptRepo(tmp / "repo", [deb, ...], codename="bookworm") as repo:
        repo.sources      # an apt sources file: deb [trusted=yes] http://127.0.0.1:PORT/ ./
        repo.archives     # SPARKSEAL_DEBIAN_ARCHIVES naming it: debian=http://127.0.0.1:PORT
        repo.requests     # Counter of requested paths
        repo.served_bytes_override[name] = b"..."  # a corrupt download
        repo.bazel_cuts[name] = 2                  # Bazel's next 2 downloads of it are cut short
    with SnapshotArchive(tmp / "snapshot", {"debian": [deb, ...]}) as snapshot:
        snapshot.url      # the base URL: <url>/archive/debian/<TIMESTAMP>/<pool path>, <url>/mr/...

``make_deb`` builds with ``dpkg-deb --build``; ``make_raw_deb`` writes the ar and tar members itself, for
archives dpkg-deb refuses to build (paths with ``..``, absolute paths, zstd members).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

from tests.servers.fixture_index import bazel_cut_due, send_cut_short, start_loopback, stop_loopback


@dataclass(frozen=True)
class Exec:
    """Content of an executable file."""

    data: bytes


@dataclass(frozen=True)
class Link:
    """A symlink's target."""

    target: str


@dataclass(frozen=True)
class Hardlink:
    """A hard link to another path of the same package."""

    to: str


Content = bytes | Exec | Link | Hardlink


def pool_name(package: str, version: str, arch: str) -> str:
    """The pool file name Debian gives a .deb (no epoch)."""
    return f"{package}_{version.split(':', 1)[-1]}_{arch}.deb"


def pool_path(package: str, filename: str, component: str = "main") -> str:
    """Where Debian's archive keeps a binary package's file (the source name is the package's here)."""
    prefix = package[:4] if package.startswith("lib") else package[:1]
    return f"pool/{component}/{prefix}/{package}/{filename}"


def _control(package: str, version: str, arch: str, fields: dict[str, str]) -> str:
    lines = [f"Package: {package}", f"Version: {version}", f"Architecture: {arch}"]
    lines += ["Maintainer: Fixture <fixture@example.invalid>", *(f"{k}: {v}" for k, v in fields.items())]
    lines += [f"Description: fixture package {package}", " Built by the sparkseal tests."]
    return "\n".join(lines) + "\n"


def make_deb(
    out_dir: Path,
    package: str,
    version: str,
    arch: str,
    files: dict[str, Content] | None = None,
    dirs: dict[str, int] | None = None,
    scripts: dict[str, str] | None = None,
    **fields: str,
) -> Path:
    """Build a .deb with ``dpkg-deb``; ``fields`` are more control fields (``pre_depends`` -> Pre-Depends)."""
    stage = out_dir / f".stage-{package}-{arch}"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "DEBIAN").mkdir(parents=True)
    control_fields = {"-".join(w.capitalize() for w in k.split("_")): v for k, v in fields.items()}
    (stage / "DEBIAN/control").write_text(_control(package, version, arch, control_fields))
    for name, text in (scripts or {}).items():
        script = stage / "DEBIAN" / name
        script.write_text(text)
        script.chmod(0o755)
    for rel, mode in (dirs or {}).items():
        (stage / rel).mkdir(parents=True, exist_ok=True)
        (stage / rel).chmod(mode)
    for rel, content in sorted((files or {}).items(), key=lambda kv: isinstance(kv[1], Hardlink)):
        path = stage / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            path.symlink_to(content.target)
        elif isinstance(content, Hardlink):
            os.link(stage / content.to, path)
        else:
            path.write_bytes(content.data if isinstance(content, Exec) else content)
            path.chmod(0o755 if isinstance(content, Exec) else 0o644)
    # What dh_md5sums adds to a real package: the md5 of every regular file.
    md5sums = "".join(
        f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.relative_to(stage).as_posix()}\n"
        for p in sorted(stage.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.parts[len(stage.parts)] != "DEBIAN"
    )
    if md5sums:
        (stage / "DEBIAN/md5sums").write_text(md5sums)
    deb = out_dir / pool_name(package, version, arch)
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(stage), str(deb)],
        check=True,
        capture_output=True,
        env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"},
    )
    shutil.rmtree(stage)
    return deb


def ar_archive(members: list[tuple[str, bytes]]) -> bytes:
    """An ``ar`` archive of ``members`` in order, as dpkg-deb writes one (any names, duplicates too)."""
    out = b"!<arch>\n"
    for name, data in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{0o100644:<8o}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    return out


def _tar(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in entries:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def tar_entry(
    name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = ""
) -> tuple[tarfile.TarInfo, bytes]:
    """One member for ``make_raw_deb``: a file (default), a directory or a symlink."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.linkname = link
    return info, data


def make_raw_deb(
    out_dir: Path,
    package: str,
    version: str,
    arch: str,
    data: list[tuple[tarfile.TarInfo, bytes]],
    data_member: str = "data.tar",
) -> Path:
    """Write a .deb from explicit ``data.tar`` members (uncompressed), without dpkg-deb's checks."""
    control = _tar([tar_entry("./control", _control(package, version, arch, {}).encode())])
    deb = out_dir / pool_name(package, version, arch)
    deb.write_bytes(
        ar_archive([("debian-binary", b"2.0\n"), ("control.tar", control), (data_member, _tar(data))])
    )
    return deb


def sha256(path: Path) -> str:
    """Hex sha256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def control_of(deb: Path) -> dict[str, str]:
    """The control fields of a .deb, via ``dpkg-deb``."""
    text = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
    return {
        k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if line and line[0] != " ")
    }


# The time stamp at which SnapshotArchive holds its files.
TIMESTAMP = "20240611T082157Z"


def lock_for(debs: list[Path], arch: str, archive: str = "debian") -> dict[str, object]:
    """A lock document naming exactly ``debs`` (what ``sparkseal lock debian`` would write for them, all
    from ``archive`` at the paths AptRepo serves them, and held by a SnapshotArchive at TIMESTAMP)."""
    packages = []
    for deb in debs:
        fields = control_of(deb)
        packages.append(
            {
                "architecture": fields["Architecture"],
                "archive": archive,
                "filename": deb.name,
                "package": fields["Package"],
                "path": pool_path(fields["Package"], deb.name),
                "sha256": sha256(deb),
                "size": deb.stat().st_size,
                "snapshot": TIMESTAMP,
                "version": fields["Version"],
            }
        )
    packages.sort(key=lambda p: str(p["package"]))
    roots = sorted(str(p["package"]) for p in packages)
    return {
        "architecture": arch,
        "format": 3,
        "generator": "fixture",
        "packages": packages,
        "roots": roots,
        "suite": "bookworm",
    }


def write_lock(path: Path, lock: dict[str, object]) -> Path:
    """Write ``lock`` as the lock writer does."""
    path.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return path


def send_body(handler: SimpleHTTPRequestHandler, status: int, body: bytes, content_type: str = "") -> None:
    """Answer a request with ``status`` and the whole of ``body``."""
    handler.send_response(status)
    if content_type:
        handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class LoopbackFiles:
    """The files under ``root`` served on loopback from a thread, each request counted in ``requests``;
    a subclass's ``answer`` may answer a request itself first (``_serve``). A context manager: the server
    runs from ``_serve`` (in the subclass's ``__enter__``) to ``__exit__``."""

    root: Path

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _serve(self, answer: Callable[[SimpleHTTPRequestHandler], bool]) -> None:
        """Start serving; ``answer(handler)`` is asked first and returns whether it answered."""
        requests = self.requests

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                """Keep test output quiet."""

            def do_GET(self) -> None:
                requests[self.path] += 1
                if not answer(self):
                    super().do_GET()

        self._server, self._thread = start_loopback(partial(Handler, directory=str(self.root)))
        host, port = self._server.server_address[:2]
        self.base = f"http://{host}:{port}"

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stop_loopback(self._server, self._thread)

    def deb_requests(self) -> int:
        """How many .deb downloads the server answered."""
        return sum(n for path, n in self.requests.items() if path.endswith(".deb"))


class AptRepo(LoopbackFiles):
    """A flat apt repository (``Packages`` + ``Release``) of ``debs``, served on loopback from a thread.

    The files lie at Debian's pool paths (``pool_path``) below the base URL, and the Release file carries
    ``label`` (an archive's name: ``Debian`` names the archive ``debian``), as a real archive's do.
    """

    def __init__(
        self, root: Path, debs: list[Path], codename: str = "bookworm", label: str = "Debian"
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        paragraphs = []
        for deb in debs:
            control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True)
            package = next(line for line in control.stdout.splitlines() if line.startswith("Package:"))
            path = pool_path(package.split(":", 1)[1].strip(), deb.name)
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(deb, root / path)
            data = (root / path).read_bytes()
            extra = f"Filename: {path}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
            paragraphs.append(control.stdout.rstrip("\n") + "\n" + extra)
        packages = "\n".join(paragraphs).encode()
        (root / "Packages").write_bytes(packages)
        digest = hashlib.sha256(packages).hexdigest()
        label_line = f"Label: {label}\n" if label else ""
        (root / "Release").write_text(
            f"Origin: Fixture\n{label_line}Codename: {codename}\nSuite: {codename}\n"
            f"SHA256:\n {digest} {len(packages)} Packages\n"
        )
        super().__init__()
        self.served_bytes_override: dict[str, bytes] = {}
        self.bazel_cuts: Counter[str] = Counter()
        self.sources = root.parent / f"{root.name}.sources.list"

    def __enter__(self) -> AptRepo:
        def answer(handler: SimpleHTTPRequestHandler) -> bool:
            name = handler.path.rsplit("/", 1)[-1]
            if name in self.served_bytes_override:
                send_body(handler, 200, self.served_bytes_override[name])
                return True
            if bazel_cut_due(handler, self.bazel_cuts, name):
                send_cut_short(handler, (self.root / handler.path.lstrip("/")).read_bytes())
                return True
            return False

        self._serve(answer)
        self.url = f"{self.base}/"
        self.sources.write_text(f"deb [trusted=yes] {self.url} ./\n")
        self.archives = f"debian={self.url}"
        return self


class SnapshotArchive(LoopbackFiles):
    """Debian's snapshot archive in small, on loopback: ``debs`` per archive name under one time stamp
    (``<url>/archive/<archive>/<timestamp>/<pool path>``) and the machine-readable API's
    ``/mr/binary/<package>/<version>/binfiles?fileinfo=1`` (sha1 and ``first_seen`` of each file)."""

    def __init__(self, root: Path, debs: dict[str, list[Path]], timestamp: str = TIMESTAMP) -> None:
        self.root = root
        self.timestamp = timestamp
        self.binfiles: dict[str, dict[str, object]] = {}
        for archive, files in debs.items():
            for deb in files:
                fields = control_of(deb)
                path = pool_path(fields["Package"], deb.name)
                target = root / "archive" / archive / timestamp / path
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(deb, target)
                sha1 = hashlib.sha1(deb.read_bytes()).hexdigest()
                key = f"/mr/binary/{fields['Package']}/{fields['Version']}/binfiles?fileinfo=1"
                answer = self.binfiles.setdefault(key, {"fileinfo": {}, "result": []})
                answer["result"].append({"architecture": fields["Architecture"], "hash": sha1})  # type: ignore[attr-defined]
                answer["fileinfo"][sha1] = [  # type: ignore[index]
                    {
                        "archive_name": archive,
                        "first_seen": timestamp,
                        "name": deb.name,
                        "path": "/" + path.rsplit("/", 1)[0],
                        "size": deb.stat().st_size,
                    }
                ]
        super().__init__()

    def __enter__(self) -> SnapshotArchive:
        def answer(handler: SimpleHTTPRequestHandler) -> bool:
            if not handler.path.startswith("/mr/"):
                return False
            found = self.binfiles.get(urllib.parse.unquote(handler.path))
            body = json.dumps(found).encode() if found else b'{"error": "not found"}'
            send_body(handler, 200 if found else 404, body, "application/json")
            return True

        self._serve(answer)
        self.url = self.base
        return self


def materialize(tree: Path, links: Path, dirs: Path, dest: Path) -> None:
    """Assemble the three rootfs outputs into a real directory tree (as the image's layer will hold it)."""
    shutil.copytree(tree, dest)
    for rel, entry in json.loads(dirs.read_text()).items():
        path = dest / rel
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(int(entry["mode"], 8))
        if os.geteuid() == 0:
            os.chown(path, entry["uid"], entry["gid"])
    for rel, target in json.loads(links.read_text()).items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
