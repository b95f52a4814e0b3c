"""The one Starlark reader of sparkseal's locks: one versioned schema per lock kind, checked in one place.

The twin of `sparkseal/core/locks.py`: the same kinds, formats, fields and error texts, so that a field
means one thing in a repository rule and in an action (tests/bazel/test_locks.py feeds every lock of
`third_party/` to both readers and compares what they return). Each reader takes the lock's text and
`where` (the lock's label, as `label_string` prints it) and returns a struct; a lock that breaks its schema
fails with `sparkseal: <where>: field <field>: expected <expected>, actual <actual>`, and a `format` it does
not know fails naming the format it reads and the command that rewrites the lock.

Kinds (`LOCK_FORMATS`):

- `vllm` (`third_party/vllm/vllm.lock.json`): `struct(format, name, version, commit, sdist, wheels)`,
  `sdist` a `struct(filename, sha256)`, `wheels` platform -> `struct(filename, sha256)`, one per platform;
- `wheels` (`third_party/{cuda,scan,zstd}/*.lock.json`): `struct(format, wheels)`, project ->
  `struct(version, files)`, `files` platform (`any` for pure Python) -> `struct(filename, sha256)`;
- `python` (`third_party/python/*.files.json`, the sidecars of the pip-tools format requirements files
  that `python_lock.bzl` parses): `struct(format, platform, requirements, wheels)`, project ->
  `struct(version, filename, sha256)`;
- `debian` (`third_party/{debian,toolchains}/*.lock.json`): `struct(format, architecture, suite, roots,
  packages)`, each package a `struct(package, version, architecture, filename, sha256, size, archive,
  path, snapshot)`, each named once.

A locked sha256's form is checked here only (`check_sha256`, `is_sha256`); the file itself is checked by
Bazel's downloader, which every repository rule hands the locked sha256 (rules/private/pypi_download.bzl).
"""

load(":platforms.bzl", "DEBIAN_ARCHITECTURES", "PLATFORMS")

# The format each kind is written in now (sparkseal.core.locks.FORMATS); the reader takes only this one.
LOCK_FORMATS = {"vllm": 1, "wheels": 1, "python": 1, "debian": 3}

# What each kind is and which command rewrites it (sparkseal.core.locks.DESCRIPTIONS).
LOCK_DESCRIPTIONS = {
    "vllm": "a vLLM lock, written by `sparkseal lock vllm`",
    "wheels": "a lock of tool wheels per platform, written by `python3 -m sparkseal.fetch.lock_wheels`",
    "python": "a wheel sidecar of a requirements file, written by `sparkseal lock python`",
    "debian": "a Debian lock, each package with its archive, path and snapshot time stamp; " +
              "`sparkseal lock debian --keep-versions` rewrites an older one",
}

# Platforms a wheel may be locked for: a platform of the build, or any (a pure-Python wheel).
WHEEL_PLATFORMS = ["any"] + sorted(PLATFORMS)

_ARCHITECTURES = sorted(DEBIAN_ARCHITECTURES.values())
_HEX = "0123456789abcdef"
_DIGITS = "0123456789"
_ARCHIVE_FIRST = "abcdefghijklmnopqrstuvwxyz0123456789"
COMMIT_EXPECTED = "7 to 40 lowercase hex digits (a commit, full or abbreviated)"

def _shown(value):
    """A value as an error shows it: JSON for a scalar, the kind of a container (as the Python reader)."""
    kind = type(value)
    if kind == "dict":
        return "an object" if value else "an empty object"
    if kind == "list":
        return "a list" if value else "an empty list"
    return json.encode(value)

def _fail(where, field, expected, shown):
    fail("sparkseal: %s: field `%s`: expected %s, actual %s" % (where, field, expected, shown))

def _join(field, key):
    return "%s.%s" % (field, key) if field else key

def _actual(parent, key):
    return _shown(parent[key]) if key in parent else "nothing"

def _object(parent, key, where, field = ""):
    value = parent.get(key)
    if type(value) != "dict":
        _fail(where, _join(field, key), "an object", _actual(parent, key))
    return value

def _list(parent, key, where, field = ""):
    value = parent.get(key)
    if type(value) != "list":
        _fail(where, _join(field, key), "a list", _actual(parent, key))
    return value

def _string(parent, key, where, field = ""):
    value = parent.get(key)
    if type(value) != "string" or not value:
        _fail(where, _join(field, key), "a non-empty string", _actual(parent, key))
    return value

