"""Unpack the locked .debs into a root file system, as dpkg would on a merged-/usr system.

No maintainer script runs. Each ``data.tar`` member lands at its merged-/usr place (``bin/x`` ->
``usr/bin/x``); a member that is absolute, climbs out with ``..``, passes through a symlink, or clashes
with another package's different file is refused. Three outputs, because a Bazel tree artifact holds
neither symlinks nor empty directories reliably:

- ``out``: the tree of regular files (modes normalised to 0644/0755);
- ``links``: a links spec, the JSON object ``{"path": "target"}`` of every symlink (``bin`` -> ``usr/bin``
  included), as the layer writer (``sparkseal.actions.oci_layer``) reads it;
- ``dirs``: the JSON object ``{"path": {"mode": "0755", "uid": 0, "gid": 0}}`` of every directory, empty
  ones included. A directory is 1777 when its package gives it the sticky bit (/tmp, /var/tmp), else
  0755; owners are root except the runtime user's home.

Paths are relative to the root; keys are sorted. What the image needs from the skipped maintainer
scripts is done here, each step named in ``_configure``: ``/etc/passwd`` and ``/etc/group``, the CA
bundle, the ``nsswitch.conf`` and ``localtime`` defaults, and the dpkg database (``var/lib/dpkg/status``
and ``info/*.list``/``*.md5sums``) that image scanners and SBOM tools read, and the interpreter's bytecode
(its postinst runs ``py3compile``): here reproducible unchecked-hash pycs of the standard library
(``sparkseal.install.bytecode``), so that no start of the image compiles it again.
"""

from __future__ import annotations

import bz2
import fnmatch
import gzip
import hashlib
import io
import json
import lzma
import os
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from sparkseal.core.determinism import DIR_MODE, FILE_MODE, GID, STICKY_DIR_MODE, UID
from sparkseal.core.digests import sha256_file
from sparkseal.core.paths import UnsafePath, check_relative
from sparkseal.core.tree import normalised_mode
from sparkseal.core.wheels import PYTHON_VERSION
from sparkseal.install.bytecode import BytecodeError, compile_tree

# Top-level directories that are symlinks into /usr on a merged-/usr system (bookworm's default); a
# link is made for each one whose /usr counterpart exists.
MERGED_USR = ("bin", "lib", "lib32", "lib64", "libo32", "libx32", "sbin")

# The unprivileged account the image may run as. 1000 is the first uid Debian's adduser hands out, so
# it is the uid of the only user on a typical single-user GB10 workstation: files it writes into
# bind-mounted model caches stay that user's.
RUNTIME_USER = "vllm"
RUNTIME_UID = 1000
RUNTIME_GID = 1000
NOBODY_UID = 65534

# Named path filters (fnmatch over root-relative paths; ``*`` spans ``/``): (drop, keep anyway).
# "slim" drops what Debian's own slim container images drop, keeping every copyright file.
EXCLUDE_PROFILES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "none": ((), ()),
    "slim": (
        (
            "usr/share/doc/*",
            "usr/share/groff/*",
            "usr/share/info/*",
            "usr/share/linda/*",
            "usr/share/lintian/*",
            "usr/share/locale/*",
            "usr/share/man/*",
        ),
        ("usr/share/doc/*/copyright",),
    ),
}

_AR_MAGIC = b"!<arch>\n"
_AR_HEADER = 60
_DECOMPRESS = {"": bytes, ".gz": gzip.decompress, ".xz": lzma.decompress, ".bz2": bz2.decompress}


class DebError(Exception):
    """A .deb is malformed, unsafe, clashes with another, or is not the locked one."""


@dataclass
class _Entry:
    kind: str  # "file", "link" or "dir"
    package: str
    digest: str = ""
    target: str = ""
    mode: int = DIR_MODE
    uid: int = UID
    gid: int = GID


@dataclass
class _Package:
    deb: Path
    fields: dict[str, str]
    control: str
    md5sums: bytes
    listed: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.fields["Package"]

    @property
    def info_name(self) -> str:
        """The dpkg database name: ``pkg:arch`` for ``Multi-Arch: same`` packages, else ``pkg``."""
        if self.fields.get("Multi-Arch") == "same":
            return f"{self.name}:{self.fields['Architecture']}"
        return self.name


