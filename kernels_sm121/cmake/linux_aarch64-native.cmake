# Toolchain for the linux_aarch64 wheel (GB10 / SM121), built natively on an aarch64 host (a GB10 itself,
# or an arm64 CI machine).
#
# Host code: the locked native g++-12 of //third_party/toolchains, the same GCC release as the cross
# compiler of an x86_64 host, passed by the kernels action as wrappers (see linux_x86_64.cmake). Device
# code: the hermetic aarch64 nvcc, given the same `-target-dir` as the cross build so that both hosts pass
# nvcc the same flags.
set(CMAKE_CUDA_FLAGS_INIT "-target-dir sbsa-linux")
