# Toolchain for the linux_aarch64 wheel (GB10 / SM121), cross-compiled on an x86_64 host.
#
# Host code: the locked g++-12-aarch64-linux-gnu of //third_party/toolchains, passed by the kernels action
# as wrappers (see linux_x86_64.cmake), with CMAKE_FIND_ROOT_PATH at the locked arm64 cross C library.
# Device code: the hermetic nvcc, whose default include and library paths are redirected to
# targets/sbsa-linux of the toolkit root, where the aarch64 cudart (static library and headers) lies.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CUDA_FLAGS_INIT "-target-dir sbsa-linux")

# Look for libraries and headers of the target only in the cross root, never on the build host.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
