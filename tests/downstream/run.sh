#!/usr/bin/env bash
# traymalloc's tree taken into another project (FetchContent from this tree, no network):
# the parent (tests/downstream/CMakeLists.txt) gets the libraries and the traymalloc:: names,
# no test, benchmark, install rule or CPack configuration of traymalloc's; its program links
# traymalloc::traymalloc_static and runs on it. Then the tree built on its own with
# BUILD_TESTING=OFF, CMake's standard switch, configures no tests.
#
# Usage: run.sh SOURCE_DIR
# Environment: CMAKE, CC, CXX name the cmake, C and C++ compilers to use (default: from PATH).
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 SOURCE_DIR" >&2; exit 2; }
tree=$(realpath -- "$1")
here=$(dirname -- "$(realpath -- "${BASH_SOURCE[0]}")")
cmake=${CMAKE:-cmake}
ctest=$(dirname -- "$(command -v "$cmake")")/ctest
cc=${CC:-cc}
cxx=${CXX:-c++}
work=$(realpath -- "$(mktemp -d "${TMPDIR:-/tmp}/tray-downstream.XXXXXX")")
trap 'rm -rf -- "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# quietly LOG COMMAND...: runs COMMAND with its output in LOG, shown only if it fails.
quietly() {
  local log=$1; shift
  "$@" >"$log" 2>&1 || { cat "$log" >&2; fail "'$*' failed"; }
}

# --- the parent project -------------------------------------------------------------------
# Its configure step fails on a target or test of traymalloc's it did not ask for.
quietly "$work/configure.log" "$cmake" -S "$here" -B "$work/parent" -DTRAY_SOURCE_DIR="$tree" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx"
[[ ! -e $work/parent/CPackConfig.cmake ]] || fail "traymalloc set up CPack in the parent"
quietly "$work/build.log" "$cmake" --build "$work/parent" --parallel "$(nproc)"
"$work/parent/app" || fail "the parent's program is not served by traymalloc"

# The parent's tests are its own alone.
"$ctest" --test-dir "$work/parent" -N >"$work/tests.out"
grep -q '^Total Tests: 1$' "$work/tests.out" || fail "the parent has tests not its own: $(<"$work/tests.out")"

# The parent's install installs its program alone.
quietly "$work/install.log" "$cmake" --install "$work/parent" --prefix "$work/prefix"
installed=$(cd "$work/prefix" && find . -type f -o -type l | sort)
[[ $installed == "./bin/app" ]] || fail "the parent's install holds more than bin/app: $installed"

# --- the tree on its own, with BUILD_TESTING=OFF --------------------------------------------
quietly "$work/top.log" "$cmake" -S "$tree" -B "$work/top" -DBUILD_TESTING=OFF \
  -DTRAY_BUILD_BENCH=OFF -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx"
grep -q '^TRAY_BUILD_TESTS:BOOL=ON$' "$work/top/CMakeCache.txt" ||
  fail "TRAY_BUILD_TESTS is not on by default in a build of the tree itself"
[[ ! -e $work/top/tests ]] || fail "BUILD_TESTING=OFF configured the tests"
"$ctest" --test-dir "$work/top" -N >"$work/top-tests.out"
grep -q '^Total Tests: 0$' "$work/top-tests.out" ||
  fail "BUILD_TESTING=OFF left tests: $(<"$work/top-tests.out")"

echo "PASS"
