"""`secret_scanner`: the Kingfisher binary whose maintained rule catalogue scans every image layer.

WORKSPACE use::

    secret_scanner(name = "secret_scanner", lock = "//third_party/scan:scanner.lock.json")

The lock (`python3 -m sparkseal.fetch.lock_wheels --set scanner` writes it) names the `kingfisher-bin`
wheel of each build host; the one of this host is fetched by filename and sha256 through
`download_locked_file` and its binary unpacked. `local_binary` uses a binary already on the machine
instead (test workspaces pass the one of the hash-locked test venv); its version must be the locked one.

Target: `:kingfisher` (the executable). The provenance records the scanner from the same lock.
"""

load(":common.bzl", "apparent_repo_name", "label_string")
load(":host_wheel.bzl", "locked_host_wheel")
load(":pypi_download.bzl", "INDEX_ENVIRON", "download_locked_file")

_PROJECT = "kingfisher-bin"

def _secret_scanner_impl(rctx):
    entry = locked_host_wheel(rctx, _PROJECT, "secret_scanner " + rctx.name)
    if rctx.attr.local_binary:
        rctx.symlink(rctx.attr.local_binary, "kingfisher")
    else:
        archive = "_wheel/%s.zip" % entry.filename
        download_locked_file(rctx, entry.filename, entry.sha256, archive)
        rctx.extract(archive, output = "_unpacked")
        rctx.symlink("_unpacked/kingfisher/bin/kingfisher", "kingfisher")
        rctx.delete(archive)
    found = rctx.execute(["./kingfisher", "--version"])
    if found.return_code != 0 or found.stdout.strip() != "kingfisher " + entry.version:
        fail("sparkseal: secret_scanner %s: expected 'kingfisher %s' (locked in %s), got %r" % (
            apparent_repo_name(rctx.name),
            entry.version,
            label_string(rctx.attr.lock),
            (found.stdout + found.stderr).strip(),
        ))
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)
    rctx.file("BUILD", "\n".join([
        'package(default_visibility = ["//visibility:public"])',
        "",
        'exports_files(["kingfisher"])',
        "",
    ]))

secret_scanner = repository_rule(
    implementation = _secret_scanner_impl,
    doc = "The locked Kingfisher secret scanner for this build host: `:kingfisher`.",
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = [".json"], doc = "scanner.lock.json"),
        "local_binary": attr.string(doc = "Absolute path of a kingfisher binary of the locked version (tests)."),
    },
    environ = INDEX_ENVIRON,
)
