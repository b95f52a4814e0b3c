"""`cuda_toolkit`: the kernel toolchain, assembled from locked wheels (never from the machine's CUDA).

WORKSPACE use::

    cuda_toolkit(name = "sparkseal_cuda", lock = "//third_party/cuda:toolchain.lock.json")

The host tools (nvcc, cicc, ptxas, cuobjdump, cmake, ninja) are those of the build host, x86_64 or
aarch64 (`host` overrides the detected one); the CUDA runtime is unpacked for both targets. Each wheel
is named in the lock (`python3 -m sparkseal.fetch.lock_wheels` writes it), fetched by filename and sha256
through `download_locked_file` and unpacked into this layout:

    cuda/bin/                      nvcc, ptxas, cudafe++, fatbinary, nvlink   (nvidia-cuda-nvcc)
    cuda/nvvm/                     cicc, libdevice                            (nvidia-nvvm)
    cuda/targets/x86_64-linux/     include + static cudart for x86_64         (runtime, crt, cccl)
    cuda/targets/sbsa-linux/       include + static cudart for aarch64        (runtime, crt, cccl)
    cuobjdump/bin/cuobjdump        for tests that list the cubins of a build  (nvidia-cuda-cuobjdump)
    cmake/bin/cmake, ninja/bin/ninja
    python/                        scikit-build-core and its pure-Python requirements

Targets: `:cuda` (all toolkit files), `:nvcc`, `:cmake`, `:cmake_files`, `:ninja`, `:python`,
`:python_root`, `:cuobjdump`. `cuda/toolkit.json` and `python/site.json` record which wheels were used;
their directories are the toolkit root and the import root.
"""

load(":common.bzl", "apparent_repo_name", "label_string")
load(":locks.bzl", "locked_wheel", "parse_wheels_lock")
load(":platforms.bzl", "HOST_PLATFORMS", "host_platform")
load(":pypi_download.bzl", "INDEX_ENVIRON", "download_locked_file")

# Lock platform of the build host -> the CUDA `targets/` directory of that platform.
_TARGET_DIRS = {
    "linux_x86_64": "x86_64-linux",
    "linux_aarch64": "sbsa-linux",
}

_PURE_PYTHON = ["scikit-build-core", "packaging", "pathspec"]

_WHEEL_ROOT = "nvidia/cu13/"

def _host_platform(rctx):
    if rctx.attr.host:
        return rctx.attr.host
    return host_platform(rctx, "cuda_toolkit %s (the lock %s pins host tools)" % (rctx.name, rctx.attr.lock))

def _locked(rctx, lock, project, platform):
    return locked_wheel(lock, project, platform, label_string(rctx.attr.lock))

def _fetch(rctx, lock, project, platform):
    """Downloads one locked wheel as a .zip (so that rctx.extract knows its format); returns (path, entry)."""
    entry = _locked(rctx, lock, project, platform)
    archive = "_wheels/%s.zip" % entry.filename
    download_locked_file(rctx, entry.filename, entry.sha256, archive)
    return archive, entry

def _unpack(rctx, lock, used, project, platform, parts):
    """Unpacks `parts` ((prefix inside the wheel, output directory) pairs) of one locked wheel."""
    archive, entry = _fetch(rctx, lock, project, platform)
    used[entry.filename] = entry.sha256
    for prefix, output in parts:
        rctx.extract(archive, output = output, stripPrefix = prefix)
    rctx.delete(archive)

def _cuda_toolkit_impl(rctx):
    lock = parse_wheels_lock(rctx.read(rctx.attr.lock), label_string(rctx.attr.lock))
    host = _host_platform(rctx)
    all_includes = [
        (_WHEEL_ROOT + "include", "cuda/targets/%s/include" % d)
        for d in sorted(_TARGET_DIRS.values())
    ]
    used = {}
    _unpack(rctx, lock, used, "nvidia-cuda-nvcc", host, [(_WHEEL_ROOT + "bin", "cuda/bin")] + all_includes)
    _unpack(rctx, lock, used, "nvidia-nvvm", host, [(_WHEEL_ROOT + "nvvm", "cuda/nvvm")])
    _unpack(rctx, lock, used, "nvidia-cuda-crt", host, all_includes)
    _unpack(rctx, lock, used, "nvidia-cuda-cccl", host, all_includes)
    for platform, target_dir in sorted(_TARGET_DIRS.items()):
        _unpack(rctx, lock, used, "nvidia-cuda-runtime", platform, [
            (_WHEEL_ROOT + "include", "cuda/targets/%s/include" % target_dir),
            (_WHEEL_ROOT + "lib", "cuda/targets/%s/lib" % target_dir),
        ])
    _unpack(rctx, lock, used, "nvidia-cuda-cuobjdump", host, [(_WHEEL_ROOT + "bin", "cuobjdump/bin")])
    _unpack(rctx, lock, used, "cmake", host, [("cmake/data", "cmake")])
    ninja_version = _locked(rctx, lock, "ninja", host).filename.split("-")[1]
    _unpack(rctx, lock, used, "ninja", host, [("ninja-%s.data/scripts" % ninja_version, "ninja/bin")])
    python_used = {}
    for project in _PURE_PYTHON:
        _unpack(rctx, lock, python_used, project, "any", [("", "python")])

    for tool in ["cuda/bin/nvcc", "cuda/bin/ptxas", "cuda/nvvm/bin/cicc", "cmake/bin/cmake", "ninja/bin/ninja"]:
        result = rctx.execute(["test", "-x", tool])
        if result.return_code != 0:
            fail("sparkseal: cuda_toolkit %s: %s is not executable after unpacking the locked wheels" % (
                apparent_repo_name(rctx.name),
                tool,
            ))
    rctx.file("cuda/toolkit.json", json.encode_indent({"host": host, "wheels": used}) + "\n")
    rctx.file("python/site.json", json.encode_indent({"wheels": python_used}) + "\n")
    rctx.file("WORKSPACE", "workspace(name = %r)\n" % rctx.name)
    rctx.file("BUILD", "\n".join([
        '"""Generated by cuda_toolkit from %s; do not edit."""' % rctx.attr.lock,
        "",
        'package(default_visibility = ["//visibility:public"])',
        "",
        'filegroup(name = "cuda", srcs = glob(["cuda/**"]))',
        'filegroup(name = "nvcc", srcs = ["cuda/bin/nvcc"])',
        'filegroup(name = "cuda_root", srcs = ["cuda/toolkit.json"])',
        'filegroup(name = "cmake", srcs = ["cmake/bin/cmake"])',
        'filegroup(name = "cmake_files", srcs = glob(["cmake/**"]))',
        'filegroup(name = "ninja", srcs = ["ninja/bin/ninja"])',
        'filegroup(name = "python", srcs = glob(["python/**"]))',
        'filegroup(name = "python_root", srcs = ["python/site.json"])',
        'filegroup(name = "cuobjdump", srcs = ["cuobjdump/bin/cuobjdump"])',
        "",
    ]))

cuda_toolkit = repository_rule(
    implementation = _cuda_toolkit_impl,
    doc = "Assembles a CUDA toolkit root, cmake, ninja and scikit-build-core from the locked wheels.",
    attrs = {
        "lock": attr.label(mandatory = True, allow_single_file = [".json"], doc = "The CUDA toolchain lock."),
        "host": attr.string(
            values = [""] + sorted(HOST_PLATFORMS.values()),
            doc = "The lock platform whose host tools to unpack; empty (the default): this build host's. " +
                  "Tests set it to assemble the other host's toolkit (run under emulation).",
        ),
    },
    environ = INDEX_ENVIRON,
)
