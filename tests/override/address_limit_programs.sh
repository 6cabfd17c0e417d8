#!/bin/sh
# Real programs under an address-space limit with libtraymalloc.so preloaded: batch schedulers,
# containers and build systems run programs under `ulimit -v`, and they must start and run
# there as they do with glibc's malloc. The limit, 500000 KiB, is far above what either needs.
#
# Usage: address_limit_programs.sh LIBTRAYMALLOC {python|git}
# Exit status: 0 pass, 1 fail, 77 the program is not installed (ctest reports it as skipped).
set -u
readonly limit_kib=500000
library=$1
program=$2

case $program in
  python)
    # The system's interpreter rather than a wrapper (pyenv's shim) found first on PATH.
    command=/usr/bin/python3
    [ -x "$command" ] || command=$(command -v python3) || exit 77
    expected=1
    set -- "$command" -c 'print(1)'
    ;;
  git)
    command=$(command -v git) || exit 77
    expected='git version'
    set -- "$command" --version
    ;;
  *)
    echo "usage: $0 LIBTRAYMALLOC {python|git}" >&2
    exit 2
    ;;
esac

# The limit is set in the shell, then the program is started with the library preloaded: only
# the program itself runs under both.
output=$(ulimit -v "$limit_kib" && LD_PRELOAD=$library "$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [ "$status" -ne 0 ]; then
  echo "FAIL: '$*' under ulimit -v $limit_kib with LD_PRELOAD=$library exited $status" >&2
  exit 1
fi
case $output in
  "$expected"*) ;;
  *)
    echo "FAIL: '$*' printed something else than '$expected...'" >&2
    exit 1
    ;;
esac
echo "address_limit.$program: ok"
