"""The `buildozer_binary` extension bazel_tools' MODULE.bazel uses, offline: no buildozer to download."""

_MESSAGE = "sparkseal: buildozer is not available offline (third_party/bazel/modules/buildozer): " + \
           "`bazel mod tidy` cannot rewrite MODULE.bazel; edit its use_repo by hand"

def _buildozer_impl(rctx):
    script = "#!/bin/sh\necho '%s' >&2\nexit 1\n" % _MESSAGE
    rctx.file("buildozer.exe", script, executable = True)
    rctx.file("BUILD.bazel", 'exports_files(["buildozer.exe"])\n')

_buildozer = repository_rule(implementation = _buildozer_impl)

def _buildozer_binary_impl(mctx):
    _buildozer(name = "buildozer_binary")
    return mctx.extension_metadata(reproducible = True)

buildozer_binary = module_extension(implementation = _buildozer_binary_impl)
