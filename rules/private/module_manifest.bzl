"""`module_manifest`: sha256 of every file of the image's virtual environment, per distribution."""

load(":common.bzl", "ACTION_ENV", "tool")

def _module_manifest_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".json")
    args = ctx.actions.args()
    for tree in ctx.files.trees:
        args.add("--tree", tree.path)
    args.add("--prefix", ctx.attr.prefix)
    args.add("--out", out)
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = ctx.files.trees,
        outputs = [out],
        env = ACTION_ENV,
        mnemonic = "ModuleManifest",
        progress_message = "Hashing the modules of %d layer trees for %s" % (len(ctx.files.trees), ctx.label),
    )
    return [DefaultInfo(files = depset([out]))]

module_manifest = rule(
    implementation = _module_manifest_impl,
    doc = "Writes `name.json` (sparkseal/core/manifest.py) over the venv that `trees` make together.",
    attrs = {
        "trees": attr.label_list(mandatory = True, doc = "wheel_install trees, in layer order."),
        "prefix": attr.string(default = "/opt/venv", doc = "The venv's path in the image."),
        "_tool": tool("//sparkseal/actions:module_manifest"),
    },
)
