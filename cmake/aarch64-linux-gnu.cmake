# Linux on arm64 from an x86-64 Debian machine: Debian's cross compiler (g++-aarch64-linux-gnu)
# and its arm64 C library (/usr/aarch64-linux-gnu), with the test programs run under qemu's
# user-mode emulator (qemu-user). tools/run-tests builds and tests this way:
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DTRAY_GTEST_SOURCE_DIR=/usr/src/googletest
# Debian has no arm64 GoogleTest to link against: TRAY_GTEST_SOURCE_DIR builds it from the
# sources that the googletest package installs.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(TRAY_CROSS_ROOT /usr/aarch64-linux-gnu)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Libraries and headers come from the arm64 root only; programs (python3, sh) from the host.
set(CMAKE_FIND_ROOT_PATH ${TRAY_CROSS_ROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest and gtest_discover_tests start every test program through this: the arm64 loader and
# libraries are found under the root given by -L.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L ${TRAY_CROSS_ROOT})
