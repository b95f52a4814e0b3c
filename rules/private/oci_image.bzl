"""`oci_image` (layout directory, digest), `oci_load` and `oci_push` (its `bazel run` targets)."""

load(":common.bzl", "ACTION_ENV", "label_string", "tool")
load(":oci_layer.bzl", "OciLayerInfo", "zstd_package")

OciImageInfo = provider(
    doc = "An image written by oci_image.",
    fields = {
        "digest": "File: the image manifest digest (sha256:...)",
        "layout": "File: OCI image layout directory: documents only; its layer blobs are `blobs`",
        "blobs": "depset of File: the layer blobs the layout names in sparkseal-external-blobs.json " +
                 "(paths relative to the layout); readers need them beside it, e.g. in runfiles",
        "tag": "string: REPOSITORY:TAG of the image",
    },
)

OciImageIndexInfo = provider(
    doc = "An image index written by oci_image_index.",
    fields = {
        "digest": "File: the index digest (sha256:...)",
        "index": "File: the index document (application/vnd.oci.image.index.v1+json)",
        "layouts": "list of File: the image layout directories, in index order",
        "blobs": "depset of File: the layer blobs of every image (see OciImageInfo.blobs)",
    },
)

def _oci_image_impl(ctx):
    layout = ctx.actions.declare_directory(ctx.label.name)
    digest = ctx.actions.declare_file(ctx.label.name + ".digest")
    tag = ctx.attr.tag or "sparkseal/%s:latest" % ctx.label.name
    args = ctx.actions.args()
    inputs = []
    for layer in ctx.attr.layers:
        info = layer[OciLayerInfo]

        # The blob's path only: the layout names it (sparkseal-external-blobs.json) and never reads it, so
        # a cache hit on the image downloads no layer.
        args.add_all(["--layer", label_string(layer.label), info.descriptor, info.blob.path])
        inputs.append(info.descriptor)

        # Not read by the image writer: an input so that no image is assembled from a layer whose scan
        # found a secret (the scan action then writes no report and fails).
        if info.scan_report:
            inputs.append(info.scan_report)
    args.add("--platform", ctx.attr.platform)
    args.add("--tag", tag)
    args.add_all(ctx.attr.entrypoint, format_each = "--entrypoint=%s")
    args.add_all(ctx.attr.cmd, format_each = "--cmd=%s")
    args.add_all(["%s=%s" % item for item in ctx.attr.env.items()], format_each = "--env=%s")
    args.add_all(["%s=%s" % item for item in ctx.attr.labels.items()], format_each = "--label=%s")
    if ctx.attr.workdir:
        args.add("--workdir", ctx.attr.workdir)
    if ctx.attr.user:
        args.add("--user", ctx.attr.user)

    # Only with --stamp does the image read Bazel's stable status file (its revision label: this
    # repository's commit); otherwise a new commit leaves the image's digest as it is.
    if ctx.attr.stamp:
        args.add("--revision-from", ctx.info_file)
        inputs.append(ctx.info_file)
    args.add_all(["--layout", layout.path, "--digest", digest], expand_directories = False)
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = inputs,
        outputs = [layout, digest],
        env = ACTION_ENV,
        mnemonic = "OciImage",
        progress_message = "Assembling image %s (%s)" % (tag, ctx.attr.platform),
    )
    blobs = depset([layer[OciLayerInfo].blob for layer in ctx.attr.layers])
    return [
        DefaultInfo(files = depset([layout, digest])),
        OciImageInfo(digest = digest, layout = layout, blobs = blobs, tag = tag),
        OutputGroupInfo(digest = depset([digest]), layout = depset([layout]), blobs = blobs),
    ]

