"""Where a locked .deb is downloaded from: the base URL of its archive joined to its locked path.

A Debian lock names each file's archive (``debian``, ``debian-security``) and its path in it
(``pool/main/...``), never a host. The build machine says where each archive is, as pip's index URL is
taken for the wheels (``sparkseal.fetch.index``):

1. ``$SPARKSEAL_DEBIAN_ARCHIVES``: ``NAME=URL`` pairs separated by spaces or commas, e.g.
   ``debian=https://MIRROR/debian debian-security=https://MIRROR/debian-security``, or a snapshot of
   both. A URL may carry credentials (``https://user:token@host/...``): they are handed to Bazel's
   downloader beside the URL (``sparkseal.fetch.credentials``), never printed.
2. Otherwise the machine's own apt sources, read as text only (apt is never run, no Release file or
   keyring is needed, and the suites they list do not matter): a ``deb`` source whose URI's last path
   segment is an archive's name (``.../debian``) is that archive's base. Any Debian release's sources
   name the mirror that also carries bookworm's pool.
3. An archive still without a base is the sibling of another archive of the same lock that has one
   (``.../debian`` gives ``.../debian-security``), the layout of Debian's mirrors and of its snapshot
   archive.

Anything else (an Ubuntu host, a mirror with another layout) sets the variable; the error says so.

A mirror keeps a file only while a suite lists its version, so each file has a second URL: Debian's
snapshot archive at the file's locked time stamp (``sparkseal.fetch.debian_snapshot``). Its base URL is
``$SPARKSEAL_DEBIAN_SNAPSHOT``, else the first snapshot URL (``<base>/archive/<archive>/<time stamp>``)
the apt sources name, as a source's URI or as a comment line of its own (Debian's container images write
the snapshot of each source above its URI); with neither, a file has the mirror's URL alone.

Bazel's downloader then fetches the first URL that serves the file, verifies the locked sha256, and
applies ``--experimental_downloader_config`` rewrites (mirrors, blocks) as it does for every other download.

Standard library only: repository rules run ``python3 -m sparkseal.fetch.debian_archive urls --lock LOCK``
with the host ``python3``; it prints ``package<TAB>mirror URL<TAB>snapshot URL`` lines (the last field
empty without a snapshot base). ``snapshot-base`` prints the snapshot base URL (``.ci/setup-sid`` takes
the sid root from it).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from sparkseal.core.credentials import redact
from sparkseal.core.locks import ARCHIVE_NAME, DebianPackage, LockError, read_debian_lock
from sparkseal.fetch.debian_snapshot import SNAPSHOT_ENV, SnapshotError, base_of, parse_base, snapshot_url

ARCHIVES_ENV = "SPARKSEAL_DEBIAN_ARCHIVES"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
_URL = re.compile(r"^(https?|file)://\S+$")


class ArchiveError(Exception):
    """No base URL is known for an archive a lock names, or the configuration is malformed."""


def parse_archives(value: str, where: str = f"${ARCHIVES_ENV}") -> dict[str, str]:
    """``NAME=URL`` pairs (spaces or commas between them) -> {name: base URL without a trailing slash}."""
    found: dict[str, str] = {}
    for item in re.split(r"[\s,]+", value.strip()):
        if not item:
            continue
        name, sep, url = item.partition("=")
        if not sep or not ARCHIVE_NAME.fullmatch(name) or not _URL.match(url):
            raise ArchiveError(
                f"{where}: expected NAME=URL (an archive name such as debian, then an http(s):// or "
                f"file:// URL), actual {redact(item)!r}"
            )
        if name in found:
            raise ArchiveError(f"{where}: archive {name} is named twice")
        found[name] = url.rstrip("/")
    return found


def _one_line_uris(text: str) -> list[str]:
    """The URIs of ``deb`` lines of a one-line-style sources file."""
    uris = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        rest = words[1:]
        if rest and rest[0].startswith("["):
            while rest and not rest[0].endswith("]"):
                rest = rest[1:]
            rest = rest[1:]
        if rest:
            uris.append(rest[0])
    return uris


def _deb822_uris(text: str) -> list[str]:
    """The URIs of enabled ``deb`` stanzas of a deb822 ``.sources`` file."""
    uris = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace() and key is not None:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
            uris += fields.get("uris", "").split()
    return uris


def _source_texts(paths: Iterable[Path]) -> list[tuple[Path, str]]:
    """The readable apt sources files, in apt's own order (sources.list, then sources.list.d by name)."""
    texts = []
    for path in paths:
        files = sorted(path.iterdir()) if path.is_dir() else [path]
        for file in files:
            if not file.is_file():
                continue
            if file.suffix != ".sources" and file.suffix != ".list" and file.name != "sources.list":
                continue
            try:
                texts.append((file, file.read_text()))
            except (OSError, UnicodeDecodeError):
                continue
    return texts


def _source_uris(paths: Iterable[Path]) -> list[str]:
    uris: list[str] = []
    for file, text in _source_texts(paths):
        uris += _deb822_uris(text) if file.suffix == ".sources" else _one_line_uris(text)
    return uris


def host_archives(paths: Iterable[Path] = APT_SOURCES) -> dict[str, str]:
    """{archive name: base URL} from the machine's apt sources: each ``deb`` URI named by its last segment.

    Only the text is read; the first source of a name wins, in apt's own order (sources.list, then the
    files of sources.list.d by name).
    """
    uris = _source_uris(paths)
    found: dict[str, str] = {}
    for uri in uris:
        base = uri.rstrip("/")
        name = base.rsplit("/", 1)[-1]
        if _URL.match(base) and ARCHIVE_NAME.fullmatch(name):
            found.setdefault(name, base)
    return found


