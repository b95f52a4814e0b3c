"""`python_lock`: a hub repository for `--hash` requirements locks and their filename sidecars.

WORKSPACE use::

    load("//rules/private:python_lock.bzl", "python_lock")

    python_lock(
        name = "python_deps",
        locks = {
            "//third_party/python:requirements_linux_aarch64.txt": "linux_aarch64",
            "//third_party/python:requirements_linux_x86_64.txt": "linux_x86_64",
        },
        files = {
            "//third_party/python:requirements_linux_aarch64.files.json": "linux_aarch64",
            "//third_party/python:requirements_linux_x86_64.files.json": "linux_x86_64",
        },
    )

    load("@python_deps//:repositories.bzl", "python_deps_repositories")

    python_deps_repositories()

`@<name>//:repositories.bzl` declares one `pypi_file` per locked wheel, named
`<name>_<platform>_<project>` (the project's normalised name with `_` for `-`); each downloads only when a
target needs it. `@<name>//:requirements.bzl` exports, for BUILD files:

- `PLATFORMS`: the platforms of the locks;
- `PINS`: platform -> project -> `{"version", "filename", "label"}`;
- `WHEELS`: platform -> labels of every locked wheel, sorted by project;
- `LAYERS`: wheel layer name -> what it holds (`WHEEL_LAYERS` of rules/private/wheel_layers.bzl);
- `WHEELS_BY_LAYER`: platform -> layer -> labels;
- `layer_of(project)` and `wheel(platform, project)`.

Both files are read and cross-checked when the repository is made: every pin of a lock has exactly the
sidecar's version and one of its `--hash` values is the sidecar's sha256, and the sidecar names no
project that the lock does not pin.
"""

load(":common.bzl", "apparent_repo_name", "label_string")
load(":locks.bzl", "is_sha256", "parse_python_lock")
load(":wheel_layers.bzl", "WHEEL_LAYERS", "layer_of")

def _normalize(name):
    out = name.lower()
    for sep in ["_", "."]:
        out = out.replace(sep, "-")
    for _ in range(len(out)):
        if "--" not in out:
            break
        out = out.replace("--", "-")
    return out

def repo_name(hub, platform, project):
    """The repository of one locked wheel."""
    return "%s_%s_%s" % (hub, platform, _normalize(project).replace("-", "_"))

def parse_requirements(text, where):
    """Parse a `--hash` requirements lock: {project: {"version", "hashes", "line"}}; fail on anything else."""
    pins = {}
    pending = ""
    start = 0
    for number, raw in enumerate(text.split("\n")):
        line = raw.strip()
        if not pending:
            if not line or line.startswith("#"):
                continue
            start = number + 1
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        tokens = [t for t in (pending + line).replace("\t", " ").split(" ") if t]
        pending = ""
        requirement = tokens[0]
        if requirement.count("==") != 1 or ";" in requirement or "[" in requirement:
            fail("sparkseal: %s:%d: expected NAME==VERSION, got %r" % (where, start, requirement))
        name, version = requirement.split("==")
        project = _normalize(name)
        if project in pins:
            fail("sparkseal: %s:%d: %s is pinned twice (first on line %d)" % (where, start, project, pins[project]["line"]))
        hashes = []
        for token in tokens[1:]:
            value = token[len("--hash=sha256:"):] if token.startswith("--hash=sha256:") else None
            if not is_sha256(value):
                fail("sparkseal: %s:%d: expected --hash=sha256:<64 lowercase hex digits>, got %r" % (where, start, token))
            hashes.append(value)
        if not hashes:
            fail("sparkseal: %s:%d: %s has no --hash (expected at least one)" % (where, start, requirement))
        pins[project] = {"version": version, "hashes": hashes, "line": start}
    if pending:
        fail("sparkseal: %s: the last requirement ends with a line continuation" % where)
    return pins

def _sidecar_wheels(text, where, platform):
    sidecar = parse_python_lock(text, where)
    if sidecar.platform != platform:
        fail("sparkseal: %s: field `platform`: expected %s (as given to python_lock), actual %s" % (
            where,
            json.encode(platform),
            json.encode(sidecar.platform),
        ))
    return sidecar.wheels

def check_lock(pins, wheels, lock_where, files_where):
    """Cross-check a parsed lock and its sidecar's wheels (read by `parse_python_lock`, which checked each
    entry's form); return [(project, version, filename, sha256)]."""
    extra = sorted([p for p in wheels if p not in pins])
    if extra:
        fail("sparkseal: %s names %s, which %s does not pin" % (files_where, ", ".join(extra), lock_where))
    out = []
    for project in sorted(pins):
        pin = pins[project]
        entry = wheels.get(project)
        if entry == None:
            fail("sparkseal: %s: no entry for %s==%s (pinned on %s:%d)" % (files_where, project, pin["version"], lock_where, pin["line"]))
        if entry.version != pin["version"]:
            fail("sparkseal: %s: %s: version %r, expected %r (%s:%d)" % (files_where, project, entry.version, pin["version"], lock_where, pin["line"]))
        if entry.sha256 not in pin["hashes"]:
            fail("sparkseal: %s: %s: sha256 %r, expected one of %s (%s:%d)" % (files_where, project, entry.sha256, ", ".join(pin["hashes"]), lock_where, pin["line"]))
        out.append((project, pin["version"], entry.filename, entry.sha256))
    return out

def _by_platform(hub, attr_name, mapping):
    out = {}
    for label, platform in mapping.items():
        if platform in out:
            fail("sparkseal: python_lock %s: two %s for platform %r: %s and %s" % (apparent_repo_name(hub), attr_name, platform, label_string(out[platform]), label_string(label)))
        out[platform] = label
    return out

