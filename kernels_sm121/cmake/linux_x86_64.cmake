# Toolchain for the linux_x86_64 wheel (the H200 test variant), built natively on an x86_64 Debian host.
#
# The compilers are named by absolute path so that nothing is picked from the caller's PATH.
set(CMAKE_CXX_COMPILER /usr/bin/x86_64-linux-gnu-g++)
set(CMAKE_CUDA_HOST_COMPILER /usr/bin/x86_64-linux-gnu-g++)
set(CMAKE_STRIP /usr/bin/x86_64-linux-gnu-strip)
