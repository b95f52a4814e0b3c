"""`sbom_cyclonedx`: the CycloneDX 1.6 JSON SBOM of one platform's image, beside the SPDX 2.3 `sbom`.

Both SBOMs are written by sparkseal/actions/sbom.py from the same inputs, as two renderings of one package
list (sparkseal/core/sbom.py); this rule runs it with `--format cyclonedx-1.6`. CycloneDX 1.6 is a format
BSI TR-03183-2 names (docs/auditing.md says what the document holds and why this format).
"""

load(":common.bzl", "ACTION_ENV", "tool")
load(":platforms.bzl", "PLATFORMS")

_LOCK = attr.label(
    mandatory = True,
    allow_single_file = [".json"],
    doc = "The lock the attribute names (JSON): what the document records of that part is read from it.",
)

def _sbom_cyclonedx_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".cdx.json")
    args = ctx.actions.args()
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    args.add("--format", "cyclonedx-1.6")
    args.add("--platform", ctx.attr.platform)
    args.add("--name", ctx.attr.document_name or ctx.label.name)
    args.add("--vllm-lock", ctx.file.vllm_lock)
    args.add("--python-lock", ctx.file.python_lock)
    args.add("--debian-lock", ctx.file.debian_lock)
    args.add("--vllm-wheel", ctx.file.vllm_wheel)
    args.add_all(ctx.files.wheels, before_each = "--wheel")
    for patch in ctx.files.patches:
        args.add_all(["--patch", patch.short_path, patch])
    args.add("--out", out)
    ctx.actions.run(
        executable = ctx.executable._tool,
        arguments = [args],
        inputs = ctx.files.patches + ctx.files.wheels + [
            ctx.file.vllm_lock,
            ctx.file.python_lock,
            ctx.file.debian_lock,
            ctx.file.vllm_wheel,
        ],
        outputs = [out],
        env = ACTION_ENV,
        mnemonic = "SbomCycloneDX",
        progress_message = "Writing the CycloneDX SBOM of %s" % ctx.attr.platform,
    )
    return [DefaultInfo(files = depset([out]))]

sbom_cyclonedx = rule(
    implementation = _sbom_cyclonedx_impl,
    doc = "Writes `name.cdx.json`: the CycloneDX 1.6 SBOM of one platform's image, with the attributes " +
          "and packages of `sbom` (SPDX 2.3): every component with its SHA-256 and package URL, the image " +
          "depending on each, our vLLM's pedigree (sdist and upstream wheel, commit, the patch series). " +
          "Its bytes depend on the inputs only; its serial number is derived from its content.",
    attrs = {
        "platform": attr.string(mandatory = True, values = PLATFORMS, doc = "The platform of the image described."),
        "document_name": attr.string(doc = "The name of the image component; default: the target name."),
        "vllm_lock": _LOCK,
        "python_lock": _LOCK,
        "debian_lock": _LOCK,
        "vllm_wheel": attr.label(mandatory = True, allow_single_file = [".whl"], doc = "Our vLLM wheel."),
        "wheels": attr.label_list(allow_files = [".whl"], doc = "Other wheels the build makes."),
        "patches": attr.label_list(allow_files = [".patch"], doc = "The vLLM patch series, in order."),
        "_tool": tool("//sparkseal/actions:sbom"),
    },
)
