"""`python_venv`: the virtual environment one image layer installs (`VenvInfo`); it runs no action.

    python_venv(
        name = "venv_deps_linux_aarch64",
        bytecode = True,
        installer = "@python_tools_any_installer//file",
        platform = "linux_aarch64",
        wheels = WHEELS_BY_LAYER["linux_aarch64"]["deps"],
    )

    oci_layer(name = "layer_deps_linux_aarch64", venv = ":venv_deps_linux_aarch64")

The wheels are installed inside the layer's own action (sparkseal/actions/oci_layer.py), so that no
installed tree is a build output; this rule only gathers what that install needs and checks, once and
at analysis, that the combination can be installed: wheels need a platform and the installer, bytecode
and a split need wheels, a split names its part. The layer's program then trusts what it is given.
"""

load(":common.bzl", "label_string")
load(":platforms.bzl", "PLATFORMS")

VenvInfo = provider(
    doc = "What one layer installs into the image's virtual environment, checked by python_venv.",
    fields = {
        "wheels": "List of File: the wheels to install, in the order given (at least one unless the venv " +
                  "is empty; an empty venv installs nothing and its layer writes no module manifest).",
        "platform": "String: the target wheel platform, one of `PLATFORMS` (`linux_aarch64`, " +
                    "`linux_x86_64`); every wheel's tags are checked against it. \"\" only when `wheels` is " +
                    "empty.",
        "installer": "File: the locked `installer` wheel that unpacks the wheels (no code of theirs runs); " +
                     "None only when `wheels` is empty.",
        "path": "String: the venv's absolute path in the image, e.g. `/opt/venv`.",
        "pyvenv_cfg": "Boolean: write the venv's `pyvenv.cfg` (one layer of an image writes it).",
        "replaces": "File or None: the policy naming the projects whose files another project may replace, " +
                    "with reasons.",
        "bytecode": "Boolean: byte-compile the installed sources (reproducible unchecked-hash pycs, listed in " +
                    "each RECORD and so in the module manifest).",
        "split": "File or None: the split file of a distribution installed as two layers " +
                  "(sparkseal/core/wheel_split.py); set together with `split_part`.",
        "split_part": "String: `lower` or `upper` with `split`, else \"\".",
    },
)

def _python_venv_impl(ctx):
    name = label_string(ctx.label)
    wheels = ctx.files.wheels
    if ctx.attr.bytecode and not wheels:
        fail("sparkseal: %s: bytecode needs wheels: only installed wheels are byte-compiled" % name)
    if wheels and not ctx.attr.platform:
        fail("sparkseal: %s: wheels need platform (one of %s)" % (name, ", ".join(PLATFORMS)))
    if wheels and not ctx.file.installer:
        fail("sparkseal: %s: wheels need installer (the locked installer wheel, " % name +
             "@python_tools_any_installer//file)")
    if bool(ctx.file.split) != bool(ctx.attr.split_part):
        fail("sparkseal: %s: split and split_part go together" % name)
    if ctx.file.split and not wheels:
        fail("sparkseal: %s: split needs wheels: it splits the installed wheels only" % name)
    return [VenvInfo(
        wheels = wheels,
        platform = ctx.attr.platform,
        installer = ctx.file.installer,
        path = ctx.attr.path,
        pyvenv_cfg = ctx.attr.pyvenv_cfg,
        replaces = ctx.file.replaces,
        bytecode = ctx.attr.bytecode,
        split = ctx.file.split,
        split_part = ctx.attr.split_part,
    )]

python_venv = rule(
    implementation = _python_venv_impl,
    doc = """What one image layer installs into the virtual environment at `path` (`VenvInfo`, for `oci_layer(venv = ...)`).

It builds nothing: the layer's action installs the wheels (tags checked against `platform`, no code run)
into a scratch directory that only the layer's tar keeps, and writes `name.modules.json`, the module
manifest of their files. The checks of the combination are made here, once, when the build is analysed.""",
    attrs = {
        "wheels": attr.label_list(allow_files = [".whl"], doc = "Wheels to install into the venv at `path`."),
        "platform": attr.string(values = [""] + PLATFORMS, doc = "Target wheel platform (with `wheels`)."),
        "installer": attr.label(
            allow_single_file = [".whl"],
            doc = "The locked `installer` wheel (with `wheels`; `@python_tools_any_installer//file`). No " +
                  "default, so that a build without wheels does not need the python_tools hub.",
        ),
        "path": attr.string(default = "/opt/venv", doc = "Path of the virtual environment in the image."),
        "pyvenv_cfg": attr.bool(default = False, doc = "Write the venv's pyvenv.cfg (in one layer only)."),
        "replaces": attr.label(
            allow_single_file = [".json"],
            doc = "Policy naming the projects whose files another project may replace, with reasons.",
        ),
        "bytecode": attr.bool(
            doc = "Byte-compile the installed wheels' sources (unchecked-hash pycs, sparkseal/install/bytecode.py).",
        ),
        "split": attr.label(
            allow_single_file = [".json"],
            doc = "Split file of a distribution installed as two layers (sparkseal/core/wheel_split.py), " +
                  "as the `split` output group of a vllm_wheel writes it.",
        ),
        "split_part": attr.string(
            values = ["", "lower", "upper"],
            doc = "With split: `lower` installs the upstream wheel without the split's files, `upper` " +
                  "installs ours and keeps only them, their bytecode and the .dist-info.",
        ),
    },
)
