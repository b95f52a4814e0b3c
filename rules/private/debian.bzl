"""`debian_packages` (repository rule) and `debian_rootfs` (rule): the image's base OS from locked .debs.

WORKSPACE use::

    debian_packages(name = "debian_linux_aarch64", lock = "//third_party/debian:bookworm_arm64.lock.json")

The repository holds every locked .deb under `debs/` and exposes `:debs` (all of them), one filegroup per
package (`:libc6`, ...) and `:lock` (the lock it was made from). Each .deb is first asked of Bazel's
repository cache by its locked sha256, so a build whose cache holds them needs no network at all.
Otherwise its URLs are its archive's base URL (`$SPARKSEAL_DEBIAN_ARCHIVES`, else the machine's apt
sources read as text: sparkseal.fetch.debian_archive) joined to its locked path, then the snapshot
archive's URL of the file at its locked time stamp (`$SPARKSEAL_DEBIAN_SNAPSHOT`, else a snapshot URL in
the apt sources), and Bazel's downloader fetches and verifies it from the first that serves it: no apt,
no apt sources' suites, no keyring, so any Linux host fetches bookworm's files, also after the mirror has
dropped a superseded version. When no URL serves the locked file, the error names the package, every URL
and the locked sha256; with `--repository_disable_download`, it says that the file is in no repository
cache and downloads are off.

BUILD use::

    debian_rootfs(name = "rootfs_linux_aarch64", debs = ["@debian_linux_aarch64//:debs"],
                  lock = "@debian_linux_aarch64//:lock")

gives `<name>/` (the tree of regular files), `<name>.links.json` (the links spec of every symlink) and
`<name>.dirs.json` (every directory with its mode and owner), also as `DebianRootfsInfo`. An oci_layer
with `rootfs` unpacks the .debs in its own action instead of reading that tree, so an image build does not
write (or upload to a remote cache) the unpacked base OS beside its layer.
"""

load(":common.bzl", "ACTION_ENV", "apparent_repo_name", "label_string", "tool")
load(
    ":pypi_download.bzl",
    "REPOSITORY_CACHE_ENV",
    "download_verified",
    "downloads_disabled",
    "from_repository_cache",
    "offline_miss_message",
    "prepare_download_verified",
    "run_python_helper",
)

# SPARKSEAL_DEBIAN_ARCHIVES: the archives' base URLs; SPARKSEAL_DEBIAN_SNAPSHOT: the snapshot archive's base
# URL; NETRC: credentials for mirrors that need them (else ~/.netrc); SPARKSEAL_REPOSITORY_CACHE: the
# repository cache when not .bazelrc's.
DEBIAN_ENVIRON = ["SPARKSEAL_DEBIAN_ARCHIVES", "SPARKSEAL_DEBIAN_SNAPSHOT", "NETRC", REPOSITORY_CACHE_ENV]

# The Debian lock's format (sparkseal.fetch.lock_debian.LOCK_FORMAT): 3 adds each package's `snapshot`.
LOCK_FORMAT = 3

_RESERVED_TARGETS = ["debs", "lock"]

DebianRootfsInfo = provider(
    doc = "A root file system from locked .debs: what unpacks it, and the unpacked tree in three parts.",
    fields = {
        "debs": "list of File: the locked .debs (an oci_layer unpacks them in its own action)",
        "lock": "File: the Debian lock the .debs are exactly",
        "exclude": "string: the named path filter (`none` or `slim`)",
        "tree": "File: directory (tree artifact) of regular files, built only when asked for",
        "links": "File: links spec, JSON object {path: target} of every symlink",
        "dirs": "File: JSON object {path: {mode, uid, gid}} of every directory",
    },
)

