"""The image's composition, in one place: which layers, in which order, holding what (`sparkseal_image`).

Layers are ordered by how often they change, bottom first, so that a change rebuilds the layers above it
only: the Debian base (locked .debs), torch and NVIDIA's CUDA wheels (large, released together), every
other locked wheel, our vLLM wheel as two layers (`vllm`: the upstream wheel's files that we leave as they
are; `vllm_patched`: the files our patches and overlay change or add, their bytecode and the .dist-info),
the sparkseal wheel, and the app layer with the module manifest and the SBOM in both formats. `layer_of`
(rules/private/wheel_layers.bzl) splits the locked wheels between the two wheel layers; the python_lock
hub's `WHEELS_BY_LAYER` is computed with it.
"""

load(":module_manifest.bzl", "module_manifest")
load(":oci_image.bzl", "oci_image")
load(":oci_layer.bzl", "oci_layer")
load(":python_venv.bzl", "python_venv")
load(":sbom.bzl", "sbom", "sbom_cyclonedx")
load(":wheel_layers.bzl", "DEPS_LAYER", "TORCH_LAYER")

VENV = "/opt/venv"

# Debian's interpreter is the venv's python: the venv carries links to it, not a copy.
PYTHON_LINKS = {
    VENV + "/bin/python": "/usr/bin/python3.11",
    VENV + "/bin/python3": "/usr/bin/python3.11",
    VENV + "/bin/python3.11": "/usr/bin/python3.11",
}

def _venv_layers(platform, wheels_by_layer, vllm):
    """(layer, wheels, split file, split part) of the installed layers, bottom first.

    Our vLLM wheel is two layers: the upstream wheel without the files the split names, which keeps its
    inputs when a patch's content changes (so neither Bazel nor a registry sees a new blob), and ours with
    only those files (sparkseal/core/wheel_split.py).
    """
    split = "//third_party/vllm:wheel_%s_split" % platform
    return [
        (TORCH_LAYER, wheels_by_layer[platform][TORCH_LAYER], None, ""),
        (DEPS_LAYER, wheels_by_layer[platform][DEPS_LAYER], None, ""),
        ("vllm", [vllm.upstream_wheel_repos[platform]], split, "lower"),
        ("vllm_patched", ["//third_party/vllm:wheel_" + platform], split, "upper"),
        ("sparkseal", ["//kernels_sm121:wheel_" + platform], None, ""),
    ]

def sparkseal_image(platform, wheels_by_layer, vllm, patches, debian_lock, scan_allow, visibility = None):
    """Every target of one platform's image: `image_<platform>` and what it is made of.

    Targets: `manifest_<platform>` (module manifest), `sbom_<platform>` (SPDX 2.3),
    `sbom_cyclonedx_<platform>` (CycloneDX 1.6), `layer_<layer>_<platform>` for
    base, torch, deps, vllm, vllm_patched, sparkseal and app, `venv_<layer>_<platform>` (python_venv)
    for each of those that installs wheels, and `image_<platform>` with
    `image_<platform>.load` and `image_<platform>.push`. The wheel layers install their wheels inside the layer action: no installed
    tree is an output (bench/results/image.md, "Disk", has what that saves).

    Args:
      platform: `linux_aarch64` or `linux_x86_64`; every target name ends with it.
      wheels_by_layer: platform -> wheel layer (`torch`, `deps`) -> wheel labels: the python_lock hub's
        `WHEELS_BY_LAYER` (`@python_deps//:requirements.bzl`).
      vllm: the vLLM lock's `VLLM` (`@vllm_lock//:lock.bzl`): version, commit and upstream wheels.
      patches: the patch series in order, `PATCHES` of `@vllm_patches//:series.bzl` (recorded in the SBOM).
      debian_lock: the Debian lock of the platform's base layer (recorded in the SBOM).
      scan_allow: the allow-list of every layer's secret scan.
      visibility: the visibility of every target.
    """
    venv_layers = _venv_layers(platform, wheels_by_layer, vllm)
    module_manifest(
        name = "manifest_" + platform,
        layers = [":layer_%s_%s" % (layer, platform) for layer, _, _, _ in venv_layers],
        visibility = visibility,
    )

    # The SBOM: every Debian package and wheel the image installs, and what our vLLM wheel is made of, in
    # two formats from the same inputs: SPDX 2.3 and CycloneDX 1.6 (the one BSI TR-03183-2 names).
    sbom_inputs = dict(
        debian_lock = debian_lock,
        document_name = "sparkseal-vllm-%s-%s" % (vllm.version, platform),
        patches = patches,
        platform = platform,
        python_lock = "//third_party/python:requirements_%s.files.json" % platform,
        vllm_lock = "//third_party/vllm:vllm.lock.json",
        vllm_wheel = "//third_party/vllm:wheel_" + platform,
        wheels = ["//kernels_sm121:wheel_" + platform],
        visibility = visibility,
    )
    sbom(name = "sbom_" + platform, **sbom_inputs)
    sbom_cyclonedx(name = "sbom_cyclonedx_" + platform, **sbom_inputs)

    oci_layer(
        name = "layer_base_" + platform,
        rootfs = "//third_party/debian:rootfs_" + platform,
        scan_allow = scan_allow,
        visibility = visibility,
    )
    for layer, wheels, split, split_part in venv_layers:
        python_venv(
            name = "venv_%s_%s" % (layer, platform),
            bytecode = True,
            installer = "@python_tools_any_installer//file",
            path = VENV,
            platform = platform,
            pyvenv_cfg = layer == TORCH_LAYER,
            replaces = "//third_party/python:replaces.json",
            split = split,
            split_part = split_part,
            wheels = wheels,
            visibility = visibility,
        )
        oci_layer(
            name = "layer_%s_%s" % (layer, platform),
            scan_allow = scan_allow,
            symlinks = PYTHON_LINKS if layer == TORCH_LAYER else {},
            venv = ":venv_%s_%s" % (layer, platform),
            visibility = visibility,
        )
    oci_layer(
        name = "layer_app_" + platform,
        scan_allow = scan_allow,
        files = {
            ":manifest_" + platform: "/opt/sparkseal/manifest.json",
            ":sbom_" + platform: "/opt/sparkseal/sbom.spdx.json",
            ":sbom_cyclonedx_" + platform: "/opt/sparkseal/sbom.cdx.json",
        },
        visibility = visibility,
    )

    oci_image(
        name = "image_" + platform,
        entrypoint = [VENV + "/bin/sparkseal", "serve"],
        env = {
            "LANG": "C.UTF-8",
            "PATH": VENV + "/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            # The module check treats bytecode written at run time as foreign files.
            "PYTHONDONTWRITEBYTECODE": "1",
            "VIRTUAL_ENV": VENV,
        },
        # No revision label here: that names the source of the image, this repository's commit, which
        # `--stamp` adds (rules/private/oci_image.bzl). vLLM's commit is vLLM's, and is said so.
        labels = {
            "org.opencontainers.image.description": "vLLM %s (commit %s) with sparkseal's patches, for GB10" % (
                vllm.version,
                vllm.commit,
            ),
            "org.opencontainers.image.title": "sparkseal vLLM",
            "org.opencontainers.image.version": vllm.version,
        },
        layers = [
            ":layer_%s_%s" % (layer, platform)
            for layer in ["base"] + [layer for layer, _, _, _ in venv_layers] + ["app"]
        ],
        platform = platform,
        tag = "sparkseal/vllm:%s-%s" % (vllm.version, platform),
        visibility = visibility,
    )