def read_ar(data: bytes, where: str) -> dict[str, bytes]:
    """Return the members of a Unix ``ar`` archive (the container format of a .deb)."""
    if not data.startswith(_AR_MAGIC):
        raise DebError(f"{where}: expected an ar archive starting with {_AR_MAGIC!r}, got {data[:8]!r}")
    members: dict[str, bytes] = {}
    offset = len(_AR_MAGIC)
    while offset < len(data):
        header = data[offset : offset + _AR_HEADER]
        if len(header) != _AR_HEADER or header[58:60] != b"`\n":
            raise DebError(f"{where}: truncated or corrupt ar header at byte {offset}")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError as exc:
            raise DebError(f"{where}: member {name!r}: bad size field {header[48:58]!r}") from exc
        start = offset + _AR_HEADER
        if start + size > len(data):
            raise DebError(f"{where}: member {name!r} claims {size} bytes, only {len(data) - start} remain")
        members[name] = data[start : start + size]
        offset = start + size + (size & 1)
    return members


def tar_member(members: dict[str, bytes], stem: str, where: str) -> tarfile.TarFile:
    """The one ``STEM.tar[.gz|.xz|.bz2]`` member of a .deb, opened; a .deb may compress either way."""
    names = [n for n in members if n == stem or n.startswith(stem + ".")]
    if len(names) != 1:
        raise DebError(f"{where}: expected one {stem}.* member, found {names or 'none'} in {sorted(members)}")
    suffix = names[0][len(stem) :]
    if suffix not in _DECOMPRESS:
        supported = ", ".join(f"{stem}{s}" for s in _DECOMPRESS)
        raise DebError(f"{where}: {names[0]} is not supported (expected one of {supported})")
    try:
        return tarfile.open(fileobj=io.BytesIO(_DECOMPRESS[suffix](members[names[0]])), mode="r:")
    except (tarfile.TarError, lzma.LZMAError, OSError, EOFError, zlib.error) as exc:
        raise DebError(f"{where}: {names[0]}: cannot read: {exc}") from exc


def _control_fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        if line and not line[0].isspace() and ":" in line:
            key, value = line.split(":", 1)
            fields[key] = value.strip()
    return fields


def read_control(deb: Path, members: dict[str, bytes]) -> _Package:
    """Read the ``control`` and ``md5sums`` files of a .deb's control archive."""
    version = members.get("debian-binary", b"").strip()
    if version != b"2.0":
        raise DebError(f"{deb}: debian-binary: expected b'2.0', got {version!r}")
    with tar_member(members, "control.tar", str(deb)) as control:
        files = {}
        for member in control:
            name = member.name.removeprefix("./")
            if member.isfile() and name in ("control", "md5sums"):
                source = control.extractfile(member)
                assert source is not None
                files[name] = source.read()
    if "control" not in files:
        raise DebError(f"{deb}: control.tar has no control file")
    text = files["control"].decode("utf-8")
    fields = _control_fields(text)
    for key in ("Package", "Version", "Architecture"):
        if not fields.get(key):
            raise DebError(f"{deb}: control file has no {key} field")
    return _Package(deb, fields, text, files.get("md5sums", b""))


def canonical(rel: PurePosixPath) -> PurePosixPath:
    """Where ``rel`` lands on a merged-/usr system: ``bin/x`` -> ``usr/bin/x``."""
    if rel.parts[0] in MERGED_USR:
        return PurePosixPath("usr", *rel.parts)
    return rel


def check_link_target(path: PurePosixPath, target: str, where: str) -> None:
    """Refuse an empty target, or a relative one that climbs out of the root from ``path``."""
    if not target or "\0" in target:
        raise DebError(f"{where}: symlink {path} has an empty or NUL-containing target {target!r}")
    if target.startswith("/"):
        return
    depth = len(path.parent.parts)
    for part in PurePosixPath(target).parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            raise DebError(f"{where}: symlink {path} -> {target} escapes the root file system")


