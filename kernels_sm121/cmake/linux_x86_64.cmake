# Toolchain for the linux_x86_64 wheel (the H200 test variant), built natively on an x86_64 host.
#
# The kernels action (sparkseal/actions/kernels_wheel.py) names every compiler by absolute path on the
# command line: CMAKE_CXX_COMPILER and CMAKE_CUDA_HOST_COMPILER are wrappers around the locked g++-12 of
# //third_party/toolchains (with --sysroot on the locked C library), CMAKE_STRIP and the binutils CMake
# finds beside the compiler wrap the locked binutils. Nothing here, or in the host's /usr, is used.