_oci_image = rule(
    implementation = _oci_image_impl,
    doc = "An OCI image: layout directory `name` and manifest digest `name.digest`, kilobytes: the layout " +
          "names its layer blobs where the layer actions wrote them (output group `blobs`; `name.load` and " +
          "`name.push` carry them as runfiles). No docker-archive: `name.load` streams one when run, and " +
          "`bazel run name.load -- --oci-layout DIR` writes an ordinary, complete OCI layout.",
    attrs = {
        "layers": attr.label_list(mandatory = True, providers = [OciLayerInfo], doc = "Bottom first."),
        "platform": attr.string(mandatory = True, doc = "linux_aarch64 or linux_x86_64."),
        "tag": attr.string(doc = "REPOSITORY:TAG; default sparkseal/NAME:latest."),
        "entrypoint": attr.string_list(doc = "The image config's Entrypoint: the command a container runs."),
        "cmd": attr.string_list(doc = "The image config's Cmd: default arguments after the entrypoint."),
        "env": attr.string_dict(doc = "Environment variable -> value, in the image config's Env."),
        "labels": attr.string_dict(doc = "The image config's Labels (e.g. org.opencontainers.image.*)."),
        "workdir": attr.string(doc = "The image config's WorkingDir; unset: the engine's default (/)."),
        "user": attr.string(doc = "The image config's User (NAME, UID or UID:GID); unset: root."),
        "stamp": attr.bool(
            doc = "Label org.opencontainers.image.revision with this repository's commit (`-dirty` for a " +
                  "tree with uncommitted changes), from Bazel's stable status file; `oci_image` sets it " +
                  "when the build runs with `--stamp`. Off, the image names no revision.",
        ),
        "_tool": tool("//sparkseal/actions:oci_image"),
    },
)

_LOAD_SCRIPT = """#!/usr/bin/env bash
# Loads {tag} into podman (docker when podman is absent); with `-- --output FILE` writes a docker-archive
# to FILE instead, with `-- --oci-layout DIR` a complete OCI layout. Written by oci_load.
set -euo pipefail
runfiles="${{RUNFILES_DIR:-$0.runfiles}}/{workspace}"
runfiles=$(cd "$runfiles" && pwd)
tool=("$runfiles/{tool}" --layout "$runfiles/{layout}" --tag "{tag}"{zstd})
if [ "$#" -gt 0 ]; then
    cd "${{BUILD_WORKING_DIRECTORY:-.}}"
    exec "${{tool[@]}}" "$@"
fi
if command -v podman >/dev/null && command -v skopeo >/dev/null; then
    # podman's own store, from a complete OCI layout of hard links: `podman load` would first copy the
    # whole archive from its standard input into a temporary file (GBs of disk for a moment).
    scratch=$(mktemp -d "${{TMPDIR:-/var/tmp}}/sparkseal-load.XXXXXX")
    trap 'rm -rf "$scratch"' EXIT
    "${{tool[@]}}" --oci-layout "$scratch/layout"
    skopeo copy --quiet "oci:$scratch/layout" "containers-storage:{storage_name}"
    echo "Loaded image: {storage_name}"
elif engine=$(command -v podman || command -v docker); then
    "${{tool[@]}}" | "$engine" load
else
    echo "oci_load: neither podman nor docker is on PATH; write the archive with -- --output FILE" >&2
    exit 1
fi
echo "{tag}: manifest $(cat "$runfiles/{digest}")"
"""

def _storage_name(tag):
    # What podman calls an image tagged without a registry: `localhost/` is prefixed, as `podman load` does.
    first = tag.split("/")[0]
    if "/" in tag and ("." in first or ":" in first or first == "localhost"):
        return tag
    return "localhost/" + tag

def _oci_load_impl(ctx):
    image = ctx.attr.image[OciImageInfo]
    script = ctx.actions.declare_file(ctx.label.name + ".sh")

    # With zstd layers (--//rules:layer_compression=zstd) a docker-archive gets their tars decompressed.
    package = zstd_package(ctx.files._zstd_module)
    zstd = ' --zstd-site "$runfiles/%s"' % package.short_path.rpartition("/zstandard/")[0] if package else ""
    ctx.actions.write(
        output = script,
        content = _LOAD_SCRIPT.format(
            zstd = zstd,
            digest = image.digest.short_path,
            layout = image.layout.short_path,
            storage_name = _storage_name(image.tag),
            tag = image.tag,
            tool = ctx.executable._loader.short_path,
            workspace = ctx.workspace_name,
        ),
        is_executable = True,
    )
    runfiles = ctx.runfiles(
        files = [image.layout, image.digest, ctx.executable._loader] + ctx.files._zstd_module,
        transitive_files = image.blobs,
    )
    runfiles = runfiles.merge(ctx.attr._loader[DefaultInfo].default_runfiles)
    return [DefaultInfo(executable = script, runfiles = runfiles)]