def _entries(rctx, lock):
    packages = lock.get("packages") if type(lock) == "dict" else None
    if type(packages) != "list" or not packages:
        fail("sparkseal: %s: expected a non-empty list `packages`, got %r" % (label_string(rctx.attr.lock), packages))
    if lock.get("format") != LOCK_FORMAT:
        fail(("sparkseal: %s: field `format`: expected %d (each package with its archive, path and snapshot " +
              "time stamp), actual %r: rewrite it with `sparkseal lock debian --keep-versions`") % (
            label_string(rctx.attr.lock),
            LOCK_FORMAT,
            lock.get("format"),
        ))
    names = {}
    for entry in packages:
        for key in ["package", "version", "architecture", "filename", "sha256", "archive", "path", "snapshot"]:
            if type(entry.get(key)) != "string" or not entry[key]:
                fail("sparkseal: %s: package entry %r: expected a non-empty string %r" % (label_string(rctx.attr.lock), entry, key))
        if not _is_timestamp(entry["snapshot"]):
            fail("sparkseal: %s: %s: field `snapshot`: expected a time stamp YYYYMMDDTHHMMSSZ, actual %r" % (
                label_string(rctx.attr.lock),
                entry["package"],
                entry["snapshot"],
            ))
        sha256 = entry["sha256"]
        if len(sha256) != 64 or [c for c in sha256.elems() if c not in "0123456789abcdef"]:
            fail("sparkseal: %s: %s: locked sha256 %r is not 64 lowercase hex digits" % (
                label_string(rctx.attr.lock),
                entry["package"],
                sha256,
            ))
        if "/" in entry["filename"] or not entry["filename"].endswith(".deb"):
            fail("sparkseal: %s: %s: expected a .deb file name, got %r" % (
                label_string(rctx.attr.lock),
                entry["package"],
                entry["filename"],
            ))
        path = entry["path"]
        if path.startswith("/") or ".." in path.split("/") or not path.endswith("/" + entry["filename"]):
            fail("sparkseal: %s: %s: expected a relative path without '..' ending in /%s, got %r" % (
                label_string(rctx.attr.lock),
                entry["package"],
                entry["filename"],
                path,
            ))
        if entry["package"] in names or entry["package"] in _RESERVED_TARGETS:
            fail("sparkseal: %s: package name %r is listed twice or clashes with a target of the repository" % (
                label_string(rctx.attr.lock),
                entry["package"],
            ))
        names[entry["package"]] = True
    return packages

def _is_timestamp(value):
    """Whether `value` is a snapshot time stamp, YYYYMMDDTHHMMSSZ (sparkseal.fetch.debian_snapshot)."""
    if len(value) != 16 or value[8] != "T" or value[15] != "Z":
        return False
    return not [c for c in (value[:8] + value[9:15]).elems() if c not in "0123456789"]

def _resolve(rctx, missing):
    """Package -> URLs for the `missing` entries: each archive's base URL joined to the locked path, then
    the snapshot archive's URL of the file at its locked time stamp, when a snapshot base is known."""
    result = run_python_helper(
        rctx,
        "sparkseal.fetch.debian_archive",
        ["urls", "--lock", str(rctx.path(rctx.attr.lock))] + [e["package"] for e in missing],
    )
    if result.return_code != 0:
        fail("%s\n(while fetching @%s)" % (result.stderr.strip() or result.stdout.strip(), apparent_repo_name(rctx.name)))
    urls = {}
    for line in result.stdout.strip().split("\n"):
        fields = line.split("\t")
        urls[fields[0]] = [url for url in fields[1:] if url]
    return urls

def _credentials(rctx, urls):
    """{URL: {"url": the URL without credentials, "auth": Bazel's download `auth`}} (netrc)."""
    if not urls:
        return {}
    result = run_python_helper(rctx, "sparkseal.fetch.credentials", sorted(urls))
    if result.return_code != 0:
        # stderr only: stdout of a successful answer holds the credentials.
        fail("%s\n(while fetching @%s)" % (result.stderr.strip(), apparent_repo_name(rctx.name)))
    return json.decode(result.stdout)

