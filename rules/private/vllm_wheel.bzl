"""`vllm_wheel`: the upstream wheel's compiled files + our patched tree, repacked deterministically."""

load(":common.bzl", "ACTION_ENV", "tool")

def _vllm_wheel_impl(ctx):
    wheel = ctx.actions.declare_file("%s/%s" % (ctx.label.name, ctx.attr.filename))
    report = ctx.actions.declare_file("%s/report.json" % ctx.label.name)
    split = ctx.actions.declare_file("%s/split.json" % ctx.label.name)
    args = ctx.actions.args()
    args.add("--upstream", ctx.file.upstream.path)
    args.add("--pristine", ctx.file.pristine.path)
    args.add("--patched", ctx.file.patched.path)
    args.add("--commit", ctx.attr.commit)
    for patch in ctx.files.patches:
        args.add("--patch", patch)
    args.add("--out", wheel)
    args.add("--report", report)
    args.add("--split", split)
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = [ctx.file.upstream, ctx.file.pristine, ctx.file.patched] + ctx.files.patches,
        outputs = [wheel, report, split],
        env = ACTION_ENV,
        mnemonic = "VllmRepack",
        progress_message = "Repacking %s with the patched tree" % ctx.attr.filename,
    )
    return [
        DefaultInfo(files = depset([wheel])),
        # The split file: the members that differ from the upstream wheel (sparkseal/core/wheel_split.py).
        # Its bytes change only when the set of files our patches and overlay touch does, so the image
        # layer of the upstream wheel's other files is not rebuilt when a patch's content changes.
        OutputGroupInfo(report = depset([report]), split = depset([split])),
    ]

vllm_wheel = rule(
    implementation = _vllm_wheel_impl,
    doc = "Our vLLM wheel: upstream compiled files + the patched, overlaid Python tree. Output groups: " +
          "`report` (what differs between sdist and wheel), `split` (the members that differ from the " +
          "upstream wheel, for the image's two vLLM layers).",
    attrs = {
        "upstream": attr.label(
            mandatory = True,
            allow_single_file = [".whl"],
            doc = "The upstream wheel of the locked release: its compiled files are kept.",
        ),
        "filename": attr.string(mandatory = True, doc = "Output wheel file name (the upstream one)."),
        "pristine": attr.label(mandatory = True, allow_single_file = True, doc = "The vllm_source_tree (unpatched)."),
        "patched": attr.label(mandatory = True, allow_single_file = True, doc = "The vllm_patched_tree."),
        "commit": attr.string(mandatory = True, doc = "The locked commit id: the upstream wheel's version file must name it."),
        "patches": attr.label_list(allow_files = [".patch"], doc = "The patch series, in order, named in the report."),
        "_tool": tool("//sparkseal/actions:vllm_wheel"),
    },
)