oci_load = rule(
    implementation = _oci_load_impl,
    doc = "`bazel run` target: stream an oci_image's docker-archive into `podman load` (or `docker load`), " +
          "or with `-- --output FILE` into a file.",
    executable = True,
    attrs = {
        "image": attr.label(mandatory = True, providers = [OciImageInfo], doc = "The oci_image to load."),
        "_loader": attr.label(default = Label("//sparkseal/actions:oci_load"), executable = True, cfg = "target"),
        "_zstd_module": attr.label(default = Label("//rules:zstd_module")),
    },
)

_PUSH_SCRIPT = """#!/usr/bin/env bash
# Pushes {what} to the registry named on the command line. Written by oci_push.
set -euo pipefail
runfiles="${{RUNFILES_DIR:-$0.runfiles}}/{workspace}"
if [ "$#" -eq 0 ]; then
    echo "usage: bazel run {label} -- REGISTRY/REPOSITORY[:TAG] [--plain-http] [--json] [--blob-cache URL]" >&2
    exit 2
fi
exec "$runfiles/{tool}" {args} "$@"
"""

def _oci_push_impl(ctx):
    target = ctx.attr.image
    if OciImageIndexInfo in target:
        info = target[OciImageIndexInfo]
        layouts, files, blobs = info.layouts, [info.index], info.blobs
        args = ["--index", "\"$runfiles/%s\"" % info.index.short_path]
    else:
        image = target[OciImageInfo]
        layouts, files, blobs, args = [image.layout], [], image.blobs, []
    for layout in layouts:
        args += ["--layout", "\"$runfiles/%s\"" % layout.short_path]
    script = ctx.actions.declare_file(ctx.label.name + ".sh")
    ctx.actions.write(
        output = script,
        content = _PUSH_SCRIPT.format(
            args = " ".join(args),
            label = str(ctx.label),
            tool = ctx.executable._pusher.short_path,
            what = str(target.label),
            workspace = ctx.workspace_name,
        ),
        is_executable = True,
    )
    runfiles = ctx.runfiles(files = layouts + files + [ctx.executable._pusher], transitive_files = blobs)
    runfiles = runfiles.merge(ctx.attr._pusher[DefaultInfo].default_runfiles)
    return [DefaultInfo(executable = script, runfiles = runfiles)]

oci_push = rule(
    implementation = _oci_push_impl,
    doc = "`bazel run` target: push an oci_image or oci_image_index to `REGISTRY/REPOSITORY[:TAG]`, " +
          "uploading only the blobs the registry lacks.",
    executable = True,
    attrs = {
        "image": attr.label(
            mandatory = True,
            providers = [[OciImageInfo], [OciImageIndexInfo]],
            doc = "The oci_image or oci_image_index to push (an index pushes its images first).",
        ),
        "_pusher": attr.label(default = Label("//sparkseal/actions:oci_push"), executable = True, cfg = "target"),
    },
)

def oci_image(name, visibility = None, tags = None, testonly = None, **kwargs):
    """An oci_image `name` plus its runnable targets `name.load` and `name.push` (oci_load, oci_push).

    The image is stamped (label org.opencontainers.image.revision: this repository's commit) when the
    build runs with `--stamp`, and only then.
    """
    _oci_image(
        name = name,
        stamp = select({str(Label("//rules:stamped")): True, "//conditions:default": False}),
        visibility = visibility,
        tags = tags,
        testonly = testonly,
        **kwargs
    )
    oci_load(name = name + ".load", image = ":" + name, visibility = visibility, tags = tags, testonly = testonly)
    oci_push(name = name + ".push", image = ":" + name, visibility = visibility, tags = tags, testonly = testonly)
