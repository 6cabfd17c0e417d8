#!/usr/bin/env bash
# Installs a traymalloc build into a temporary prefix and uses it as a downstream project
# would: through the CMake package (shared and static), through pkg-config, and through the
# installed tools/tray-run.
#
# Usage: run.sh BUILD_DIR
# Environment: CMAKE, CXX name the cmake and C++ compiler to use (default: from PATH).
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(realpath -- "$1")
here=$(dirname -- "$(realpath -- "${BASH_SOURCE[0]}")")
cmake=${CMAKE:-cmake}
cxx=${CXX:-c++}
work=$(realpath -- "$(mktemp -d "${TMPDIR:-/tmp}/tray-install.XXXXXX")")
trap 'rm -rf -- "$work"' EXIT
prefix=$work/prefix

fail() { echo "FAIL: $*" >&2; exit 1; }

# quietly LOG COMMAND...: runs COMMAND with its output in LOG, shown only if it fails.
quietly() {
  local log=$1; shift
  "$@" >"$log" 2>&1 || { cat "$log" >&2; fail "'$*' failed"; }
}

# run_app APP LINKAGE: the app checks itself; a shared one must use the installed library.
run_app() {
  local output
  output=$("$1" "$2") || fail "$1 $2 failed"
  echo "$output"
  if [[ $2 == shared && $output != *" from $prefix/"* ]]; then
    fail "$1 did not load libtraymalloc.so from the install prefix"
  fi
}

quietly "$work/install.log" "$cmake" --install "$build" --prefix "$prefix"

# --- the CMake package --------------------------------------------------------------------
quietly "$work/configure.log" "$cmake" -S "$here" -B "$work/cmake-build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx"
quietly "$work/build.log" "$cmake" --build "$work/cmake-build"
run_app "$work/cmake-build/app_shared" shared
run_app "$work/cmake-build/app_static" static

# --- pkg-config ---------------------------------------------------------------------------
pc_file=$(find "$prefix" -name traymalloc.pc -print -quit)
[[ -n $pc_file ]] || fail "no traymalloc.pc installed"
export PKG_CONFIG_PATH=${pc_file%/*}
flags=$(pkg-config --cflags --libs traymalloc)
[[ $flags == *"-I$prefix/"* && $flags == *"-L$prefix/"* ]] ||
  fail "pkg-config flags do not point into the install prefix: $flags"
# shellcheck disable=SC2086  # the flags are words
quietly "$work/pkg-config.log" "$cxx" -std=c++20 "$here/main.cpp" -o "$work/app_pkg_config" $flags
LD_LIBRARY_PATH=$(pkg-config --variable=libdir traymalloc) \
  run_app "$work/app_pkg_config" shared

# --- the installed tray-run finds the installed library -----------------------------------
TRAY_OPTIONS=stats=1 "$prefix/bin/tray-run" bash -c 'exit 0' 2>"$work/tray-run.err" ||
  fail "installed tray-run failed: $(<"$work/tray-run.err")"
grep -Eq '^  small: [1-9][0-9]* live blocks .* in [1-9][0-9]* pages' "$work/tray-run.err" ||
  fail "installed tray-run did not preload traymalloc: $(<"$work/tray-run.err")"

echo "PASS"