def python_pins(ctx, hub, locks, files):
    """Read and cross-check the locks of hub `hub`: the one reader of both entry points.

    `ctx` reads the files (a repository or module context); `locks` and `files` map labels to platforms,
    as `python_lock` takes them. Returns a struct: `platforms` (sorted), `repos`, the
    `(repository, filename, sha256)` of every locked wheel (each one `pypi_file`), and `pins`
    (platform -> project -> `{"version", "filename", "label"}`, with apparent labels).
    """
    locks = _by_platform(hub, "locks", locks)
    files = _by_platform(hub, "files", files)
    if sorted(locks) != sorted(files):
        fail("sparkseal: python_lock %s: locks are for %s but files for %s; expected the same platforms" % (apparent_repo_name(hub), sorted(locks), sorted(files)))
    platforms = sorted(locks)
    repos = []
    pins = {}
    for platform in platforms:
        lock_where, files_where = label_string(locks[platform]), label_string(files[platform])
        parsed = parse_requirements(ctx.read(locks[platform]), lock_where)
        wheels = _sidecar_wheels(ctx.read(files[platform]), files_where, platform)
        pins[platform] = {}
        for project, version, filename, sha256 in check_lock(parsed, wheels, lock_where, files_where):
            name = repo_name(hub, platform, project)
            repos.append((name, filename, sha256))
            pins[platform][project] = {"version": version, "filename": filename, "label": "@%s//file" % name}
    return struct(platforms = platforms, repos = repos, pins = pins, locks = [str(locks[p]) for p in platforms])

def _python_lock_impl(rctx):
    # The name the hub was declared with: its wheels' repositories are named after it. Under bzlmod
    # `rctx.name` is the canonical name (`_main~sparkseal~python_deps`); Bazel 4.2.3 has no original_name.
    hub = getattr(rctx, "original_name", rctx.name)
    found = python_pins(rctx, hub, rctx.attr.locks, rctx.attr.files)
    platforms, repos, pins = found.platforms, found.repos, found.pins

    header = '"""Generated by python_lock(name = %r) from %s; do not edit."""' % (hub, ", ".join(found.locks))
    lines = [
        header,
        "",
        'load("@//rules:defs.bzl", "pypi_file")',
        "",
        "def %s_repositories():" % hub,
        '    """Declares one pypi_file repository per locked wheel; each downloads only when needed (WORKSPACE;',
        '    the bzlmod extension reads the locks itself)."""',
    ]
    for name, filename, sha256 in repos:
        lines.append("    pypi_file(name = %r, filename = %r, sha256 = %r)" % (name, filename, sha256))
    if not repos:
        lines.append("    pass")
    rctx.file("repositories.bzl", "\n".join(lines) + "\n")

    wheels = {p: [pins[p][project]["label"] for project in sorted(pins[p])] for p in platforms}
    by_layer = {
        p: {
            layer: [pins[p][project]["label"] for project in sorted(pins[p]) if layer_of(project) == layer]
            for layer in WHEEL_LAYERS
        }
        for p in platforms
    }
    rctx.file("requirements.bzl", "\n".join([
        header,
        "",
        'load("@//rules/private:wheel_layers.bzl", _layer_of = "layer_of")',
        "",
        "layer_of = _layer_of",
        "",
        "# The wheels' labels are resolved here, where this repository's own mapping sees their repositories:",
        "# under bzlmod the repositories of an extension see each other, but the main repository sees only what",
        "# MODULE.bazel imports; a canonical label works in any BUILD file. Under WORKSPACE it is `@repo//file:file`.",
        "def _canonical(label):",
        "    return str(Label(label))",
        "",
        "PLATFORMS = %r" % platforms,
        "",
        "_PINS = %s" % json.encode_indent(pins, indent = "    "),
        "",
        "PINS = {",
        "    platform: {",
        '        project: dict(pin, label = _canonical(pin["label"]))',
        "        for project, pin in pins.items()",
        "    }",
        "    for platform, pins in _PINS.items()",
        "}",
        "",
        "WHEELS = {platform: [_canonical(label) for label in labels] for platform, labels in %s.items()}" % (
            json.encode_indent(wheels, indent = "    "),
        ),
        "",
        "LAYERS = %r" % WHEEL_LAYERS,
        "",
        "WHEELS_BY_LAYER = {",
        "    platform: {layer: [_canonical(label) for label in labels] for layer, labels in layers.items()}",
        "    for platform, layers in %s.items()" % json.encode_indent(by_layer, indent = "    "),
        "}",
        "",
        "def wheel(platform, project):",
        '    """The label of the locked wheel of `project` (a normalised name) for `platform`."""',
        "    if platform not in PINS or project not in PINS[platform]:",
        '        fail("sparkseal: %s: no locked wheel of %r for %r (platforms: %s)" % (' + repr(apparent_repo_name(hub)) + ", project, platform, PLATFORMS))",
        '    return PINS[platform][project]["label"]',
        "",
    ]))
    rctx.file("BUILD", "")
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % hub)

python_lock = repository_rule(
    implementation = _python_lock_impl,
    doc = "Generates `repositories.bzl` (one pypi_file per locked wheel) and `requirements.bzl` from " +
          "`--hash` requirements locks and their `.files.json` sidecars.",
    attrs = {
        "locks": attr.label_keyed_string_dict(
            mandatory = True,
            allow_files = [".txt"],
            doc = "`--hash` requirements lock -> platform (`linux_aarch64`, `linux_x86_64`, or `any`).",
        ),
        "files": attr.label_keyed_string_dict(
            mandatory = True,
            allow_files = [".json"],
            doc = "Filename sidecar (`*.files.json`) -> platform; one per lock.",
        ),
    },
)
