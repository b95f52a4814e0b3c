"""`kernels_wheel`: the `sparkseal` wheel (Python package + libsparkseal_kernels.so), one sandboxed action.

`cuda_archs_setting` is the build setting that overrides every wheel's CUDA architecture list, e.g.
`--//kernels_sm121:cuda_archs=90a-real,121a-real`; left empty (the default), each wheel uses its own
`cuda_archs` attribute.
"""

load(":common.bzl", "ACTION_ENV", "label_string", "tool")
load(":platforms.bzl", "PLATFORMS")

CudaArchsInfo = provider(
    doc = "The value of the CUDA architecture build setting.",
    fields = {"archs": "list of CMAKE_CUDA_ARCHITECTURES entries; empty means each target's default"},
)

def _split_archs(text):
    return [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]

def _cuda_archs_setting_impl(ctx):
    return [CudaArchsInfo(archs = _split_archs(ctx.build_setting_value))]

cuda_archs_setting = rule(
    implementation = _cuda_archs_setting_impl,
    doc = "A string flag: CMAKE_CUDA_ARCHITECTURES for every kernels wheel (',' or ';' separated).",
    build_setting = config.string(flag = True),
)

def _kernels_wheel_impl(ctx):
    platform = ctx.attr.platform
    archs = ctx.attr._cuda_archs_flag[CudaArchsInfo].archs or ctx.attr.cuda_archs
    if not archs:
        fail("sparkseal: %s: expected a non-empty CUDA architecture list (cuda_archs or --%s), got none" % (
            label_string(ctx.label),
            label_string(ctx.attr._cuda_archs_flag.label),
        ))
    filename = "sparkseal-%s-py3-none-%s.whl" % (ctx.attr.version, platform)
    wheel = ctx.actions.declare_file("%s/%s" % (ctx.label.name, filename))

    args = ctx.actions.args()
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    args.add("--platform", platform)
    args.add("--cuda-archs", ";".join(archs))
    args.add("--cuda-root", ctx.file._cuda_root.dirname)
    cc = ctx.toolchains[CC_TOOLCHAIN].cc
    args.add("--cc-toolchain", cc.description)
    args.add("--cmake", ctx.file._cmake)
    args.add("--ninja", ctx.file._ninja)
    args.add("--python-path", ctx.file._python_root.dirname)
    args.add_all(ctx.files.srcs, before_each = "--input")
    args.add("--out", wheel)

    inputs = depset(
        ctx.files.srcs + ctx.files._cuda + ctx.files._cmake_files + ctx.files._python +
        [ctx.file._cuda_root, ctx.file._cmake, ctx.file._ninja, ctx.file._python_root, cc.description],
        transitive = [cc.files],
    )
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = inputs,
        outputs = [wheel],
        env = ACTION_ENV,
        mnemonic = "KernelsWheel",
        progress_message = "Building %s (CUDA %s)" % (filename, ", ".join(archs)),
        # Every tool is a declared input (the locked compilers of //third_party/toolchains:cc_*, nvcc,
        # cmake and ninja from locked wheels), so a remote worker runs it like any other action.
        execution_requirements = {"block-network": "1"},
    )
    return [DefaultInfo(files = depset([wheel]))]

CC_TOOLCHAIN = "//third_party/toolchains:cc_toolchain_type"

kernels_wheel = rule(
    implementation = _kernels_wheel_impl,
    doc = "Builds the sparkseal wheel for one platform with scikit-build-core, nvcc and cmake from locked wheels.",
    attrs = {
        "platform": attr.string(mandatory = True, values = PLATFORMS, doc = "Wheel platform tag."),
        "version": attr.string(mandatory = True, doc = "The [project] version of pyproject.toml."),
        "cuda_archs": attr.string_list(mandatory = True, doc = "CMAKE_CUDA_ARCHITECTURES entries."),
        "srcs": attr.label_list(
            allow_files = True,
            doc = "Every file of the wheel's source tree (pyproject.toml, the Python package, kernels_sm121/).",
        ),
        "_cuda_archs_flag": attr.label(default = Label("//kernels_sm121:cuda_archs")),
        "_tool": tool("//sparkseal/actions:kernels_wheel"),
        "_cuda": attr.label(default = Label("@sparkseal_cuda//:cuda")),
        "_cuda_root": attr.label(default = Label("@sparkseal_cuda//:cuda_root"), allow_single_file = True),
        "_cmake": attr.label(default = Label("@sparkseal_cuda//:cmake"), allow_single_file = True),
        "_cmake_files": attr.label(default = Label("@sparkseal_cuda//:cmake_files")),
        "_ninja": attr.label(default = Label("@sparkseal_cuda//:ninja"), allow_single_file = True),
        "_python": attr.label(default = Label("@sparkseal_cuda//:python")),
        "_python_root": attr.label(default = Label("@sparkseal_cuda//:python_root"), allow_single_file = True),
    },
    toolchains = [CC_TOOLCHAIN],
)
