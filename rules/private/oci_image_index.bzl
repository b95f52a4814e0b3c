"""`oci_image_index`: an OCI image index over oci_images of different platforms, and its `.push` target."""

load(":common.bzl", "ACTION_ENV", "tool")
load(":oci_image.bzl", "OciImageIndexInfo", "OciImageInfo", "oci_push")

def _oci_image_index_impl(ctx):
    index = ctx.actions.declare_file(ctx.label.name + ".json")
    digest = ctx.actions.declare_file(ctx.label.name + ".digest")
    layouts = [image[OciImageInfo].layout for image in ctx.attr.images]
    args = ctx.actions.args()
    args.add_all(layouts, before_each = "--image", expand_directories = False)
    args.add_all(["--index", index, "--digest", digest])
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = layouts,
        outputs = [index, digest],
        env = ACTION_ENV,
        mnemonic = "OciImageIndex",
        progress_message = "Writing image index %s" % ctx.label,
    )
    return [
        DefaultInfo(files = depset([index, digest])),
        OciImageIndexInfo(
            digest = digest,
            index = index,
            layouts = layouts,
            blobs = depset(transitive = [image[OciImageInfo].blobs for image in ctx.attr.images]),
        ),
    ]

_oci_image_index = rule(
    implementation = _oci_image_index_impl,
    doc = "An OCI image index `name.json` (and `name.digest`) over oci_images of different platforms. " +
          "It holds no blobs: `name.push` reads them from the images' layouts and layer blobs.",
    attrs = {
        "images": attr.label_list(mandatory = True, providers = [OciImageInfo], doc = "One per platform."),
        "_tool": tool("//sparkseal/actions:oci_image_index"),
    },
)

def oci_image_index(name, images, visibility = None, tags = None, testonly = None):
    """An oci_image_index `name` plus its `name.push` runnable target."""
    _oci_image_index(name = name, images = images, visibility = visibility, tags = tags, testonly = testonly)
    oci_push(name = name + ".push", image = ":" + name, visibility = visibility, tags = tags, testonly = testonly)
