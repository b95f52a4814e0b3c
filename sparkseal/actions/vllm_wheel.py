"""Action: our vLLM wheel = the upstream wheel's compiled files + the patched, overlaid Python tree.

The upstream wheel of the locked release supplies everything that is not built from the sdist's sources
(``*.so`` and files generated at build time); every file that exists in our tree replaces the wheel's copy,
and files that patches or the overlay added are included. Files present on one side only are reported.
The archive is written deterministically and RECORD is regenerated.

``--split`` also writes the split file (``sparkseal.core.wheel_split``): the members whose bytes differ
from the upstream wheel's. The image installs the upstream wheel minus those in one layer and our wheel's
copies of them in a small layer above it, so that editing a patch rewrites only the small one.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sparkseal.core.commit import CommitMismatch, check_commit, commit_id_from_version_file
from sparkseal.core.determinism import EXEC_MODE, FILE_MODE
from sparkseal.core.digests import record_hash
from sparkseal.core.paths import UnsafePath, check_relative
from sparkseal.core.repo_names import apparent_text
from sparkseal.core.tree import content_mode, list_files
from sparkseal.core.wheel_split import differing_paths, split_document
from sparkseal.core.zipwriter import RawMember, ZipWriter, deflate, read_raw

VERSION_FILE = "vllm/_version.py"
BUILD_RECORD = "sparkseal.json"


class RepackError(Exception):
    """The upstream wheel is unsafe, malformed, or not the locked release."""


def _entry_order(name: str, dist_info: str) -> tuple[int, str]:
    # Wheel readers expect .dist-info last and RECORD as the very last entry (PEP 427 recommends it).
    if name == f"{dist_info}/RECORD":
        return (2, name)
    return (1 if name.startswith(dist_info + "/") else 0, name)


@dataclass
class Member:
    """One file of the wheel: its content, its mode, and its compressed form when copied verbatim."""

    data: bytes
    mode: int
    raw: RawMember | None = None


def write_wheel(path: Path, files: dict[str, Member], dist_info: str) -> None:
    """Write ``files`` plus a fresh RECORD as a deterministic wheel."""
    record_name = f"{dist_info}/RECORD"
    record = io.StringIO()
    # RECORD is CSV (PEP 376): names such as "E=1,N=14336,...json" must be quoted.
    writer = csv.writer(record, lineterminator="\n")
    for name, member in sorted(files.items()):
        writer.writerow([name, record_hash(member.data), len(member.data)])
    writer.writerow([record_name, "", ""])
    entries = dict(files)
    entries[record_name] = Member(record.getvalue().encode("utf-8"), FILE_MODE)
    with path.open("wb") as stream:
        archive = ZipWriter(stream)
        for name in sorted(entries, key=lambda n: _entry_order(n, dist_info)):
            member = entries[name]
            archive.add(name, member.raw or deflate(member.data), member.mode)
        archive.close()


def _dist_info_name(names: list[str], wheel: Path) -> str:
    dirs = sorted({n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")})
    if len(dirs) != 1:
        raise RepackError(f"{wheel}: expected exactly one .dist-info directory, found {dirs}")
    return dirs[0]


def read_upstream(wheel: Path, commit: str) -> tuple[dict[str, Member], str]:
    """Read the upstream wheel (minus RECORD), check its paths and its commit id."""
    files: dict[str, Member] = {}
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise RepackError(f"{wheel}: not a readable wheel: {exc}") from exc
    with archive:
        names = [i.filename for i in archive.infolist() if not i.is_dir()]
        dist_info = _dist_info_name(names, wheel)
        for info in archive.infolist():
            if info.is_dir() or info.filename == f"{dist_info}/RECORD":
                continue
            try:
                check_relative(info.filename, f"{wheel}: entry")
            except UnsafePath as exc:
                raise RepackError(str(exc)) from exc
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                raise RepackError(f"{wheel}: entry {info.filename} is a symlink; symlinks are not allowed")
            mode = EXEC_MODE if (info.external_attr >> 16) & 0o111 else FILE_MODE
            assert archive.fp is not None
            files[info.filename] = Member(archive.read(info), mode, read_raw(archive.fp, info))
    if VERSION_FILE not in files:
        raise RepackError(f"{wheel}: {VERSION_FILE} is missing; cannot check the locked commit")
    where = f"{wheel}: {VERSION_FILE}"
    try:
        check_commit(
            commit_id_from_version_file(files[VERSION_FILE].data.decode("utf-8"), where), commit, where
        )
    except CommitMismatch as exc:
        raise RepackError(str(exc)) from exc
    return files, dist_info


def repack(
    upstream: Path,
    pristine: Path,
    patched: Path,
    commit: str,
    patches: list[Path],
    out: Path,
    split: Path | None = None,
) -> dict[str, object]:
    """Write our wheel to ``out`` (and the split file to ``split``); return the report of differences."""
    files, dist_info = read_upstream(upstream, commit)
    upstream_data = {name: member.data for name, member in files.items()}
    sdist_files = set(list_files(pristine))
    tree_files = list_files(patched)
    added_by_us = sorted(set(tree_files) - sdist_files)
    replaced = [rel for rel in tree_files if rel in files]
    for rel in sdist_files - set(tree_files):
        files.pop(rel, None)  # deleted by a patch
    for rel in tree_files:
        if rel in files or rel in added_by_us:
            # The upstream wheel's mode where it has the file; content decides for our additions.
            mode = files[rel].mode if rel in files else content_mode(patched / rel)
            files[rel] = Member((patched / rel).read_bytes(), mode)
    wheel_py = {n for n in files if n.endswith(".py") and not n.startswith(dist_info + "/")}
    sdist_py = {n for n in sdist_files if n.endswith(".py")}
    upstream_sha256 = hashlib.sha256(upstream.read_bytes()).hexdigest()
    ours = differing_paths(upstream_data, {name: member.data for name, member in files.items()}, dist_info)
    report = {
        "commit": commit,
        "dist_info": dist_info,
        "patches": [{"file": p.name, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in patches],
        "py_in_sdist_not_in_wheel": sorted(sdist_py - wheel_py),
        "py_in_wheel_not_in_sdist": sorted(wheel_py - sdist_py - set(added_by_us)),
        "replaced_from_tree": len(replaced),
        "differ_from_upstream": ours,
        "added_by_patches_or_overlay": added_by_us,
        "upstream_wheel": {
            "file": upstream.name,
            "sha256": upstream_sha256,
        },
    }
    build_record = {
        k: report[k] for k in ("commit", "patches", "added_by_patches_or_overlay", "upstream_wheel")
    }
    files[f"{dist_info}/{BUILD_RECORD}"] = Member(
        (json.dumps(build_record, indent=2, sort_keys=True) + "\n").encode("utf-8"), FILE_MODE
    )
    write_wheel(out, files, dist_info)
    if split is not None:
        project = dist_info.split("-", 1)[0]
        split.write_text(
            split_document(project, dist_info, upstream.name, upstream_sha256, ours), encoding="utf-8"
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", type=Path, required=True, help="upstream wheel of the locked release")
    parser.add_argument("--pristine", type=Path, required=True, help="tree unpacked from the sdist")
    parser.add_argument("--patched", type=Path, required=True, help="patched and overlaid tree")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--patch", action="append", type=Path, default=[])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--split", type=Path, help="also write the split file of the image's vLLM layers")
    args = parser.parse_args(argv)
    try:
        report = repack(
            args.upstream, args.pristine, args.patched, args.commit, args.patch, args.out, args.split
        )
    except (RepackError, ValueError) as exc:
        for written in (args.out, args.split):
            if written is not None:
                written.unlink(missing_ok=True)
        print(f"sparkseal: {apparent_text(str(exc))}", file=sys.stderr)
        return 1
    args.report.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    # Information, not a problem: upstream's build vendors or generates some modules (vllm/third_party,
    # vllm/vllm_flash_attn), and its wheel leaves some sources out; the report lists every file.
    what = {
        "py_in_wheel_not_in_sdist": "modules of the upstream wheel have no source in the sdist "
        "(vendored or generated by upstream's build), kept as upstream ships them",
        "py_in_sdist_not_in_wheel": "modules of the sdist are not in the upstream wheel, left out as "
        "upstream leaves them out",
    }
    for key, meaning in what.items():
        names = report[key]
        assert isinstance(names, list)
        if names:
            places = sorted({"/".join(name.split("/")[:2]) for name in names})
            shown = ", ".join(places[:5]) + (", ..." if len(places) > 5 else "")
            listed = f"({args.report.name} lists them)"
            print(f"sparkseal: {args.out.name}: {len(names)} {meaning}: in {shown} {listed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
