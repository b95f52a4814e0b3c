"""Public API of sparkseal's Bazel rules."""

load("//rules/private:cuda_toolkit.bzl", _cuda_toolkit = "cuda_toolkit")
load("//rules/private:debian.bzl", _DebianRootfsInfo = "DebianRootfsInfo", _debian_packages = "debian_packages", _debian_rootfs = "debian_rootfs")
load("//rules/private:image.bzl", _sparkseal_image = "sparkseal_image")
load("//rules/private:host_wheel.bzl", _host_wheel = "host_wheel")
load("//rules/private:kernels_wheel.bzl", _cuda_archs_setting = "cuda_archs_setting", _kernels_wheel = "kernels_wheel")
load("//rules/private:module_manifest.bzl", _module_manifest = "module_manifest")
load("//rules/private:oci_image.bzl", _oci_image = "oci_image", _oci_load = "oci_load", _oci_push = "oci_push")
load("//rules/private:oci_image_index.bzl", _oci_image_index = "oci_image_index")
load("//rules/private:oci_layer.bzl", _layer_compression = "layer_compression", _oci_layer = "oci_layer")
load("//rules/private:patch_series.bzl", _patch_series = "patch_series")
load("//rules/private:pex.bzl", _SparksealPexInfo = "SparksealPexInfo", _sparkseal_pex = "sparkseal_pex")
load("//rules/private:platforms.bzl", _CONSTRAINTS = "CONSTRAINTS", _DEBIAN_ARCHITECTURES = "DEBIAN_ARCHITECTURES", _PLATFORMS = "PLATFORMS")
load("//rules/private:provenance.bzl", _provenance = "provenance")
load("//rules/private:pypi_file.bzl", _pypi_file = "pypi_file")
load("//rules/private:python_lock.bzl", _python_lock = "python_lock")
load("//rules/private:python_venv.bzl", _VenvInfo = "VenvInfo", _python_venv = "python_venv")
load("//rules/private:sbom.bzl", _sbom = "sbom", _sbom_cyclonedx = "sbom_cyclonedx")
load("//rules/private:secret_scanner.bzl", _secret_scanner = "secret_scanner")
load("//rules/private:repositories.bzl", _sparkseal_repositories = "sparkseal_repositories", _sparkseal_toolchains = "sparkseal_toolchains")
load("//rules/private:toolchains.bzl", _SparksealCcInfo = "SparksealCcInfo", _locked_toolchain = "locked_toolchain", _sparkseal_cc_toolchain = "sparkseal_cc_toolchain", _sparkseal_toolchain_locks = "sparkseal_toolchain_locks")
load("//rules/private:vllm_lock.bzl", _vllm_lock = "vllm_lock")
load("//rules/private:vllm_tree.bzl", _vllm_patched_tree = "vllm_patched_tree", _vllm_source_tree = "vllm_source_tree")
load("//rules/private:vllm_wheel.bzl", _vllm_wheel = "vllm_wheel")

CONSTRAINTS = _CONSTRAINTS
DEBIAN_ARCHITECTURES = _DEBIAN_ARCHITECTURES
DebianRootfsInfo = _DebianRootfsInfo
PLATFORMS = _PLATFORMS
SparksealCcInfo = _SparksealCcInfo
SparksealPexInfo = _SparksealPexInfo
VenvInfo = _VenvInfo
cuda_archs_setting = _cuda_archs_setting
cuda_toolkit = _cuda_toolkit
debian_packages = _debian_packages
debian_rootfs = _debian_rootfs
host_wheel = _host_wheel
kernels_wheel = _kernels_wheel
layer_compression = _layer_compression
locked_toolchain = _locked_toolchain
module_manifest = _module_manifest
oci_image = _oci_image
oci_image_index = _oci_image_index
oci_layer = _oci_layer
oci_load = _oci_load
oci_push = _oci_push
patch_series = _patch_series
provenance = _provenance
pypi_file = _pypi_file
python_lock = _python_lock
python_venv = _python_venv
sbom = _sbom
sbom_cyclonedx = _sbom_cyclonedx
secret_scanner = _secret_scanner
sparkseal_cc_toolchain = _sparkseal_cc_toolchain
sparkseal_image = _sparkseal_image
sparkseal_pex = _sparkseal_pex
sparkseal_repositories = _sparkseal_repositories
sparkseal_toolchain_locks = _sparkseal_toolchain_locks
sparkseal_toolchains = _sparkseal_toolchains
vllm_lock = _vllm_lock
vllm_patched_tree = _vllm_patched_tree
vllm_source_tree = _vllm_source_tree
vllm_wheel = _vllm_wheel