def _filename(parent, key, where, field, suffix):
    value = parent.get(key)
    if type(value) != "string" or "/" in value or len(value) <= len(suffix) or not value.endswith(suffix):
        _fail(where, _join(field, key), "a %s file name without '/'" % suffix, _actual(parent, key))
    return value

def _one_of(value, choices, where, field):
    if value not in choices:
        _fail(where, field, "one of %s" % ", ".join(choices), _shown(value))
    return value

def _only(chars, value):
    return not [c for c in value.elems() if c not in chars]

def is_sha256(value):
    """Whether `value` is a sha256 as every lock writes it: 64 lowercase hex digits."""
    return type(value) == "string" and len(value) == 64 and _only(_HEX, value)

def check_sha256(value, where, field):
    """`value`, a locked sha256; fails naming `where` and `field` unless it is 64 lowercase hex digits.

    The one check of a sha256's form in Starlark: every reader here, the requirements parser of
    python_lock.bzl and download_locked_file call it (or `is_sha256`)."""
    if not is_sha256(value):
        _fail(where, field, "64 lowercase hex digits", _shown(value))
    return value

def _file(entry, where, field, suffix):
    filename = _filename(entry, "filename", where, field, suffix)
    if not is_sha256(entry.get("sha256")):
        _fail(where, _join(field, "sha256"), "64 lowercase hex digits", _actual(entry, "sha256"))
    return struct(filename = filename, sha256 = entry["sha256"])

def _format(document, where, kind):
    if type(document) != "dict":
        fail("sparkseal: %s: expected a JSON object (%s), actual %s" % (where, LOCK_DESCRIPTIONS[kind], _shown(document)))
    found = document.get("format")
    if type(found) != "int" or found != LOCK_FORMATS[kind]:
        _fail(where, "format", "%d (%s)" % (LOCK_FORMATS[kind], LOCK_DESCRIPTIONS[kind]), _actual(document, "format"))
    return found

def _is_timestamp(value):
    """Whether `value` is a snapshot time stamp, YYYYMMDDTHHMMSSZ (sparkseal.fetch.debian_snapshot)."""
    if len(value) != 16 or value[8] != "T" or value[15] != "Z":
        return False
    return _only(_DIGITS, value[:8] + value[9:15])

def _is_archive_name(value):
    """Whether `value` names a Debian archive: `[a-z0-9][a-z0-9.+_-]*` (a Release file's Label, lower-cased)."""
    return value[0] in _ARCHIVE_FIRST.elems() and _only(_ARCHIVE_FIRST + ".+_-", value)

def _pool_path(value, filename):
    """Whether `value` is a clean relative path (no empty, `.` or `..` part) ending in `filename`."""
    parts = value.split("/")
    return parts[-1] == filename and not [part for part in parts if part in ["", ".", ".."]]

def parse_vllm_lock(text, where):
    """A `vllm` lock (JSON `text`, read from `where`): a wheel for every platform."""
    document = json.decode(text)
    version = _format(document, where, "vllm")
    commit = _string(document, "commit", where)
    if len(commit) < 7 or len(commit) > 40 or not _only(_HEX, commit):
        _fail(where, "commit", COMMIT_EXPECTED, _shown(commit))
    wheels = _object(document, "wheels", where)
    for platform in sorted(wheels):
        _one_of(platform, sorted(PLATFORMS), where, "wheels." + platform)
    return struct(
        format = version,
        name = _string(document, "name", where),
        version = _string(document, "version", where),
        commit = commit,
        sdist = _file(_object(document, "sdist", where), where, "sdist", ".tar.gz"),
        wheels = {
            platform: _file(_object(wheels, platform, where, "wheels"), where, "wheels." + platform, ".whl")
            for platform in sorted(PLATFORMS)
        },
    )

def parse_wheels_lock(text, where):
    """A `wheels` lock (JSON `text`, read from `where`): every project with its version and its wheels."""
    document = json.decode(text)
    version = _format(document, where, "wheels")
    wheels = _object(document, "wheels", where)
    found = {}
    for project in sorted(wheels):
        field = "wheels." + project
        entry = _object(wheels, project, where, "wheels")
        files = _object(entry, "files", where, field)
        if not files:
            _fail(where, field + ".files", "an object with a wheel per platform", _shown(files))
        for platform in sorted(files):
            _one_of(platform, WHEEL_PLATFORMS, where, "%s.files.%s" % (field, platform))
        found[project] = struct(
            version = _string(entry, "version", where, field),
            files = {
                platform: _file(_object(files, platform, where, field + ".files"), where, "%s.files.%s" % (field, platform), ".whl")
                for platform in sorted(files)
            },
        )
    return struct(format = version, wheels = found)

