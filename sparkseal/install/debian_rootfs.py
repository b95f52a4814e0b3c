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

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from sparkseal.core.archives import ArchiveError, open_tar
from sparkseal.core.deb import DROP_POLICIES, DebError, DropPolicy, inflated, read_members
from sparkseal.core.determinism import DIR_MODE, FILE_MODE, GID, STICKY_DIR_MODE, UID
from sparkseal.core.locks import DebianPackage, LockError, check_file, read_debian_lock
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


@contextmanager
def member_tar(members: dict[str, bytes], stem: str, where: str) -> Iterator[tarfile.TarFile]:
    """The one ``STEM.tar[.gz|.bz2|.xz]`` member of a .deb (``sparkseal.core.deb``), opened with the bounded
    tar reader every untrusted tar goes through; what it refuses, then or while read, is a DebError."""
    name, tar = inflated(members, stem, where)
    shown = f"{where}: {name}"
    try:
        with open_tar(shown, io.BytesIO(tar), mode="r:") as opened:
            yield opened
    except ArchiveError as exc:
        raise DebError(str(exc)) from exc
    except tarfile.TarError as exc:
        raise DebError(f"{shown}: cannot read: {exc}") from exc


@dataclass(frozen=True)
class DataMember:
    """A member of a package's data tar that an unpacker keeps: its checked path, its header, the place
    messages name, and (of a regular file or a hard link) its bytes."""

    path: PurePosixPath
    info: tarfile.TarInfo
    where: str
    content: bytes | None = None


def data_members(deb: Path, members: dict[str, bytes], policy: DropPolicy) -> Iterator[DataMember]:
    """The members of the data tar of ``deb`` (its ``ar`` ``members``) that ``policy`` keeps, in tar order.

    Both unpackers (this root and ``sparkseal.fetch.toolchain_root``) read a package here: a path that is
    absolute or climbs out with ``..`` is refused, and so is a member that is no directory, regular file,
    hard link or symlink (a device, a FIFO); a hard link's bytes are its target's.
    """
    with member_tar(members, "data", str(deb)) as data:
        for info in data:
            where = f"{deb}: member {info.name!r}"
            if info.name in (".", "./", "/"):
                continue
            try:
                rel = check_relative(info.name, where)
            except UnsafePath as exc:
                raise DebError(str(exc)) from exc
            if policy.drops(rel):
                continue
            if info.isdir() or info.issym():
                yield DataMember(rel, info, where)
            elif info.isfile() or info.islnk():
                source = data.extractfile(info)
                if source is None:
                    raise DebError(f"{where}: cannot read the hard link target {info.linkname!r}")
                yield DataMember(rel, info, where, source.read())
            else:
                raise DebError(f"{where}: only directories, regular files and symlinks are allowed")


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
    with member_tar(members, "control", str(deb)) as control:
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
        self.policy = DROP_POLICIES[exclude]
        self.entries: dict[PurePosixPath, _Entry] = {}
        self.packages: list[_Package] = []

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
        for member in data_members(pkg.deb, members, self.policy):
            self._add_member(pkg, member)
        self.packages.append(pkg)

    def _add_member(self, pkg: _Package, member: DataMember) -> None:
        rel, info, where = member.path, member.info, member.where
        path = canonical(rel)
        if len(rel.parts) == 1 and rel.parts[0] in MERGED_USR:
            if not info.isdir():
                raise DebError(f"{where}: /{rel} must be a directory (it is a link into /usr here)")
            return
        pkg.listed.append(f"/{rel}")
        if info.isdir():
            mode = STICKY_DIR_MODE if info.mode & 0o1000 else DIR_MODE
            self._claim(path, _Entry("dir", pkg.name, mode=mode), where)
        elif info.issym():
            check_link_target(path, info.linkname, where)
            self._claim(path, _Entry("link", pkg.name, target=info.linkname), where)
        else:
            if info.mode & 0o7000:
                raise DebError(
                    f"{where}: mode {info.mode:o} has setuid, setgid or sticky bits (not supported)"
                )
            assert member.content is not None  # a regular file or a hard link
            entry = _Entry("file", pkg.name, digest=hashlib.sha256(member.content).hexdigest())
            if self._claim(path, entry, where):
                self._write(path, member.content, normalised_mode(info.mode))

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


def check_against_lock(debs: list[Path], lock: Path) -> dict[str, DebianPackage]:
    """Match every .deb to its lock entry by filename and sha256; return filename -> entry."""
    try:
        entries = {entry.filename: entry for entry in read_debian_lock(lock).packages}
    except LockError as exc:
        raise DebError(str(exc)) from None
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
        try:
            check_file(deb, entries[name].sha256, str(lock))
        except LockError as exc:
            raise DebError(str(exc)) from None
    return entries


def build_rootfs(
    debs: list[Path], lock: Path, out: Path, links: Path, dirs: Path, exclude: str = "slim"
) -> int:
    """Unpack ``debs`` (exactly the packages of ``lock``) into ``out``; return the number of packages."""
    entries = check_against_lock(debs, lock)
    builder = RootfsBuilder(out, exclude)
    loaded = []
    for deb in debs:
        members = read_members(deb)
        pkg = read_control(deb, members)
        locked = entries[deb.name]
        for field_name, expected in (
            ("Package", locked.package),
            ("Version", locked.version),
            ("Architecture", locked.architecture),
        ):
            if pkg.fields[field_name] != expected:
                raise DebError(
                    f"{deb}: control {field_name}: expected {expected!r} ({lock}), "
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
