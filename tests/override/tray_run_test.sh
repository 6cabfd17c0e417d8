#!/usr/bin/env bash
# Checks tools/tray-run: where it finds libtraymalloc.so (TRAY_LIB, an install tree's lib/ or
# lib/<multiarch>/, a source tree's build/lib), that it keeps an existing LD_PRELOAD after
# ours, that the program really runs on traymalloc, and its errors.
#
# Usage: tray_run_test.sh TRAY_RUN LIBTRAYMALLOC
set -euo pipefail

[[ $# -eq 2 ]] || { echo "usage: $0 TRAY_RUN LIBTRAYMALLOC" >&2; exit 2; }
tray_run=$(realpath -- "$1")
library=$(realpath -- "$2")
work=$(realpath -- "$(mktemp -d "${TMPDIR:-/tmp}/tray-run-test.XXXXXX")")
trap 'rm -rf -- "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_status STATUS COMMAND...: runs COMMAND, stdout to $work/out, stderr to $work/err.
expect_status() {
  local expected=$1 status=0; shift
  "$@" >"$work/out" 2>"$work/err" || status=$?
  [[ $status -eq $expected ]] ||
    fail "'$*' exited with $status, expected $expected; stderr: $(<"$work/err")"
}

# The LD_PRELOAD a program started by tray-run sees.
# shellcheck disable=SC2016  # expanded by the inner shell
print_preload=(sh -c 'printf %s "$LD_PRELOAD"')

expect_status 0 "$tray_run" --help
grep -q '^Usage: tray-run PROGRAM' "$work/out" || fail "--help printed no usage"
expect_status 2 "$tray_run"
grep -q '^Usage:' "$work/err" || fail "no usage on stderr without a program"

expect_status 127 env TRAY_LIB="$work/missing.so" "$tray_run" true
grep -q 'TRAY_LIB=.*missing.so is not a file' "$work/err" || fail "unclear error: $(<"$work/err")"

# Found through TRAY_LIB; LD_PRELOAD already set stays, after ours.
expect_status 0 env TRAY_LIB="$library" LD_PRELOAD=libm.so.6 "$tray_run" "${print_preload[@]}"
[[ $(<"$work/out") == "$library:libm.so.6" ]] || fail "LD_PRELOAD was '$(<"$work/out")'"

# The program runs on traymalloc: its statistics appear at exit (bash leaves through exit();
# dash's _exit would skip them).
expect_status 0 env TRAY_LIB="$library" TRAY_OPTIONS=stats=1 "$tray_run" bash -c 'exit 0'
grep -Eq '^  small: [1-9][0-9]* live blocks .* in [1-9][0-9]* pages' "$work/err" ||
  fail "no traymalloc statistics: $(<"$work/err")"

# The program's exit status comes through.
expect_status 3 env TRAY_LIB="$library" "$tray_run" sh -c 'exit 3'

# Layouts tray-run searches when TRAY_LIB is unset, each in a fresh tree with the script
# copied to where it would be installed (bin/) or kept in the sources (tools/), and the library
# under the name given (default libtraymalloc.so).
check_layout() {
  local script_dir=$1 library_dir=$2 name=${3:-libtraymalloc.so} tree
  tree=$(mktemp -d "$work/tree.XXXXXX")
  mkdir -p "$tree/$script_dir" "$tree/$library_dir"
  cp "$tray_run" "$tree/$script_dir/tray-run"
  ln -s "$library" "$tree/$library_dir/$name"
  expect_status 0 env -u TRAY_LIB -u LD_PRELOAD "$tree/$script_dir/tray-run" "${print_preload[@]}"
  [[ $(<"$work/out") == "$tree/$library_dir/$name" ]] ||
    fail "layout $script_dir + $library_dir: LD_PRELOAD was '$(<"$work/out")'"
  # Through a symbolic link to the script, e.g. from a directory on PATH.
  ln -s "$tree/$script_dir/tray-run" "$work/link-to-tray-run"
  expect_status 0 env -u TRAY_LIB -u LD_PRELOAD "$work/link-to-tray-run" "${print_preload[@]}"
  rm "$work/link-to-tray-run"
  [[ $(<"$work/out") == "$tree/$library_dir/$name" ]] ||
    fail "layout $script_dir + $library_dir through a link: LD_PRELOAD was '$(<"$work/out")'"
}
check_layout bin lib
check_layout bin lib/x86_64-linux-gnu
# The package libtraymalloc0 installs the SONAME alone; the unversioned link is -dev's.
check_layout bin lib/x86_64-linux-gnu libtraymalloc.so.0
check_layout tools build/lib

# No library anywhere: exit 127 and say where it looked.
mkdir -p "$work/empty/bin"
cp "$tray_run" "$work/empty/bin/tray-run"
expect_status 127 env -u TRAY_LIB "$work/empty/bin/tray-run" true
grep -q 'libtraymalloc.so not found' "$work/err" || fail "unclear error: $(<"$work/err")"

echo "PASS"