def locked_wheel(lock, project, platform, where):
    """The wheel of `project` for `platform` in a parsed `wheels` lock: struct(version, filename, sha256);
    fails naming the field the lock lacks."""
    field = "wheels." + project
    if project not in lock.wheels:
        _fail(where, field, "an object", "nothing")
    files = lock.wheels[project].files
    if platform not in files:
        _fail(where, "%s.files.%s" % (field, platform), "an object", "nothing")
    return struct(
        version = lock.wheels[project].version,
        filename = files[platform].filename,
        sha256 = files[platform].sha256,
    )

def parse_python_lock(text, where):
    """A `python` lock (a requirements file's sidecar; JSON `text`, read from `where`)."""
    document = json.decode(text)
    version = _format(document, where, "python")
    platform = _one_of(_string(document, "platform", where), WHEEL_PLATFORMS, where, "platform")
    requirements = _filename(document, "requirements", where, "", ".txt")
    wheels = _object(document, "wheels", where)
    found = {}
    for project in sorted(wheels):
        field = "wheels." + project
        entry = _object(wheels, project, where, "wheels")
        file = _file(entry, where, field, ".whl")
        found[project] = struct(
            version = _string(entry, "version", where, field),
            filename = file.filename,
            sha256 = file.sha256,
        )
    return struct(format = version, platform = platform, requirements = requirements, wheels = found)

def parse_debian_lock(text, where):
    """A `debian` lock (JSON `text`, read from `where`): each package named once."""
    document = json.decode(text)
    version = _format(document, where, "debian")
    architecture = _one_of(_string(document, "architecture", where), _ARCHITECTURES, where, "architecture")
    suite = _string(document, "suite", where)
    roots = _list(document, "roots", where)
    for index, root in enumerate(roots):
        if type(root) != "string" or not root:
            _fail(where, "roots[%d]" % index, "a non-empty string", _shown(root))
    entries = _list(document, "packages", where)
    if not entries:
        _fail(where, "packages", "a non-empty list", _shown(entries))
    packages = []
    seen = {}
    for index, entry in enumerate(entries):
        field = "packages[%d]" % index
        if type(entry) != "dict":
            _fail(where, field, "an object", _shown(entry))
        package = _string(entry, "package", where, field)
        if package in seen:
            _fail(where, field + ".package", "a package not listed before", _shown(package))
        seen[package] = True
        file = _file(entry, where, field, ".deb")
        size = entry.get("size")
        if type(size) != "int" or size < 0:
            _fail(where, field + ".size", "a whole number of bytes", _actual(entry, "size"))
        archive = _string(entry, "archive", where, field)
        if not _is_archive_name(archive):
            _fail(where, field + ".archive", "an archive name ([a-z0-9][a-z0-9.+_-]*)", _shown(archive))
        path = _string(entry, "path", where, field)
        if not _pool_path(path, file.filename):
            expected = "a relative path without '.', '..' or empty parts, ending in %s" % file.filename
            _fail(where, field + ".path", expected, _shown(path))
        snapshot = _string(entry, "snapshot", where, field)
        if not _is_timestamp(snapshot):
            _fail(where, field + ".snapshot", "a time stamp YYYYMMDDTHHMMSSZ", _shown(snapshot))
        packages.append(struct(
            package = package,
            version = _string(entry, "version", where, field),
            architecture = _string(entry, "architecture", where, field),
            filename = file.filename,
            sha256 = file.sha256,
            size = size,
            archive = archive,
            path = path,
            snapshot = snapshot,
        ))
    return struct(format = version, architecture = architecture, suite = suite, roots = roots, packages = packages)

_PARSERS = {
    "vllm": parse_vllm_lock,
    "wheels": parse_wheels_lock,
    "python": parse_python_lock,
    "debian": parse_debian_lock,
}

def parse_lock(kind, text, where):
    """The lock of `kind` (a key of `LOCK_FORMATS`), read by that kind's reader."""
    if kind not in _PARSERS:
        fail("sparkseal: %s: unknown lock kind %r: expected one of %s" % (where, kind, ", ".join(sorted(_PARSERS))))
    return _PARSERS[kind](text, where)
