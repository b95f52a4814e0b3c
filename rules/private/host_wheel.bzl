"""`host_wheel`: the locked wheel of a Python package that build actions import, for this build host.

WORKSPACE use::

    host_wheel(name = "zstandard", lock = "//third_party/zstd:zstandard.lock.json", module = "zstandard")

The lock (`python3 -m sparkseal.fetch.lock_wheels --set zstd` writes it) names the wheel of each build host
platform; the one of this host is fetched by filename and sha256 through `download_locked_file` and
unpacked below `site/`, the directory an action puts first on its `sys.path`. Such a wheel holds a C
extension built for the build host's CPython, so its bytes (not the build machine's packages) decide
what the action computes with it.

Targets: `:site` (the unpacked files; the directory is `<repository>/site`).
"""

load(":common.bzl", "apparent_repo_name", "label_string")
load(":locks.bzl", "locked_wheel", "parse_wheels_lock")
load(":platforms.bzl", "host_platform")
load(":pypi_download.bzl", "INDEX_ENVIRON", "download_locked_file")

def locked_host_wheel(rctx, project, purpose):
    """The lock entry of `project`'s wheel for this build host: struct(filename, sha256, version, platform).

    The lock is `rctx.attr.lock`, a `wheels` lock (rules/private/locks.bzl) written by
    `sparkseal.fetch.lock_wheels`; a missing entry fails naming the lock and the field.
    """
    where = label_string(rctx.attr.lock)
    platform = host_platform(rctx, purpose)
    entry = locked_wheel(parse_wheels_lock(rctx.read(rctx.attr.lock), where), project, platform, where)
    return struct(
        filename = entry.filename,
        sha256 = entry.sha256,
        version = entry.version,
        platform = platform,
    )

def _host_wheel_impl(rctx):
    project = rctx.attr.project or rctx.attr.module
    entry = locked_host_wheel(rctx, project, "host_wheel %s" % rctx.name)
    archive = "_wheel/%s.zip" % entry.filename
    download_locked_file(rctx, entry.filename, entry.sha256, archive)
    rctx.extract(archive, output = "site")
    rctx.delete(archive)
    init = "site/%s/__init__.py" % rctx.attr.module
    if not rctx.path(init).exists:
        fail("sparkseal: host_wheel %s: %s holds no package %r (expected %s)" % (
            apparent_repo_name(rctx.name),
            entry.filename,
            rctx.attr.module,
            init,
        ))
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)
    rctx.file("BUILD", "\n".join([
        'package(default_visibility = ["//visibility:public"])',
        "",
        "# %s %s for %s (%s)" % (project, entry.version, entry.platform, entry.filename),
        'filegroup(name = "site", srcs = glob(["site/**"]))',
        "",
    ]))

host_wheel = repository_rule(
    implementation = _host_wheel_impl,
    doc = "The locked wheel of `module` for this build host, unpacked: `:site`.",
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = [".json"], doc = "the lock_wheels lock"),
        "module": attr.string(mandatory = True, doc = "The top-level package the wheel must hold."),
        "project": attr.string(doc = "The project's name in the lock (default: module)."),
    },
    environ = INDEX_ENVIRON,
)
