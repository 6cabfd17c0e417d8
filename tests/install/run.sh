#!/usr/bin/env bash
# Installs a traymalloc build into a temporary prefix and uses it as a downstream project
# would: through the CMake package (shared and static; every public header with -Werror),
# through pkg-config (run without LD_LIBRARY_PATH), and through the installed tools: tray-run,
# and tray-stats and tray-prof on what the installed library wrote.
#
# Usage: run.sh BUILD_DIR
# Environment: CMAKE, CC, CXX name the cmake, C and C++ compilers to use (default: from PATH).
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(realpath -- "$1")
here=$(dirname -- "$(realpath -- "${BASH_SOURCE[0]}")")
cmake=${CMAKE:-cmake}
cc=${CC:-cc}
cxx=${CXX:-c++}
work=$(realpath -- "$(mktemp -d "${TMPDIR:-/tmp}/tray-install.XXXXXX")")
trap 'rm -rf -- "$work"' EXIT
prefix=$work/prefix

fail() { echo "FAIL: $*" >&2; exit 1; }

# What is installed finds its own library: through the rpath of the CMake package's targets or
# of the .pc file's flags, or through tray-run.
unset LD_LIBRARY_PATH

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

for tool in "$here"/../../tools/tray-*; do
  [[ -x $prefix/bin/${tool##*/} ]] || fail "${tool##*/} is not installed in bin/"
done

# --- the CMake package --------------------------------------------------------------------
quietly "$work/configure.log" "$cmake" -S "$here" -B "$work/cmake-build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx"
# Also builds public_headers.cpp with -Werror, which must include every installed header.
for header in "$prefix"/include/*.h "$prefix"/include/tray/*.hpp; do
  name=${header#"$prefix"/include/}
  grep -q "^#include <$name>" "$here/public_headers.cpp" ||
    fail "tests/install/public_headers.cpp does not include the public header $name"
done
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
run_app "$work/app_pkg_config" shared
# shellcheck disable=SC2086  # the flags are words
quietly "$work/pkg-config-c.log" "$cc" -std=c11 -Wall -Wextra -Werror "$here/pkg_config_app.c" \
  -o "$work/app_c" $flags
output=$("$work/app_c") || fail "app_c failed"
echo "$output"
[[ $output == *" from $prefix/"* ]] || fail "app_c did not load libtraymalloc.so from the install prefix"

# --- the installed tray-run finds the installed library -----------------------------------
TRAY_OPTIONS=stats=1 "$prefix/bin/tray-run" bash -c 'exit 0' 2>"$work/tray-run.err" ||
  fail "installed tray-run failed: $(<"$work/tray-run.err")"
grep -Eq '^  small: [1-9][0-9]* live blocks .* in [1-9][0-9]* pages' "$work/tray-run.err" ||
  fail "installed tray-run did not preload traymalloc: $(<"$work/tray-run.err")"

# --- the installed viewers read what the installed library wrote --------------------------
# app_c is linked with the installed libtraymalloc.so; tray-stats's tables and tray-prof's
# top need nothing beyond Python's standard library and nm (no matplotlib).
TRAY_OPTIONS=stats=1,stats_format=json,stats_file="$work/stats.jsonl" \
  "$work/app_c" >/dev/null || fail "app_c failed with stats=1"
"$prefix/bin/tray-stats" "$work/stats.jsonl" >"$work/tray-stats.out" 2>&1 ||
  fail "installed tray-stats failed: $(<"$work/tray-stats.out")"
grep -q ', exit, traymalloc ' "$work/tray-stats.out" &&
  grep -q '^size classes holding memory' "$work/tray-stats.out" ||
  fail "installed tray-stats did not show the dump: $(<"$work/tray-stats.out")"

TRAY_OPTIONS=prof=1,prof_final=1,prof_sample=64k,prof_file="$work/app.heap" \
  "$work/app_c" >/dev/null || fail "app_c failed with prof=1"
"$prefix/bin/tray-prof" top "$work/app.heap" -n 5 >"$work/tray-prof.out" 2>&1 ||
  fail "installed tray-prof failed: $(<"$work/tray-prof.out")"
# app_c keeps 4 MiB live from keep_live to exit: about 64 samples at 64 KiB.
grep -Eq ' in [1-9][0-9]* blocks live' "$work/tray-prof.out" &&
  grep -Eq '  keep_live$' "$work/tray-prof.out" ||
  fail "installed tray-prof did not name app_c's site: $(<"$work/tray-prof.out")"

"$prefix/bin/tray-timeline" --help >"$work/tray-timeline.out" 2>&1 ||
  fail "installed tray-timeline does not start: $(<"$work/tray-timeline.out")"

echo "PASS"
