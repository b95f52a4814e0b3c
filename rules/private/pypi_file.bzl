"""`pypi_file`: one file from the pip index, pinned by filename and sha256."""

load(":common.bzl", "apparent_repo_name")
load(":pypi_download.bzl", "INDEX_ENVIRON", "download_locked_file")

def _pypi_file_impl(rctx):
    filename = rctx.attr.filename
    if "/" in filename or filename in ("", ".", ".."):
        fail("sparkseal: pypi_file %s: filename %r must be a plain file name" % (apparent_repo_name(rctx.name), filename))
    download_locked_file(rctx, filename, rctx.attr.sha256, "file/" + filename, urls = rctx.attr.urls)
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)
    rctx.file("file/BUILD", "\n".join([
        'package(default_visibility = ["//visibility:public"])',
        "",
        "exports_files([%r])" % filename,
        "",
        "filegroup(",
        '    name = "file",',
        "    srcs = [%r]," % filename,
        ")",
        "",
    ]))

pypi_file = repository_rule(
    implementation = _pypi_file_impl,
    doc = "Fetches `filename` from the configured pip index (PEP 691), verified by `sha256`. " +
          "Exposes `@NAME//file` and `@NAME//file:FILENAME`.",
    attrs = {
        "filename": attr.string(mandatory = True, doc = "Exact file name as the index lists it."),
        "sha256": attr.string(mandatory = True, doc = "Locked sha256 of the file."),
        "urls": attr.string_list(doc = "Optional URLs tried before the index lookup."),
    },
    environ = INDEX_ENVIRON,
)