class RootfsBuilder:
    """Accumulates the entries of several packages, then writes the three outputs."""

    def __init__(self, out: Path, exclude: str) -> None:
        self.out = out
        self.drop, self.keep = EXCLUDE_PROFILES[exclude]
        self.entries: dict[PurePosixPath, _Entry] = {}
        self.packages: list[_Package] = []

    def excluded(self, path: PurePosixPath) -> bool:
        """Whether the exclusion profile drops ``path``."""
        text = str(path)
        if not any(fnmatch.fnmatchcase(text, p) for p in self.drop):
            return False
        return not any(fnmatch.fnmatchcase(text, p) for p in self.keep)

    def _claim(self, path: PurePosixPath, entry: _Entry, where: str) -> bool:
        """Record ``entry`` at ``path``; return False when an identical entry is already there."""
        old = self.entries.get(path)
        if old is None:
            self.entries[path] = entry
            return True
        if old.kind == entry.kind == "dir":
            return False
        if old.kind == entry.kind and old.digest == entry.digest and old.target == entry.target:
            return False
        raise DebError(
            f"{where}: {path} clashes: package {old.package} has a {old.kind}"
            f"{' -> ' + old.target if old.target else ''}, package {entry.package} a different {entry.kind}"
            f"{' -> ' + entry.target if entry.target else ''}"
        )

    def add_package(self, pkg: _Package, members: dict[str, bytes]) -> None:
        """Unpack the ``data.tar`` of ``pkg``."""
        with tar_member(members, "data.tar", str(pkg.deb)) as data:
            for member in data:
                self._add_member(pkg, data, member)
        self.packages.append(pkg)

    def _add_member(self, pkg: _Package, data: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        where = f"{pkg.deb}: member {member.name!r}"
        if member.name in (".", "./", "/"):
            return
        try:
            rel = check_relative(member.name, where)
        except UnsafePath as exc:
            raise DebError(str(exc)) from exc
        path = canonical(rel)
        if len(rel.parts) == 1 and rel.parts[0] in MERGED_USR:
            if not member.isdir():
                raise DebError(f"{where}: /{rel} must be a directory (it is a link into /usr here)")
            return
        if self.excluded(path):
            return
        pkg.listed.append(f"/{rel}")
        if member.isdir():
            mode = STICKY_DIR_MODE if member.mode & 0o1000 else DIR_MODE
            self._claim(path, _Entry("dir", pkg.name, mode=mode), where)
        elif member.issym():
            check_link_target(path, member.linkname, where)
            self._claim(path, _Entry("link", pkg.name, target=member.linkname), where)
        elif member.isfile() or member.islnk():
            if member.mode & 0o7000:
                raise DebError(
                    f"{where}: mode {member.mode:o} has setuid, setgid or sticky bits (not supported)"
                )
            source = data.extractfile(member)
            if source is None:
                raise DebError(f"{where}: cannot read the hard link target {member.linkname!r}")
            content = source.read()
            entry = _Entry("file", pkg.name, digest=hashlib.sha256(content).hexdigest())
            if self._claim(path, entry, where):
                self._write(path, content, normalised_mode(member.mode))
        else:
            raise DebError(f"{where}: only directories, regular files and symlinks are allowed")

    def _write(self, path: PurePosixPath, content: bytes, mode: int) -> None:
        target = self.out.joinpath(*path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)

    def add_file(self, path: str, content: bytes, where: str) -> None:
        """Add a file this action writes (not from a package)."""
        rel = PurePosixPath(path)
        entry = _Entry("file", "(generated)", digest=hashlib.sha256(content).hexdigest())
        if self._claim(rel, entry, where):
            self._write(rel, content, FILE_MODE)

    def has(self, path: str) -> bool:
        """Whether an entry (file, link or directory) exists at ``path``."""
        return PurePosixPath(path) in self.entries

    def check_and_complete(self) -> None:
        """Add missing parent directories and the merged-/usr links; refuse paths through symlinks."""
        for path in sorted(self.entries):
            for parent in list(path.parents)[:-1]:
                entry = self.entries.setdefault(parent, _Entry("dir", "(parent)"))
                if entry.kind != "dir":
                    raise DebError(
                        f"{path} (package {self.entries[path].package}) passes through the {entry.kind} "
                        f"{parent}{' -> ' + entry.target if entry.target else ''} of package {entry.package}"
                    )
        for top in MERGED_USR:
            if PurePosixPath("usr", top) in self.entries:
                self._claim(PurePosixPath(top), _Entry("link", "(merged /usr)", target=f"usr/{top}"), top)

    def write_metadata(self, links: Path, dirs: Path) -> None:
        """Write the links and dirs specs (the tree itself holds only the parents of its files)."""
        link_spec = {str(p): e.target for p, e in self.entries.items() if e.kind == "link"}
        dir_spec = {
            str(p): {"mode": f"{e.mode:04o}", "uid": e.uid, "gid": e.gid}
            for p, e in self.entries.items()
            if e.kind == "dir"
        }
        links.write_text(json.dumps(link_spec, indent=2, sort_keys=True) + "\n")
        dirs.write_text(json.dumps(dir_spec, indent=2, sort_keys=True) + "\n")


def _status_paragraph(pkg: _Package) -> str:
    lines = [line for line in pkg.control.strip("\n").split("\n") if line.strip()]
    at = next(i for i, line in enumerate(lines) if line.startswith("Package:"))
    lines.insert(at + 1, "Status: install ok installed")
    return "\n".join(lines) + "\n"


def _accounts() -> tuple[bytes, bytes]:
    passwd = (
        f"root:x:{UID}:{GID}:root:/root:/bin/sh\n"
        f"{RUNTIME_USER}:x:{RUNTIME_UID}:{RUNTIME_GID}:{RUNTIME_USER}:/home/{RUNTIME_USER}:/bin/sh\n"
        f"nobody:x:{NOBODY_UID}:{NOBODY_UID}:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group = f"root:x:{GID}:\n{RUNTIME_USER}:x:{RUNTIME_GID}:\nnogroup:x:{NOBODY_UID}:\n"
    return passwd.encode(), group.encode()


def _ca_bundle(builder: RootfsBuilder) -> tuple[bytes, bytes]:
    """What ``update-ca-certificates`` writes: the enabled list and the concatenated bundle."""
    store = builder.out / "usr/share/ca-certificates"
    names = sorted(p.relative_to(store).as_posix() for p in store.rglob("*.crt"))
    bundle = b""
    for name in names:
        pem = (store / name).read_bytes()
        bundle += pem if pem.endswith(b"\n") else pem + b"\n"
    conf = "# Written at image build time: every certificate shipped by ca-certificates is enabled.\n"
    return (conf + "".join(f"{n}\n" for n in names)).encode(), bundle


def _configure(builder: RootfsBuilder) -> None:
    """Do what the image needs from the maintainer scripts that were not run."""
    if not builder.has("etc/os-release"):
        raise DebError("no package provides etc/os-release: base-files must be among the locked packages")
    # base-passwd's postinst: the account databases.
    passwd, group = _accounts()
    builder.add_file("etc/passwd", passwd, "accounts")
    builder.add_file("etc/group", group, "accounts")
    home = PurePosixPath("home", RUNTIME_USER)
    builder.entries[home] = _Entry("dir", "(accounts)", uid=RUNTIME_UID, gid=RUNTIME_GID)
    # libc-bin's postinst: the default name service switch.
    if builder.has("usr/share/libc-bin/nsswitch.conf") and not builder.has("etc/nsswitch.conf"):
        content = (builder.out / "usr/share/libc-bin/nsswitch.conf").read_bytes()
        builder.add_file("etc/nsswitch.conf", content, "nsswitch")
    # tzdata's postinst: UTC as the local time.
    if builder.has("usr/share/zoneinfo/Etc/UTC") and not builder.has("etc/localtime"):
        builder.entries[PurePosixPath("etc/localtime")] = _Entry(
            "link", "(tzdata)", target="/usr/share/zoneinfo/Etc/UTC"
        )
        builder.add_file("etc/timezone", b"Etc/UTC\n", "tzdata")
    # ca-certificates' postinst (update-ca-certificates): the bundle OpenSSL reads.
    if builder.has("usr/share/ca-certificates") and not builder.has("etc/ssl/certs/ca-certificates.crt"):
        conf, bundle = _ca_bundle(builder)
        builder.add_file("etc/ca-certificates.conf", conf, "ca-certificates")
        builder.add_file("etc/ssl/certs/ca-certificates.crt", bundle, "ca-certificates")
    # dpkg's database, for scanners and SBOM tools.
    packages = sorted(builder.packages, key=lambda p: p.info_name)
    status = "\n".join(_status_paragraph(p) for p in packages)
    builder.add_file("var/lib/dpkg/status", status.encode(), "dpkg status")
    # Database format 1: info files of Multi-Arch: same packages are named pkg:arch.*, as dpkg writes them.
    builder.add_file("var/lib/dpkg/info/format", b"1\n", "dpkg info")
    for pkg in packages:
        listing = "/.\n" + "".join(f"{path}\n" for path in pkg.listed)
        builder.add_file(f"var/lib/dpkg/info/{pkg.info_name}.list", listing.encode(), "dpkg info")
        if pkg.md5sums:
            builder.add_file(f"var/lib/dpkg/info/{pkg.info_name}.md5sums", pkg.md5sums, "dpkg info")


# The image interpreter's standard library; its bytecode is what python3.11's postinst would write.
STDLIB = f"usr/lib/python{PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}"


def _compile_stdlib(builder: RootfsBuilder) -> int:
    """Byte-compile the standard library's sources (py3compile's job); return the number of pycs."""
    root = PurePosixPath(STDLIB)
    sources = sorted(
        path.relative_to(root).as_posix()
        for path, entry in builder.entries.items()
        if entry.kind == "file" and path.suffix == ".py" and root in path.parents
    )
    if not sources:
        return 0
    site = builder.out / STDLIB
    try:
        written = compile_tree(site, f"/{STDLIB}", sources, len(os.sched_getaffinity(0)))
    except BytecodeError as error:
        raise DebError(f"bytecode of {STDLIB}: {error}") from error
    for _, pyc in written:
        builder.add_file(f"{STDLIB}/{pyc}", (site / pyc).read_bytes(), "bytecode")
    return len(written)


def check_against_lock(debs: list[Path], lock: Path) -> dict[str, dict[str, object]]:
    """Match every .deb to its lock entry by filename and sha256; return filename -> entry."""
    try:
        entries = {e["filename"]: e for e in json.loads(lock.read_text())["packages"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DebError(f"{lock}: cannot read the lock's packages: {exc}") from exc
    given = {deb.name: deb for deb in debs}
    if len(given) != len(debs):
        raise DebError(f"{lock}: two .debs share a filename among {sorted(d.name for d in debs)}")
    missing = sorted(set(entries) - set(given))
    extra = sorted(set(given) - set(entries))
    if missing or extra:
        raise DebError(
            f"{lock}: expected exactly the locked .debs; "
            f"missing {missing or 'none'}, unlocked {extra or 'none'}"
        )
    for name, deb in sorted(given.items()):
        actual = sha256_file(deb)
        if actual != entries[name]["sha256"]:
            raise DebError(
                f"{deb}: sha256 mismatch: expected {entries[name]['sha256']} ({lock}), actual {actual}"
            )
    return entries


def build_rootfs(
    debs: list[Path], lock: Path, out: Path, links: Path, dirs: Path, exclude: str = "slim"
) -> int:
    """Unpack ``debs`` (exactly the packages of ``lock``) into ``out``; return the number of packages."""
    entries = check_against_lock(debs, lock)
    builder = RootfsBuilder(out, exclude)
    loaded = []
    for deb in debs:
        members = read_ar(deb.read_bytes(), str(deb))
        pkg = read_control(deb, members)
        locked = entries[deb.name]
        for key, field_name in (
            ("package", "Package"),
            ("version", "Version"),
            ("architecture", "Architecture"),
        ):
            if pkg.fields[field_name] != locked[key]:
                raise DebError(
                    f"{deb}: control {field_name}: expected {locked[key]!r} ({lock}), "
                    f"actual {pkg.fields[field_name]!r}"
                )
        loaded.append((pkg.name, pkg, members))
    for _, pkg, members in sorted(loaded, key=lambda item: item[0]):
        builder.add_package(pkg, members)
    _configure(builder)
    _compile_stdlib(builder)
    builder.check_and_complete()
    builder.write_metadata(links, dirs)
    return len(loaded)
