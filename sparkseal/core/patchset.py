"""Strict application of our vLLM patch series.

A patch is a header (``Subject:``, ``Upstream:``, ``Reason:``) followed by a git-style unified diff with
``a/`` and ``b/`` prefixes. Application is exact: every hunk must match at the line it names, with all its
context, or the patch fails. There is no fuzz, no offset search, and no reversed application; added lines
must pass ``git diff --check``; patched Python must compile; paths stay inside the ``vllm/`` package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from sparkseal.core.paths import UnsafePath, check_relative, resolve_inside

REQUIRED_HEADERS = ("Subject", "Upstream", "Reason")

# vLLM's compiled extensions come from the upstream wheel of the locked release; a patch to the sources
# they are built from would silently not reach the binaries, so it is refused outright.
COMPILED_TOP_LEVEL = ("csrc", "cmake", "CMakeLists.txt", "setup.py")
COMPILED_SUFFIXES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp")
PACKAGE_ROOT = "vllm"

_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_UNSUPPORTED_GIT_HEADERS = {
    b"rename from": "renames",
    b"rename to": "renames",
    b"copy from": "copies",
    b"copy to": "copies",
    b"old mode": "mode changes",
    b"new mode": "mode changes",
    b"GIT binary patch": "binary patches",
    b"Binary files": "binary patches",
}
_NO_NEWLINE = b"\\ No newline at end of file"


class PatchError(Exception):
    """A patch is malformed, unsafe, or does not apply exactly. The message names patch, hunk and file."""


@dataclass
class Hunk:
    """One ``@@`` hunk: its header line, old/new start lines, and (tag, text) lines."""

    number: int
    header: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[tuple[bytes, bytes]] = field(default_factory=list)

    def old_side(self) -> list[bytes]:
        return [text for tag, text in self.lines if tag in (b" ", b"-")]

    def new_side(self) -> list[bytes]:
        return [text for tag, text in self.lines if tag in (b" ", b"+")]


@dataclass
class FilePatch:
    """The hunks for one target file; ``old``/``new`` are None for created/deleted files."""

    old: PurePosixPath | None
    new: PurePosixPath | None
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def target(self) -> PurePosixPath:
        path = self.new or self.old
        assert path is not None
        return path


@dataclass
class Patch:
    """A parsed patch file."""

    path: Path
    headers: dict[str, str]
    files: list[FilePatch]

    @property
    def targets(self) -> list[str]:
        return [str(f.target) for f in self.files]


def read_series(series: Path) -> list[Path]:
    """Return the patch files a quilt-style ``series`` file lists, in order (``#`` starts a comment)."""
    patches: list[Path] = []
    seen: set[str] = set()
    for number, raw in enumerate(series.read_text(encoding="utf-8").splitlines(), start=1):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        where = f"{series}:{number}"
        try:
            rel = check_relative(entry, where)
        except UnsafePath as exc:
            raise PatchError(str(exc)) from exc
        if len(rel.parts) != 1 or not entry.endswith(".patch"):
            raise PatchError(f"{where}: expected a '*.patch' file name beside the series, got {entry!r}")
        if entry in seen:
            raise PatchError(f"{where}: {entry} is listed twice")
        seen.add(entry)
        path = series.parent / entry
        if not path.is_file():
            raise PatchError(f"{where}: {entry} is listed but {path} does not exist")
        patches.append(path)
    return patches


def _parse_headers(lines: list[bytes], where: str) -> tuple[dict[str, str], int]:
    headers: dict[str, str] = {}
    last: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith((b"diff --git ", b"--- ")):
            break
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        if text[:1] in (" ", "\t") and last is not None and text.strip():
            headers[last] += " " + text.strip()
        elif ":" in text and not text.startswith(" "):
            key, value = text.split(":", 1)
            if key in REQUIRED_HEADERS:
                last = key
                headers[key] = value.strip()
            else:
                last = None
        index += 1
    missing = [key for key in REQUIRED_HEADERS if not headers.get(key)]
    if missing:
        raise PatchError(
            f"{where}: header is missing {', '.join(missing)}: every patch starts with "
            f"'Subject:', 'Upstream:' and 'Reason:' lines before the diff"
        )
    return headers, index


def _strip_prefix(raw: bytes, prefix: str, where: str) -> PurePosixPath | None:
    text = raw.decode("utf-8", "replace").rstrip("\r\n").split("\t", 1)[0]
    if text == "/dev/null":
        return None
    if not text.startswith(prefix):
        raise PatchError(f"{where}: path {text!r} lacks the '{prefix}' prefix (patches use -p1 paths)")
    try:
        rel = check_relative(text[len(prefix) :], where)
    except UnsafePath as exc:
        raise PatchError(str(exc)) from exc
    _check_scope(rel, where)
    return rel


def _check_scope(rel: PurePosixPath, where: str) -> None:
    if rel.parts[0] in COMPILED_TOP_LEVEL or rel.suffix in COMPILED_SUFFIXES:
        raise PatchError(
            f"{where}: {rel} is a compiled source of vLLM; a source build of vLLM is not supported "
            f"(compiled extensions come from the upstream wheel), so patches may only change Python "
            f"files under {PACKAGE_ROOT}/"
        )
    if rel.parts[0] != PACKAGE_ROOT or len(rel.parts) < 2:
        raise PatchError(f"{where}: {rel} is outside the {PACKAGE_ROOT}/ package; patches may only touch it")


def read_headers(data: bytes, where: str) -> dict[str, str]:
    """The ``Subject``, ``Upstream`` and ``Reason`` of one patch's text, its diff left unchecked: what an
    SBOM records of each patch of the series (the patch actions check the rest)."""
    return _parse_headers(data.splitlines(keepends=True), where)[0]


def parse_patch(path: Path) -> Patch:
    """Parse and check the structure of one patch file (no tree needed)."""
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    headers, index = _parse_headers(lines, str(path))
    files: list[FilePatch] = []
    current: FilePatch | None = None
    hunk_number = 0
    while index < len(lines):
        line = lines[index]
        where = f"{path}:{index + 1}"
        if line.startswith(b"diff --git "):
            current = None
        elif line.startswith((b"new file mode ", b"deleted file mode ")):
            mode = line.split()[-1]
            if mode == b"120000":
                raise PatchError(f"{where}: the patch creates or deletes a symlink; symlinks are not allowed")
        elif any(line.startswith(key) for key in _UNSUPPORTED_GIT_HEADERS):
            what = next(v for k, v in _UNSUPPORTED_GIT_HEADERS.items() if line.startswith(k))
            raise PatchError(f"{where}: {what} are not supported; express the change as a text diff")
        elif line.startswith(b"--- "):
            if index + 1 >= len(lines) or not lines[index + 1].startswith(b"+++ "):
                raise PatchError(f"{where}: '---' line not followed by a '+++' line")
            old = _strip_prefix(line[4:], "a/", where)
            new = _strip_prefix(lines[index + 1][4:], "b/", f"{path}:{index + 2}")
            if old is None and new is None:
                raise PatchError(f"{where}: both sides are /dev/null")
            if old is not None and new is not None and old != new:
                raise PatchError(f"{where}: renames are not supported ({old} -> {new})")
            current = FilePatch(old=old, new=new)
            files.append(current)
            hunk_number = 0
            index += 1
        elif line.startswith(b"@@"):
            if current is None:
                raise PatchError(f"{where}: hunk before any '---'/'+++' file header")
            hunk_number += 1
            index = _parse_hunk(lines, index, current, hunk_number, path)
            continue
        elif line.strip() and current is not None and not line.startswith(b"index "):
            raise PatchError(f"{where}: unexpected line in diff: {line[:60]!r}")
        index += 1
    if not files:
        raise PatchError(f"{path}: contains no file diffs")
    targets = [str(f.target) for f in files]
    duplicated = sorted({t for t in targets if targets.count(t) > 1})
    if duplicated:
        raise PatchError(f"{path}: {duplicated[0]} appears in more than one file section")
    for fp in files:
        if not fp.hunks:
            raise PatchError(f"{path}: file section for {fp.target} has no hunks")
    return Patch(path=path, headers=headers, files=files)


def _parse_hunk(lines: list[bytes], index: int, fp: FilePatch, number: int, path: Path) -> int:
    header = lines[index].rstrip(b"\r\n")
    match = _HUNK_RE.match(header)
    where = f"{path}: hunk #{number} of {fp.target}"
    if not match:
        raise PatchError(f"{where}: malformed hunk header {header.decode('utf-8', 'replace')!r}")
    old_start, old_count, new_start, new_count = (int(g) if g is not None else 1 for g in match.groups())
    hunk = Hunk(number, header.decode("utf-8", "replace"), old_start, old_count, new_start, new_count)
    index += 1
    old_seen = new_seen = 0
    while index < len(lines):
        line = lines[index]
        if line.rstrip(b"\r\n") == _NO_NEWLINE:
            # The line before the marker has no newline at the end of its file (old or new side).
            if not hunk.lines:
                raise PatchError(f"{where} ({hunk.header}): '{_NO_NEWLINE.decode()}' before any line")
            tag, text = hunk.lines[-1]
            hunk.lines[-1] = (tag, text[:-1] if text.endswith(b"\n") else text)
            index += 1
            continue
        if old_seen >= old_count and new_seen >= new_count:
            break
        tag, text = line[:1], line[1:]
        if tag not in (b" ", b"-", b"+"):
            if line in (b"\n", b"\r\n"):
                # Some editors drop the single space of an empty context line.
                tag, text = b" ", line
            else:
                break
        hunk.lines.append((tag, text))
        old_seen += tag in (b" ", b"-")
        new_seen += tag in (b" ", b"+")
        index += 1
    if (old_seen, new_seen) != (old_count, new_count):
        raise PatchError(
            f"{where} ({hunk.header}): malformed hunk: header promises {old_count} old / {new_count} new "
            f"lines, body has {old_seen} / {new_seen}"
        )
    fp.hunks.append(hunk)
    return index


def _whitespace_errors(text: bytes, is_last_of_file: bool) -> list[str]:
    errors: list[str] = []
    body = text.rstrip(b"\n")
    if body.endswith(b"\r"):
        errors.append("CRLF line ending")
        body = body[:-1]
    if body != body.rstrip(b" \t"):
        errors.append("trailing whitespace")
    indent = body[: len(body) - len(body.lstrip(b" \t"))]
    if b" \t" in indent:
        errors.append("space before tab in indent")
    if is_last_of_file and not body.strip():
        errors.append("new blank line at EOF")
    return errors


def _show(line: bytes) -> str:
    text = line.decode("utf-8", "replace")
    # Show a missing final newline, which is otherwise invisible in the message.
    return repr(text[:-1]) if text.endswith("\n") else repr(text) + " (no newline at end of file)"


def _apply_file(fp: FilePatch, original: list[bytes], patch_path: Path) -> tuple[list[bytes], list[bool]]:
    """Apply the hunks of one file exactly; return new lines and, per line, whether the patch added it."""
    result: list[bytes] = []
    added: list[bool] = []
    cursor = 0  # index into original
    delta = 0
    for hunk in fp.hunks:
        where = f"{patch_path}: hunk #{hunk.number} ({hunk.header}) of {fp.target}"
        start = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        if hunk.new_start - (1 if hunk.new_count else 0) != start + delta:
            raise PatchError(
                f"{where}: new-side start line {hunk.new_start} is inconsistent with the old side "
                f"(expected {start + delta + (1 if hunk.new_count else 0)})"
            )
        if start < cursor:
            raise PatchError(f"{where}: hunk overlaps or precedes the previous hunk")
        old_side = hunk.old_side()
        found = original[start : start + len(old_side)]
        if found != old_side:
            new_side = hunk.new_side()
            if original[start : start + len(new_side)] == new_side:
                raise PatchError(f"{where}: the change is already present (reversed or applied twice)")
            for offset, (want, got) in enumerate(
                zip(old_side, [*found, *[b""] * len(old_side)], strict=False)
            ):
                if want != got:
                    actual = _show(got) if start + offset < len(original) else "end of file"
                    raise PatchError(
                        f"{where}: does not apply at line {start + offset + 1}: expected {_show(want)}, "
                        f"found {actual} (no fuzz or offset is allowed)"
                    )
        result.extend(original[cursor:start])
        added.extend([False] * (start - cursor))
        for tag, text in hunk.lines:
            if tag != b"-":
                result.append(text)
                added.append(tag == b"+")
        cursor = start + len(old_side)
        delta += hunk.new_count - hunk.old_count
    result.extend(original[cursor:])
    added.extend([False] * (len(original) - cursor))
    return result, added


def apply_patch(tree: Path, patch_path: Path) -> list[str]:
    """Apply one patch to ``tree`` in place and return the relative paths it changed.

    Every check runs before anything is written, so a failing patch leaves the tree untouched.
    """
    patch = parse_patch(patch_path)
    writes: list[tuple[Path, bytes | None]] = []
    for fp in patch.files:
        where = f"{patch_path}: {fp.target}"
        try:
            target = resolve_inside(tree, fp.target, where)
        except UnsafePath as exc:
            raise PatchError(str(exc)) from exc
        if fp.old is None:
            if target.exists():
                raise PatchError(f"{where}: the patch creates this file, but it already exists in the tree")
            original: list[bytes] = []
        elif not target.is_file():
            raise PatchError(f"{where}: the file to patch does not exist in the tree")
        else:
            original = target.read_bytes().splitlines(keepends=True)
        new_lines, added = _apply_file(fp, original, patch_path)
        for number, (text, is_added) in enumerate(zip(new_lines, added, strict=True), start=1):
            if not is_added:
                continue
            problems = _whitespace_errors(text, number == len(new_lines))
            if problems:
                raise PatchError(
                    f"{patch_path}: {fp.target}:{number}: {', '.join(problems)} in added line {_show(text)}"
                )
        if fp.new is None:
            if new_lines:
                raise PatchError(f"{where}: deletion leaves {len(new_lines)} lines behind")
            writes.append((target, None))
            continue
        content = b"".join(new_lines)
        if target.suffix == ".py":
            try:
                compile(content, str(fp.target), "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                line = getattr(exc, "lineno", None)
                raise PatchError(
                    f"{patch_path}: {fp.target}:{line}: patched file does not compile: {exc}"
                ) from exc
        writes.append((target, content))
    for target, content in writes:
        if content is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    return patch.targets
