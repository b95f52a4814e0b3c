"""`provenance` (in-toto Statement v1 with SLSA v1 provenance) of one platform.

See sparkseal/actions/provenance.py for what the document holds (the SBOMs: rules/private/sbom.bzl).
`sparkseal provenance check bazel-bin/<name>.intoto.json` re-derives the provenance's subjects.
"""

load(":common.bzl", "ACTION_ENV", "label_string", "tool")
load(":kernels_wheel.bzl", "CudaArchsInfo")
load(":oci_image.bzl", "OciImageInfo")
load(":oci_layer.bzl", "LayerCompressionInfo")
load(":pex.bzl", "SparksealPexInfo")
load(":platforms.bzl", "PLATFORMS")
load(":toolchains.bzl", "LOCKS_TOOLCHAIN")

BuildSettingInfo = provider(
    doc = "The value of a string build setting.",
    fields = {"value": "string"},
)

# What the provenance records of the Bazel that runs (internalParameters.bazel, sparkseal/core/slsa.py):
# only what was seen. REPORTED_BAZEL_RELEASE: the release Bazel reports to a BUILD file's .bzl
# (`native.bazel_version`), "" when it reports none: Bazel 4.2.3 offers no such field there, and Debian's
# bazel-bootstrap builds know no release at all (`bazel info release` says "development version"), so on
# both supported Bazels the record says null. INFERRED_BAZEL: what the Starlark tells, recorded with what it
# was told from: only Bazel 6.2 and later have `native.package_relative_label`, in WORKSPACE mode and under
# bzlmod alike. A release the builder knows otherwise is named with --//rules:bazel_version and recorded as
# declared, never as measured.
REPORTED_BAZEL_RELEASE = getattr(native, "bazel_version", "") or ""
INFERRED_BAZEL = ">= 6.2" if hasattr(native, "package_relative_label") else "< 6.2"

BazelInfo = provider(
    doc = "What is known of the running Bazel, as the provenance records it.",
    fields = {
        "release": "the release Bazel reports, \"\" when none",
        "inferred": "\">= 6.2\" or \"< 6.2\", told from the Starlark",
        "declared": "the release --//rules:bazel_version names, \"\" when none",
    },
)

def _bazel_version_impl(ctx):
    return [
        BuildSettingInfo(value = ctx.build_setting_value),
        BazelInfo(release = REPORTED_BAZEL_RELEASE, inferred = INFERRED_BAZEL, declared = ctx.build_setting_value),
    ]

bazel_version = rule(
    implementation = _bazel_version_impl,
    doc = "The running Bazel as the provenance records it (BazelInfo): the release it reports, the range " +
          "told from its Starlark, and the release the flag declares, if any.",
    build_setting = config.string(flag = True),
)

def _patch_args(args, patches):
    for patch in patches:
        args.add_all(["--patch", patch.short_path, patch])

