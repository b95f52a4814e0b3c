"""Rules that build the patched vLLM source tree: unpack the locked sdist, apply the series, overlay."""

load(":common.bzl", "ACTION_ENV", "tool")

def _vllm_source_tree_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    sdist = ctx.file.sdist
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [
            "--sdist",
            sdist.path,
            "--version",
            ctx.attr.version,
            "--commit",
            ctx.attr.commit,
            "--out",
            out.path,
        ],
        inputs = [sdist],
        outputs = [out],
        env = ACTION_ENV,
        mnemonic = "VllmUnpack",
        progress_message = "Unpacking %s (checking commit %s)" % (sdist.basename, ctx.attr.commit[:12]),
    )
    return [DefaultInfo(files = depset([out]))]

vllm_source_tree = rule(
    implementation = _vllm_source_tree_impl,
    doc = "The `vllm/` package of the locked sdist as a tree artifact, after checking its commit id.",
    attrs = {
        "sdist": attr.label(mandatory = True, allow_single_file = [".tar.gz"], doc = "The locked vLLM sdist."),
        "version": attr.string(mandatory = True, doc = "The locked vLLM version: the sdist's top folder is vllm-VERSION."),
        "commit": attr.string(
            mandatory = True,
            doc = "The locked commit id (full or abbreviated): the sdist's version file must name it.",
        ),
        "_tool": tool("//sparkseal/actions:vllm_source_tree"),
    },
)

def _overlay_path(ctx, f):
    # Overlay paths are relative to the directory that holds the manifest.
    root = ctx.file.overlay_manifest.short_path.rpartition("/")[0]
    if not f.short_path.startswith(root + "/"):
        fail("sparkseal: overlay file %s is not under %s, the manifest's directory" % (f.short_path, root))
    return f.short_path[len(root) + 1:]

def _vllm_patched_tree_impl(ctx):
    tree = ctx.file.src
    patches = ctx.files.patches

    # One action per patch: changing patch N re-runs patches N.. only; 1..N-1 come from the cache.
    for index, patch in enumerate(patches):
        step = ctx.actions.declare_directory("%s.%d" % (ctx.label.name, index + 1))
        ctx.actions.run(
            executable = ctx.executable._patch_tool,
            arguments = ["--src", tree.path, "--patch", patch.path, "--out", step.path],
            inputs = [tree, patch],
            outputs = [step],
            env = ACTION_ENV,
            mnemonic = "VllmPatch",
            progress_message = "Applying patch %d/%d %s" % (index + 1, len(patches), patch.basename),
        )
        tree = step

    out = ctx.actions.declare_directory(ctx.label.name)
    args = ctx.actions.args()
    args.add("--src", tree.path)
    args.add("--manifest", ctx.file.overlay_manifest.path)
    for f in ctx.files.overlay:
        args.add("--file", "%s=%s" % (_overlay_path(ctx, f), f.path))
    for patch in patches:
        args.add("--patch", patch.path)
    args.add("--out", out.path)
    ctx.actions.run(
        executable = ctx.executable._overlay_tool,
        arguments = [args],
        inputs = [tree, ctx.file.overlay_manifest] + ctx.files.overlay + patches,
        outputs = [out],
        env = ACTION_ENV,
        mnemonic = "VllmOverlay",
        progress_message = "Overlaying %d downstream files onto the patched vLLM tree" % len(ctx.files.overlay),
    )
    return [DefaultInfo(files = depset([out]))]

vllm_patched_tree = rule(
    implementation = _vllm_patched_tree_impl,
    doc = "Applies `patches` in order (one action each) to `src`, then the overlay.",
    attrs = {
        "src": attr.label(mandatory = True, allow_single_file = True, doc = "A vllm_source_tree."),
        "patches": attr.label_list(allow_files = [".patch"], doc = "The series, in order."),
        "overlay": attr.label_list(allow_files = True, doc = "Downstream files, beside the manifest."),
        "overlay_manifest": attr.label(
            mandatory = True,
            allow_single_file = [".json"],
            doc = "The overlay's manifest; `overlay` paths are relative to its directory.",
        ),
        "_patch_tool": tool("//sparkseal/actions:vllm_patched_tree_patch"),
        "_overlay_tool": tool("//sparkseal/actions:vllm_patched_tree_overlay"),
    },
)