def fetch_debs(rctx):
    """Fetch every .deb of the lock `rctx.attr.lock` into `debs/`, verified; return the lock's entries.

    The repository cache first (no network), then each archive's base URL joined to the locked path, then
    the snapshot archive at the locked time stamp (a mirror drops superseded versions; the snapshot keeps
    them): one Bazel download with both URLs, each checked against the locked sha256.
    """
    packages = _entries(rctx, json.decode(rctx.read(rctx.attr.lock)))
    missing = []
    for entry in packages:
        if not from_repository_cache(rctx, entry["filename"], entry["sha256"], "debs/" + entry["filename"]):
            missing.append(entry)
    if missing and downloads_disabled(rctx):
        fail(offline_miss_message(
            rctx,
            [("%s=%s (%s)" % (e["package"], e["version"], e["filename"]), e["sha256"]) for e in missing],
            "locked in %s" % label_string(rctx.attr.lock),
        ))
    if missing:
        prepare_download_verified(rctx)
        urls = _resolve(rctx, missing)
        targets = _credentials(rctx, [url for found in urls.values() for url in found])
        for entry in missing:
            rctx.report_progress("downloading %s" % entry["filename"])
            auth = {}
            for url in urls[entry["package"]]:
                auth.update(targets[url]["auth"])
            download_verified(
                rctx,
                entry["filename"],
                [targets[url]["url"] for url in urls[entry["package"]]],
                "debs/" + entry["filename"],
                entry["sha256"],
                auth,
                subject = "%s=%s (%s)" % (entry["package"], entry["version"], entry["filename"]),
                locked = "locked in %s" % rctx.attr.lock,
            )
    return packages

def _debian_packages_impl(rctx):
    packages = fetch_debs(rctx)

    rctx.symlink(rctx.attr.lock, "lock.json")
    lines = [
        '"""Generated by debian_packages from %s; do not edit."""' % rctx.attr.lock,
        "",
        'package(default_visibility = ["//visibility:public"])',
        "",
        'filegroup(name = "lock", srcs = ["lock.json"])',
        "",
        "filegroup(",
        '    name = "debs",',
        "    srcs = [",
    ] + ['        "debs/%s",' % e["filename"] for e in packages] + [
        "    ],",
        ")",
        "",
    ] + [
        'filegroup(name = "%s", srcs = ["debs/%s"])' % (e["package"], e["filename"])
        for e in packages
    ]
    rctx.file("BUILD", "\n".join(lines) + "\n")
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)

debian_packages = repository_rule(
    implementation = _debian_packages_impl,
    doc = "Fetches every .deb of a Debian lock (bookworm_<arch>.lock.json), verified by sha256.",
    attrs = {
        "lock": attr.label(
            mandatory = True,
            allow_single_file = [".json"],
            doc = "The Debian lock (`sparkseal lock debian`): the .debs fetched, each checked by sha256.",
        ),
    },
    environ = DEBIAN_ENVIRON,
)

def _debian_rootfs_impl(ctx):
    tree = ctx.actions.declare_directory(ctx.label.name)
    links = ctx.actions.declare_file(ctx.label.name + ".links.json")
    dirs = ctx.actions.declare_file(ctx.label.name + ".dirs.json")
    args = ctx.actions.args()
    args.add("--lock", ctx.file.lock)
    args.add("--out", tree.path)
    args.add("--links", links)
    args.add("--dirs", dirs)
    args.add("--exclude", ctx.attr.exclude)
    args.add_all(ctx.files.debs)
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = ctx.files.debs + [ctx.file.lock],
        outputs = [tree, links, dirs],
        env = ACTION_ENV,
        mnemonic = "DebRootfs",
        progress_message = "Unpacking %d .debs into %s" % (len(ctx.files.debs), ctx.label),
    )
    return [
        DefaultInfo(files = depset([tree, links, dirs])),
        DebianRootfsInfo(
            debs = ctx.files.debs,
            lock = ctx.file.lock,
            exclude = ctx.attr.exclude,
            tree = tree,
            links = links,
            dirs = dirs,
        ),
        OutputGroupInfo(tree = depset([tree]), links = depset([links]), dirs = depset([dirs])),
    ]

debian_rootfs = rule(
    implementation = _debian_rootfs_impl,
    doc = "Unpacks locked .debs into a root file system (no maintainer scripts run).",
    attrs = {
        "debs": attr.label_list(mandatory = True, allow_files = [".deb"], doc = "the .debs, e.g. @repo//:debs"),
        "lock": attr.label(mandatory = True, allow_single_file = [".json"], doc = "the lock, e.g. @repo//:lock"),
        "exclude": attr.string(
            default = "slim",
            values = ["none", "slim"],
            doc = "named path filter: `slim` drops documentation, manuals and translations (copyright kept)",
        ),
        "_tool": tool("//sparkseal/actions:debian_rootfs"),
    },
)