def archive_bases(
    needed: Iterable[str], environ: Mapping[str, str] | None = None, paths: Iterable[Path] = APT_SOURCES
) -> dict[str, str]:
    """{archive: base URL} for every archive in ``needed``: the variable, the apt sources, a sibling."""
    env = os.environ if environ is None else environ
    configured = parse_archives(env.get(ARCHIVES_ENV, ""))
    host = host_archives(paths)
    bases = {}
    names = sorted(set(needed))
    known = {name: configured.get(name) or host.get(name) for name in names}
    for name in names:
        base = known[name]
        if base is None:
            # Only from another archive of the same lock: an Ubuntu mirror's sibling is no Debian archive.
            sibling = next((url for _, url in sorted(known.items()) if url is not None), None)
            if sibling is not None:
                base = sibling.rsplit("/", 1)[0] + "/" + name
        if base is None:
            raise ArchiveError(
                f"no base URL for the Debian archive {name!r}: set {ARCHIVES_ENV} (e.g. "
                f"'{name}=https://MIRROR/{name}', or a snapshot of it), or list a Debian mirror in the apt "
                "sources of this machine; expected a URL whose pool/ holds the locked .debs, actual: none in "
                f"${ARCHIVES_ENV} or {', '.join(map(str, APT_SOURCES))}"
            )
        bases[name] = base
    return bases


def host_snapshot(paths: Iterable[Path] = APT_SOURCES) -> str | None:
    """The snapshot archive's base URL from the first snapshot URL of the apt sources: a source's URI,
    or a comment line that is a URL and nothing else."""
    candidates = _source_uris(paths)
    for _, text in _source_texts(paths):
        for line in text.splitlines():
            words = line.lstrip("#").split() if line.lstrip().startswith("#") else []
            if len(words) == 1:
                candidates.append(words[0])
    return next((base for base in map(base_of, candidates) if base is not None), None)


def snapshot_base(
    environ: Mapping[str, str] | None = None, paths: Iterable[Path] = APT_SOURCES
) -> str | None:
    """The snapshot archive's base URL: ``$SPARKSEAL_DEBIAN_SNAPSHOT``, else the apt sources', else None."""
    env = os.environ if environ is None else environ
    value = env.get(SNAPSHOT_ENV, "").strip()
    if value:
        try:
            return parse_base(value)
        except SnapshotError as exc:
            raise ArchiveError(str(exc)) from exc
    return host_snapshot(paths)


def deb_url(base: str, deb: DebianPackage) -> str:
    """The download URL of a locked .deb under its archive's base URL."""
    return f"{base.rstrip('/')}/{deb.path}"


def locked_urls(
    lock: Path,
    packages: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    paths: Iterable[Path] = APT_SOURCES,
) -> dict[str, list[str]]:
    """Package -> download URLs for the named locked ``packages`` (all of them when empty): the mirror's,
    then the snapshot archive's at the locked time stamp when a snapshot base is known."""
    debs = read_debian_lock(lock).packages
    by_name = {deb.package: deb for deb in debs}
    wanted_names = sorted(set(packages))
    unknown = [name for name in wanted_names if name not in by_name]
    if unknown:
        raise ArchiveError(f"{lock}: no locked package named {', '.join(unknown)}")
    wanted = [by_name[name] for name in wanted_names] if wanted_names else debs
    bases = archive_bases({deb.archive for deb in debs}, environ, paths)
    snapshot = snapshot_base(environ, paths)
    return {
        deb.package: [deb_url(bases[deb.archive], deb)]
        + ([snapshot_url(snapshot, deb.archive, deb.snapshot, deb.path)] if snapshot else [])
        for deb in wanted
    }


def main(argv: list[str] | None = None) -> int:
    """``urls`` for repository rules: print ``package<TAB>mirror URL<TAB>snapshot URL`` lines;
    ``snapshot-base``: print the snapshot base URL (exit 1 without one). Exit 1 with one message on
    failure."""
    parser = argparse.ArgumentParser(prog="python3 -m sparkseal.fetch.debian_archive")
    commands = parser.add_subparsers(dest="command", required=True)
    urls = commands.add_parser("urls", help="print the download URL of locked packages")
    urls.add_argument("--lock", type=Path, required=True, help="a Debian lock (bookworm_<arch>.lock.json)")
    urls.add_argument("packages", nargs="*", help="locked package names (default: all)")
    commands.add_parser("snapshot-base", help="print the snapshot archive's base URL")
    args = parser.parse_args(argv)
    try:
        if args.command == "snapshot-base":
            base = snapshot_base()
            if base is None:
                raise ArchiveError(
                    f"no base URL of the snapshot archive: expected ${SNAPSHOT_ENV}, or a URL <base>/archive/"
                    f"<archive>/<time stamp> in {', '.join(map(str, APT_SOURCES))}, actual: none"
                )
            print(base)
            return 0
        resolved = locked_urls(args.lock, args.packages)
    except (ArchiveError, LockError) as exc:
        print(f"sparkseal: {exc}", file=sys.stderr)
        return 1
    for package, found in sorted(resolved.items()):
        print("\t".join([package, *found, *([""] if len(found) == 1 else [])]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
