"""`sparkseal_pex`: wheels -> a reproducible packed PEX directory for one platform, in one sandboxed action.

    load("@python_deps//:requirements.bzl", "WHEELS")
    load("//rules/private:pex.bzl", "sparkseal_pex")

    sparkseal_pex(
        name = "pex_linux_aarch64",
        platform = "linux_aarch64",
        script = "vllm",
        wheels = WHEELS["linux_aarch64"] + ["//third_party/vllm:wheel_linux_aarch64"],
    )

Outputs `<name>.pex/` (a `--layout packed` PEX: run `<name>.pex/__main__.py` or `python3.11 <name>.pex`)
and `<name>.pex.digest` (`sha256:<hex>` of the tree's sha256sum-style listing). pex runs with no index
and no find-links: every wheel is a pre-resolved distribution pinned by its version, and the wheels must
form a closure for the platform's complete platform (`//third_party/python/complete_platforms`). The
`pex` wheel comes from the locked build tools. See sparkseal/actions/sparkseal_pex.py.
"""

load(":common.bzl", "ACTION_ENV", "label_string", "tool")
load(":platforms.bzl", "PLATFORMS")

SparksealPexInfo = provider(
    doc = "A PEX written by sparkseal_pex.",
    fields = {
        "pex": "File: the packed PEX directory `<name>.pex/`",
        "digest": "File: its tree digest (sha256:...), as `sparkseal provenance check` re-derives it",
    },
)

def _sparkseal_pex_impl(ctx):
    if bool(ctx.attr.script) == bool(ctx.attr.entry_point):
        fail("sparkseal_pex %s: set exactly one of script and entry_point" % label_string(ctx.label))
    out = ctx.actions.declare_directory(ctx.label.name + ".pex")
    digest = ctx.actions.declare_file(ctx.label.name + ".pex.digest")
    complete_platform = ctx.file.complete_platform
    if complete_platform == None:
        complete_platform = ctx.files._complete_platforms[PLATFORMS.index(ctx.attr.platform)]
    args = ctx.actions.args()
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    args.add("--platform", ctx.attr.platform)
    args.add("--pex", ctx.file.pex)
    args.add("--complete-platform", complete_platform)
    args.add("--python-shebang", ctx.attr.python_shebang)
    if ctx.attr.script:
        args.add("--script", ctx.attr.script)
    else:
        args.add("--entry-point", ctx.attr.entry_point)
    if ctx.attr.venv:
        args.add("--venv")
    args.add("--out", out.path)
    args.add("--digest", digest)
    args.add_all(ctx.files.wheels, before_each = "--wheel")
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = ctx.files.wheels + [ctx.file.pex, complete_platform],
        outputs = [out, digest],
        env = ACTION_ENV,
        mnemonic = "PexBuild",
        progress_message = "Packing %d wheels for %s into %s" % (len(ctx.files.wheels), ctx.attr.platform, out.short_path),
        execution_requirements = {"block-network": "1"},
    )
    return [
        DefaultInfo(files = depset([out, digest])),
        SparksealPexInfo(pex = out, digest = digest),
    ]

sparkseal_pex = rule(
    implementation = _sparkseal_pex_impl,
    doc = "Builds `<name>.pex/` (packed layout) and `<name>.pex.digest` from wheels for one platform.",
    attrs = {
        "platform": attr.string(mandatory = True, values = PLATFORMS, doc = "Target wheel platform."),
        "wheels": attr.label_list(allow_files = [".whl"], mandatory = True, doc = "Every wheel of the PEX (a closure)."),
        "script": attr.string(doc = "Console script of one of the wheels that the PEX runs (e.g. `vllm`)."),
        "entry_point": attr.string(doc = "`module[:function]` that the PEX runs, instead of a script."),
        "python_shebang": attr.string(default = "/usr/bin/python3.11", doc = "Interpreter of the PEX."),
        "venv": attr.bool(
            default = True,
            doc = "Run in venv mode: the first run makes a venv under PEX_ROOT, so processes started " +
                  "with sys.executable see the same distributions and scripts are on PATH.",
        ),
        "complete_platform": attr.label(
            allow_single_file = [".json"],
            doc = "pex complete platform JSON; default: //third_party/python/complete_platforms:<platform>.json.",
        ),
        "pex": attr.label(
            default = Label("@python_tools_any_pex//file"),
            allow_single_file = [".whl"],
            doc = "The locked `pex` wheel (from the python_tools hub).",
        ),
        "_complete_platforms": attr.label_list(
            default = [
                Label("//third_party/python/complete_platforms:linux_aarch64.json"),
                Label("//third_party/python/complete_platforms:linux_x86_64.json"),
            ],
            allow_files = [".json"],
        ),
        "_tool": tool("//sparkseal/actions:sparkseal_pex"),
    },
)
