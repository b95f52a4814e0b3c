"""Public API of sparkseal's Bazel rules."""

load("//rules/private:cuda_toolkit.bzl", _cuda_toolkit = "cuda_toolkit")
load("//rules/private:kernels_wheel.bzl", _cuda_archs_setting = "cuda_archs_setting", _kernels_wheel = "kernels_wheel")
load("//rules/private:patch_series.bzl", _patch_series = "patch_series")
load("//rules/private:pypi_file.bzl", _pypi_file = "pypi_file")
load("//rules/private:vllm_lock.bzl", _vllm_lock = "vllm_lock")
load("//rules/private:vllm_tree.bzl", _vllm_patched_tree = "vllm_patched_tree", _vllm_source_tree = "vllm_source_tree")
load("//rules/private:vllm_wheel.bzl", _vllm_wheel = "vllm_wheel")

cuda_archs_setting = _cuda_archs_setting
cuda_toolkit = _cuda_toolkit
kernels_wheel = _kernels_wheel
patch_series = _patch_series
pypi_file = _pypi_file
vllm_lock = _vllm_lock
vllm_patched_tree = _vllm_patched_tree
vllm_source_tree = _vllm_source_tree
vllm_wheel = _vllm_wheel
