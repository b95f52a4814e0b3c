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
load(":locks.bzl", "parse_debian_lock")
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

def read_debian_lock(rctx):
    """The Debian lock `rctx.attr.lock`, read by `parse_debian_lock` (rules/private/locks.bzl); no package
    may take the name of a target of the repository (`:debs`, `:lock`)."""
    where = label_string(rctx.attr.lock)
    lock = parse_debian_lock(rctx.read(rctx.attr.lock), where)
    for index, entry in enumerate(lock.packages):
        if entry.package in _RESERVED_TARGETS:
            fail("sparkseal: %s: field `packages[%d].package`: expected a name other than %s (targets of the repository), actual %s" % (
                where,
                index,
                " and ".join(_RESERVED_TARGETS),
                json.encode(entry.package),
            ))
    return lock

def _resolve(rctx, missing):
    """Package -> URLs for the `missing` entries: each archive's base URL joined to the locked path, then
    the snapshot archive's URL of the file at its locked time stamp, when a snapshot base is known."""
    result = run_python_helper(
        rctx,
        "sparkseal.fetch.debian_archive",
        ["urls", "--lock", str(rctx.path(rctx.attr.lock))] + [e.package for e in missing],
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

def fetch_debs(rctx, lock):
    """Fetch every .deb of `lock` (read_debian_lock's, of `rctx.attr.lock`) into `debs/`, verified; return
    the lock's packages.

    The repository cache first (no network), then each archive's base URL joined to the locked path, then
    the snapshot archive at the locked time stamp (a mirror drops superseded versions; the snapshot keeps
    them): one Bazel download with both URLs, each checked against the locked sha256.
    """
    packages = lock.packages
    missing = []
    for entry in packages:
        if not from_repository_cache(rctx, entry.filename, entry.sha256, "debs/" + entry.filename):
            missing.append(entry)
    if missing and downloads_disabled(rctx):
        fail(offline_miss_message(
            rctx,
            [("%s=%s (%s)" % (e.package, e.version, e.filename), e.sha256) for e in missing],
            "locked in %s" % label_string(rctx.attr.lock),
        ))
    if missing:
        prepare_download_verified(rctx)
        urls = _resolve(rctx, missing)
        targets = _credentials(rctx, [url for found in urls.values() for url in found])
        for entry in missing:
            rctx.report_progress("downloading %s" % entry.filename)
            auth = {}
            for url in urls[entry.package]:
                auth.update(targets[url]["auth"])
            download_verified(
                rctx,
                entry.filename,
                [targets[url]["url"] for url in urls[entry.package]],
                "debs/" + entry.filename,
                entry.sha256,
                auth,
                subject = "%s=%s (%s)" % (entry.package, entry.version, entry.filename),
                locked = "locked in %s" % rctx.attr.lock,
            )
    return packages

def _debian_packages_impl(rctx):
    packages = fetch_debs(rctx, read_debian_lock(rctx))

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
    ] + ['        "debs/%s",' % e.filename for e in packages] + [
        "    ],",
        ")",
        "",
    ] + [
        'filegroup(name = "%s", srcs = ["debs/%s"])' % (e.package, e.filename)
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
