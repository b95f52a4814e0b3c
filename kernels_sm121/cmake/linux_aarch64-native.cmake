# Toolchain for the linux_aarch64 wheel (GB10 / SM121), built natively on an aarch64 Debian host (a GB10
# itself, or an arm64 CI machine).
#
# Host code: Debian's native g++ (on arm64, /usr/bin/aarch64-linux-gnu-g++ is the native compiler), the
# same GCC release as the cross compiler of an x86_64 host. Device code: the hermetic aarch64 nvcc, given
# the same `-target-dir` as the cross build so that both hosts pass nvcc the same flags. No cross
# settings: CMake finds the target's libraries and headers where the host keeps them.
set(CMAKE_CXX_COMPILER /usr/bin/aarch64-linux-gnu-g++)
set(CMAKE_CUDA_HOST_COMPILER /usr/bin/aarch64-linux-gnu-g++)
set(CMAKE_STRIP /usr/bin/aarch64-linux-gnu-strip)
set(CMAKE_CUDA_FLAGS_INIT "-target-dir sbsa-linux")
