#!/usr/bin/env bash
# Runs one mode of guard_bugs.c under libtraymalloc.so with guard_sample=1 (every eligible
# allocation guarded) and checks the report: its first line, the allocation stack (and the
# free stack where the block was freed) naming the program's functions, the stack of the bad
# access or free, then SIGABRT. Modes without a mistake of ours check the program's own fate.
#
# Usage: guard_bugs.sh LIBTRAYMALLOC GUARD_BUGS_PROGRAM MODE
# Exit status: 0 pass, 1 fail.
set -euo pipefail

[[ $# -eq 3 ]] || { echo "usage: $0 LIBTRAYMALLOC GUARD_BUGS_PROGRAM MODE" >&2; exit 2; }
library=$(realpath -- "$1")
program=$(realpath -- "$2")
mode=$3

readonly A='0x[0-9a-f]+'
readonly SIGABRT_STATUS=134 SIGSEGV_STATUS=139
# report: an ERE for the first line; access: the function that made the mistake; freed: 1 if
# the report must show the free stack; now: the heading of the current stack.
report='' access='' freed=0 now='accessed' status=$SIGABRT_STATUS stdout=''
case $mode in
  overflow)
    report="heap-buffer-overflow at $A: block $A of 64 bytes \(guarded\), offset 64, 0 bytes after it"
    access=overflow_by_one ;;
  underflow)
    report="heap-buffer-overflow at $A: block $A of 64 bytes \(guarded\), offset -1, 1 byte before it"
    access=underflow_by_one ;;
  overflow-padding)
    report="heap-buffer-overflow at $A: block $A of 13 bytes \(guarded\), offset 13, 0 bytes after it"
    access=free_block now='found at free' ;;
  use-after-free)
    report="use-after-free at $A: block $A of 64 bytes \(guarded\), offset 8, freed"
    access=use_after_free freed=1 ;;
  double-free)
    report="double free at ($A): block \1 of 64 bytes \(guarded\), offset 0, freed"
    access=free_block freed=1 now='freed again' ;;
  correct) status=0 stdout=finished ;;
  own-handler) status=42 stdout='own handler' ;;
  own-fault-default) status=$SIGSEGV_STATUS ;;
  *) echo "unknown mode '$mode'" >&2; exit 2 ;;
esac

fail() { echo "FAIL [$mode]: $1" >&2; echo "--- stdout:"; cat "$out"; echo "--- stderr:"; cat "$err"; exit 1; }

out=$(mktemp) err=$(mktemp)
trap 'rm -f -- "$out" "$err"' EXIT
actual=0
{ env LD_PRELOAD="$library" TRAY_OPTIONS=guard_sample=1 "$program" "$mode" >"$out" 2>"$err" ||
    actual=$?; } 2>/dev/null

[[ $actual -eq $status ]] || fail "exit status $actual, expected $status"
[[ "$(cat "$out")" == "$stdout" ]] || fail "stdout differs from '$stdout'"
if [[ -z $report ]]; then
  grep -q traymalloc "$err" && fail "unexpected report"
  echo "PASS [$mode]"
  exit 0
fi

grep -Eq "^traymalloc: $report\$" <(head -1 "$err") || fail "first line does not match: $report"
# The frames under a heading, up to the next heading.
section() { awk -v h="traymalloc: $1 by thread [0-9]+:" '$0 ~ "^"h"$" {on=1; next} /^traymalloc:/ {on=0} on' "$err"; }
section allocated | grep -q '(allocate_block+0x' || fail "no allocation stack through allocate_block"
if [[ $freed -eq 1 ]]; then
  section freed | grep -q '(free_block+0x' || fail "no free stack through free_block"
else
  grep -q '^traymalloc: freed by' "$err" && fail "a free stack for a live block"
fi
section "$now" | grep -q "($access+0x" || fail "no '$now' stack through $access"
echo "PASS [$mode]"
