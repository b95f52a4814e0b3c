# Toolchain for the linux_aarch64 wheel (GB10 / SM121), cross-compiled on an x86_64 Debian host.
#
# Host code: Debian's g++-aarch64-linux-gnu. Device code: the hermetic nvcc, whose default include
# and library paths are redirected to targets/sbsa-linux of the toolkit root, where the aarch64
# cudart (static library and headers) lies.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_CXX_COMPILER /usr/bin/aarch64-linux-gnu-g++)
set(CMAKE_CUDA_HOST_COMPILER /usr/bin/aarch64-linux-gnu-g++)
set(CMAKE_STRIP /usr/bin/aarch64-linux-gnu-strip)
set(CMAKE_CUDA_FLAGS_INIT "-target-dir sbsa-linux")

# Look for libraries and headers of the target only in the cross sysroot, never on the build host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
