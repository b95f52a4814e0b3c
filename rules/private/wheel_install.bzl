"""`wheel_install`: wheels -> a tree holding the `/opt/venv` they make, in one sandboxed action.

    load("@python_deps//:requirements.bzl", "WHEELS_BY_LAYER")
    load("//rules/private:wheel_install.bzl", "wheel_install")

    wheel_install(
        name = "venv_torch_linux_aarch64",
        platform = "linux_aarch64",
        wheels = WHEELS_BY_LAYER["linux_aarch64"]["torch"],
    )

The output directory `<name>/` holds `opt/venv/lib/python3.11/site-packages/...`, `opt/venv/bin/...` and,
unless `pyvenv_cfg = False`, `opt/venv/pyvenv.cfg`; a tar layer maps it onto `/`. Every wheel's tags are
checked against `platform`; two wheels writing one file fail the action, naming both. No target code runs
and no bytecode is written. The `installer` library comes from the locked build-tool wheel.
"""

load(":common.bzl", "ACTION_ENV", "tool")
load(":platforms.bzl", "PLATFORMS")

def _wheel_install_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    args = ctx.actions.args()
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    args.add("--platform", ctx.attr.platform)
    args.add("--installer", ctx.file.installer)
    args.add("--prefix", ctx.attr.prefix)
    if not ctx.attr.pyvenv_cfg:
        args.add("--no-pyvenv-cfg")
    args.add("--out", out.path)
    if ctx.file.replaces:
        args.add("--replaces", ctx.file.replaces)
    args.add_all(ctx.files.wheels, before_each = "--wheel")
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = ctx.files.wheels + [ctx.file.installer] + ctx.files.replaces,
        outputs = [out],
        env = ACTION_ENV,
        mnemonic = "WheelInstall",
        progress_message = "Installing %d wheels for %s into %s" % (len(ctx.files.wheels), ctx.attr.platform, ctx.label),
        execution_requirements = {"block-network": "1"},
    )
    return [DefaultInfo(files = depset([out]))]

wheel_install = rule(
    implementation = _wheel_install_impl,
    doc = "Installs wheels into a tree artifact laid out as the /opt/venv of the image.",
    attrs = {
        "platform": attr.string(mandatory = True, values = PLATFORMS, doc = "Target wheel platform."),
        "wheels": attr.label_list(allow_files = [".whl"], mandatory = True, doc = "Wheels to install."),
        "prefix": attr.string(default = "/opt/venv", doc = "Path of the virtual environment in the image."),
        "pyvenv_cfg": attr.bool(default = True, doc = "Write pyvenv.cfg (leave it to one layer only)."),
        "replaces": attr.label(
            allow_single_file = [".json"],
            doc = "Policy naming the projects whose files another project may replace, with reasons.",
        ),
        "installer": attr.label(
            default = Label("@python_tools_any_installer//file"),
            allow_single_file = [".whl"],
            doc = "The locked `installer` wheel (from the python_tools hub).",
        ),
        "_tool": tool("//sparkseal/actions:wheel_install"),
    },
)