def _provenance_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".intoto.json")
    image = ctx.attr.image[OciImageInfo]
    pex = ctx.attr.pex[SparksealPexInfo]
    pex_dir, pex_digest = pex.pex, pex.digest
    args = ctx.actions.args()
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    args.add("--platform", ctx.attr.platform)
    args.add("--vllm-lock", ctx.file.vllm_lock)
    _patch_args(args, ctx.files.patches)
    args.add("--python-lock", ctx.file.python_lock)
    args.add("--tools-lock", ctx.file.tools_lock)
    args.add("--debian-lock", ctx.file.debian_lock)
    args.add("--cuda-lock", ctx.file.cuda_lock)
    if ctx.file.scanner_lock:
        args.add("--scanner-lock", ctx.file.scanner_lock)

    # zstd layers' bytes come from the locked compressor: a dependency like the scanner.
    compression = ctx.attr._compression[LayerCompressionInfo].value
    args.add("--layer-compression", compression)
    zstd_lock = [ctx.file.zstd_lock] if compression == "zstd" and ctx.file.zstd_lock else []
    if compression == "zstd" and not zstd_lock:
        fail("sparkseal: %s: zstd layers need zstd_lock (third_party/zstd/zstandard.lock.json)" % label_string(ctx.label))
    args.add_all(zstd_lock, before_each = "--zstd-lock")
    args.add_all(ctx.files.built_wheels, before_each = "--built-wheel")

    # A subject is named by its path below bazel-bin; the action reads its digest file (image, PEX) or
    # hashes it (module manifest, SBOMs), never the large trees.
    args.add_all(["--subject", "oci-image", image.layout.short_path, image.digest])
    args.add("--image-tag", image.tag)
    args.add_all(["--subject", "pex", pex_dir.short_path, pex_digest])
    args.add_all(["--subject", "module-manifest", ctx.file.manifest.short_path, ctx.file.manifest])
    args.add_all(["--subject", "sbom", ctx.file.sbom.short_path, ctx.file.sbom])
    args.add_all(["--subject", "sbom-cyclonedx", ctx.file.sbom_cyclonedx.short_path, ctx.file.sbom_cyclonedx])
    for target in [ctx.attr.image, ctx.attr.pex, ctx.attr.manifest, ctx.attr.sbom, ctx.attr.sbom_cyclonedx]:
        args.add("--target", label_string(target.label))
    bazel = ctx.attr._bazel_version[BazelInfo]
    args.add("--bazel-inferred", bazel.inferred)
    if bazel.release:
        args.add("--bazel-release", bazel.release)
    if bazel.declared:
        args.add("--bazel-declared", bazel.declared)

    # The locked interpreter and compilers of the platform the actions execute on.
    locks = ctx.toolchains[LOCKS_TOOLCHAIN].locks
    args.add("--interpreter-lock", locks.interpreter)
    args.add("--compiler-lock", locks.compiler)
    cuda_archs = ctx.attr._cuda_archs_flag[CudaArchsInfo].archs
    if cuda_archs:
        args.add("--cuda-archs", ";".join(cuda_archs))

    # The source (repository, commit, clean or dirty tree): Bazel's stable status file, which the
    # workspace status command of .bazelrc fills (sparkseal/core/source.py). This small action is the only
    # reader without --stamp, so a new commit re-runs it and leaves every layer and the image digest be.
    args.add("--source-status", ctx.info_file)
    args.add("--out", out)
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = ctx.files.patches + ctx.files.built_wheels + ctx.files.scanner_lock + zstd_lock + [
            ctx.info_file,
            ctx.file.vllm_lock,
            ctx.file.python_lock,
            ctx.file.tools_lock,
            ctx.file.debian_lock,
            ctx.file.cuda_lock,
            locks.interpreter,
            locks.compiler,
            image.digest,
            pex_digest,
            ctx.file.manifest,
            ctx.file.sbom,
            ctx.file.sbom_cyclonedx,
        ],
        outputs = [out],
        env = ACTION_ENV,
        mnemonic = "Provenance",
        progress_message = "Writing the provenance of %s" % ctx.attr.platform,
    )
    return [DefaultInfo(files = depset([out]))]

_LOCK = attr.label(
    mandatory = True,
    allow_single_file = [".json"],
    doc = "The lock the attribute names (JSON): what the document records of that part is read from it.",
)

provenance = rule(
    implementation = _provenance_impl,
    doc = "Writes `name.intoto.json`: the SLSA v1 provenance (in-toto Statement v1) of one platform's image, " +
          "PEX, module manifest and both SBOMs (SPDX 2.3 and CycloneDX 1.6).",
    attrs = {
        "platform": attr.string(mandatory = True, values = PLATFORMS, doc = "The platform of the image described."),
        "image": attr.label(mandatory = True, providers = [OciImageInfo], doc = "oci_image target."),
        "pex": attr.label(mandatory = True, providers = [SparksealPexInfo], doc = "sparkseal_pex target."),
        "manifest": attr.label(mandatory = True, allow_single_file = [".json"], doc = "module_manifest target."),
        "sbom": attr.label(mandatory = True, allow_single_file = [".json"], doc = "sbom target (SPDX 2.3)."),
        "sbom_cyclonedx": attr.label(
            mandatory = True,
            allow_single_file = [".json"],
            doc = "sbom_cyclonedx target (CycloneDX 1.6).",
        ),
        "vllm_lock": _LOCK,
        "patches": attr.label_list(allow_files = [".patch"], doc = "The vLLM patch series, in order."),
        "python_lock": _LOCK,
        "tools_lock": _LOCK,
        "debian_lock": _LOCK,
        "cuda_lock": _LOCK,
        "scanner_lock": attr.label(
            allow_single_file = [".json"],
            doc = "The secret scanner's lock (the layer scan's scanner, recorded as a dependency).",
        ),
        "zstd_lock": attr.label(
            allow_single_file = [".json"],
            doc = "The zstd compressor's lock, recorded as a dependency when the layers are zstd.",
        ),
        "built_wheels": attr.label_list(allow_files = [".whl"], doc = "Wheels the build makes (byproducts)."),
        "_bazel_version": attr.label(default = Label("//rules:bazel_version")),
        "_cuda_archs_flag": attr.label(default = Label("//kernels_sm121:cuda_archs")),
        "_compression": attr.label(default = Label("//rules:layer_compression")),
        "_tool": tool("//sparkseal/actions:provenance"),
    },
    toolchains = [LOCKS_TOOLCHAIN],
)
