"""`module_manifest`: sha256 of every file of the image's virtual environment, per distribution."""

load(":common.bzl", "ACTION_ENV", "label_string", "tool")
load(":oci_layer.bzl", "OciLayerInfo")

def _module_manifest_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".json")
    parts = [layer[OciLayerInfo].modules for layer in ctx.attr.layers]
    if ctx.files.trees and parts:
        fail("sparkseal: %s: give trees or layers, not both" % label_string(ctx.label))
    if not ctx.files.trees and not parts:
        fail("sparkseal: %s: expected trees or layers, got neither" % label_string(ctx.label))
    for layer, part in zip(ctx.attr.layers, parts):
        if part == None:
            fail("sparkseal: %s: layer %s installs no wheels, so it has no module manifest" % (label_string(ctx.label), label_string(layer.label)))
    args = ctx.actions.args()
    for tree in ctx.files.trees:
        args.add("--tree", tree.path)
    if ctx.files.trees:
        args.add("--prefix", ctx.attr.prefix)
    for part in parts:
        args.add("--part", part)
    args.add("--out", out)
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = ctx.files.trees + parts,
        outputs = [out],
        env = ACTION_ENV,
        mnemonic = "ModuleManifest",
        progress_message = "Writing the module manifest %s" % ctx.label,
    )
    return [DefaultInfo(files = depset([out]))]

module_manifest = rule(
    implementation = _module_manifest_impl,
    doc = "Writes `name.json` (sparkseal/core/manifest.py) over the venv that `trees` or `layers` make together.",
    attrs = {
        "trees": attr.label_list(doc = "Tree artifacts holding the venv at `prefix`, in layer order."),
        "layers": attr.label_list(
            providers = [OciLayerInfo],
            doc = "oci_layer targets with wheels, in layer order: their own manifests are merged.",
        ),
        "prefix": attr.string(default = "/opt/venv", doc = "The venv's path in the image."),
        "_tool": tool("//sparkseal/actions:module_manifest"),
    },
)
