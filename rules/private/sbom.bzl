"""`sbom` (SPDX 2.3 JSON) and `sbom_cyclonedx` (CycloneDX 1.6 JSON): the SBOMs of one platform's image.

Both are written by sparkseal/actions/sbom.py from the same inputs, as two renderings of one package list
(sparkseal/core/sbom.py): one implementation here, the format a private attribute of each rule. CycloneDX
1.6 is a format BSI TR-03183-2 names (docs/auditing.md says what each document holds and why).
"""

load(":common.bzl", "ACTION_ENV", "tool")
load(":platforms.bzl", "PLATFORMS")

_LOCK = attr.label(
    mandatory = True,
    allow_single_file = [".json"],
    doc = "The lock the attribute names (JSON): what the document records of that part is read from it.",
)

# Per format: the action's --format, the output's extension, the mnemonic, the progress message's noun.
_FORMATS = {
    "spdx-2.3": (".spdx.json", "Sbom", "SBOM"),
    "cyclonedx-1.6": (".cdx.json", "SbomCycloneDX", "CycloneDX SBOM"),
}

def _sbom_impl(ctx):
    extension, mnemonic, noun = _FORMATS[ctx.attr._format]
    out = ctx.actions.declare_file(ctx.label.name + extension)
    args = ctx.actions.args()
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    if ctx.attr._format != "spdx-2.3":
        args.add("--format", ctx.attr._format)
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
        mnemonic = mnemonic,
        progress_message = "Writing the %s of %s" % (noun, ctx.attr.platform),
    )
    return [DefaultInfo(files = depset([out]))]

# The attributes both rules share (one implementation reads them); `_format` tells the two apart.
_PLATFORM = attr.string(mandatory = True, values = PLATFORMS, doc = "The platform of the image described.")
_VLLM_WHEEL = attr.label(mandatory = True, allow_single_file = [".whl"], doc = "Our vLLM wheel.")
_WHEELS = attr.label_list(allow_files = [".whl"], doc = "Other wheels the build makes.")
_PATCHES = attr.label_list(allow_files = [".patch"], doc = "The vLLM patch series, in order.")

sbom = rule(
    implementation = _sbom_impl,
    doc = "Writes `name.spdx.json`: the SPDX 2.3 SBOM of one platform's image.",
    attrs = {
        "platform": _PLATFORM,
        "document_name": attr.string(doc = "The SPDX document name; default: the target name."),
        "vllm_lock": _LOCK,
        "python_lock": _LOCK,
        "debian_lock": _LOCK,
        "vllm_wheel": _VLLM_WHEEL,
        "wheels": _WHEELS,
        "patches": _PATCHES,
        "_format": attr.string(default = "spdx-2.3"),
        "_tool": tool("//sparkseal/actions:sbom"),
    },
)

sbom_cyclonedx = rule(
    implementation = _sbom_impl,
    doc = "Writes `name.cdx.json`: the CycloneDX 1.6 SBOM of one platform's image, with the attributes " +
          "and packages of `sbom` (SPDX 2.3): every component with its SHA-256 and package URL, the image " +
          "depending on each, our vLLM's pedigree (sdist and upstream wheel, commit, the patch series). " +
          "Its bytes depend on the inputs only; its serial number is derived from its content.",
    attrs = {
        "platform": _PLATFORM,
        "document_name": attr.string(doc = "The name of the image component; default: the target name."),
        "vllm_lock": _LOCK,
        "python_lock": _LOCK,
        "debian_lock": _LOCK,
        "vllm_wheel": _VLLM_WHEEL,
        "wheels": _WHEELS,
        "patches": _PATCHES,
        "_format": attr.string(default = "cyclonedx-1.6"),
        "_tool": tool("//sparkseal/actions:sbom"),
    },
)
