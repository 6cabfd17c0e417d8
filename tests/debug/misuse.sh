#!/usr/bin/env bash
# Runs one mode of misuse.c (a heap mistake) under libtraymalloc.so, or linked with
# libtraymalloc.a ("static"), three ways:
#   debug    TRAY_OPTIONS=debug=1: the exact report line, a backtrace, then SIGABRT (status 134);
#   plain    no options: the mistake goes unnoticed, as docs/GUIDE.md says of release builds, except
#            the ones release builds stop too (heap/hardening.hpp; unless built with
#            TRAY_HARDENING=OFF, which TRAY_RELEASE_HARDENING=0 says);
#   go-on    debug=1,debug_abort=0,stats=1: the report, the program finishes, and the
#            statistics count the report under "debug errors".
# Modes that only read memory report nothing: there the debug run shows the fill patterns. A
# write to a freed large block reports nothing either: it faults on the inaccessible mapping.
#
# Usage: misuse.sh LIBTRAYMALLOC|static MISUSE_PROGRAM MODE
# Exit status: 0 pass, 1 fail.
set -euo pipefail

[[ $# -eq 3 ]] || { echo "usage: $0 LIBTRAYMALLOC|static MISUSE_PROGRAM MODE" >&2; exit 2; }
program=$(realpath -- "$2")
mode=$3
preload=()  # "static": the program has traymalloc linked in
if [[ $1 != static ]]; then
  library=$(realpath -- "$1")
  [[ -f $library ]] || { echo "FAIL: $library does not exist" >&2; exit 1; }
  preload=("LD_PRELOAD=$library")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tray-misuse.XXXXXX")
trap 'rm -rf -- "$work"' EXIT

readonly ADDRESS='0x[0-9a-f]+'
readonly SIGABRT_STATUS=134 SIGSEGV_STATUS=139
# backtrace_symbols_fd(3) ends every frame with its address in brackets.
readonly BACKTRACE_FRAME='\[0x[0-9a-f]+\]$'
readonly ABORT_HINT='traymalloc: aborting (TRAY_OPTIONS=debug_abort=0 reports and goes on)'

# What each mode must show. report: the message after "traymalloc: " (an ERE, empty when the
# mode reports nothing). debug_status/debug_stdout: the debug run. plain: "clean" (status 0,
# silent), "release-reports" (the release library's checks, heap/hardening.hpp:
# release_report, a backtrace, SIGABRT; status 0 where TRAY_HARDENING is off), "stops" (the
# same in every build: a pointer no allocator handed out), or "unchecked".
# plain_stdout: a glob for the clean plain run. go_on_stdout: what the program prints when it
# goes on past the report.
report='' debug_status=$SIGABRT_STATUS debug_stdout='' plain=clean plain_stdout=finished release_report=''
abort_hint=yes  # the report says debug_abort=0 would go on
go_on_stdout=finished
case $mode in
  write-after-free)
    # 64 requested bytes + the canary byte make an 80-byte block.
    report="write after free: block $ADDRESS \(size class 80 B\) modified at offset 24 \(found 0x00000000, expected 0x1deadb0b\)" ;;
  double-free-small)
    report="double free of $ADDRESS \(size class 48 B\)"
    plain=release-reports release_report=$report ;;
  double-free-large)
    report="double free of $ADDRESS \(large block of 3145728 requested bytes\)"
    # In release builds the block's pages (a span block) are back in their chunk: no header
    # names it any more.
    plain=release-reports
    release_report="free of invalid pointer $ADDRESS: no live block starts there \(freed already, or never allocated\)" ;;
  overflow-small)
    report="heap buffer overflow: block $ADDRESS of 40 requested bytes written at offset 40 \(size class 48 B\)" ;;
  overflow-large)
    report="heap buffer overflow: block $ADDRESS of 3000000 requested bytes written at offset 3000000 \(large block\)" ;;
  free-stack)
    report="free of invalid pointer $ADDRESS: not allocated by traymalloc"
    plain=stops release_report="$report \(it lies in the calling thread's stack\)" ;;
  free-interior)
    report="free of invalid pointer $ADDRESS: not the start of a block \(8 bytes into block $ADDRESS of size class 48 B\)"
    plain=release-reports release_report=$report ;;
  realloc-freed)
    report="realloc of freed block $ADDRESS \(size class 48 B\)"
    # The release build finds the block's free mark, as a double free does, before it resizes
    # (in place it would hand out a block still on a free list) or copies it.
    plain=release-reports release_report=$report
    go_on_stdout=$'realloc returned NULL\nfinished' ;;
  poison-link)
    # Debug mode keeps the block in quarantine, so the mallocs get other blocks; the write shows
    # when the block leaves it.
    report="write after free: block $ADDRESS \(size class 48 B\) modified at offset 0 \(found 0x[0-9a-f]+, expected 0x1deadb0b\)"
    debug_stdout=$'not exploited'
    plain=release-reports
    release_report="free list corrupted: a write after free or an overflow \(size class 48 B, page of blocks at $ADDRESS\): the next block to hand out would be $ADDRESS, outside the page"
    go_on_stdout=$'not exploited\nfinished' ;;
  overflow-into-link)
    # In debug mode 40 requested bytes leave 8 of canary: bytes 48 and 49 are the neighbour's.
    report="write after free: block $ADDRESS \(size class 48 B\) modified at offset 0 \(found 0x1dea4141, expected 0x1deadb0b\)"
    plain=release-reports
    release_report="free list corrupted: a write after free or an overflow \(size class 48 B, page of blocks at $ADDRESS\): the next block to hand out would be $ADDRESS, outside the page" ;;
  read-fresh)
    debug_status=0 debug_stdout=$'a110ca7e\nfinished' go_on_stdout=$debug_stdout
    plain_stdout=$'????????\nfinished' ;;
  read-freed)
    debug_status=0 debug_stdout=$'1deadb0b\nfinished' go_on_stdout=$debug_stdout
    plain_stdout=$'????????\nfinished' ;;
  large-use-after-free)
    # The freed mapping is PROT_NONE: the fault is reported with the block and where it was
    # freed, and the program stops (debug_abort=0 cannot go on: the access would fault again).
    # Without debug mode the write lands in a cached mapping or faults on an unmapped one,
    # depending on the large-block cache: not worth pinning down.
    report="use after free: access at $ADDRESS, 100 bytes into large block $ADDRESS of 3145728 requested bytes, freed at:"
    plain=unchecked go_on_stdout='' abort_hint=no ;;
  *) echo "unknown mode '$mode'" >&2; exit 2 ;;
esac

fail() { echo "FAIL [$mode, $1]: $2" >&2; exit 1; }

# run NAME [VAR=VALUE...]: runs the mode under traymalloc with the extra environment; leaves
# $status, and the output in $work/NAME.out and $work/NAME.err.
run() {
  local name=$1; shift
  status=0
  # The braces take the shell's own "Aborted" notice away from the test's output.
  { env "${preload[@]}" "$@" "$program" "$mode" >"$work/$name.out" 2>"$work/$name.err" ||
      status=$?; } 2>/dev/null
}

show() { echo "--- stdout:"; cat "$work/$1.out"; echo "--- stderr:"; cat "$work/$1.err"; }

expect_status() {
  local name=$1 expected=$2
  [[ $status -eq $expected ]] || { show "$name" >&2; fail "$name" "exit status $status, expected $expected"; }
}

# expect_stdout NAME GLOB
expect_stdout() {
  local name=$1 expected=$2
  # shellcheck disable=SC2053  # a glob on purpose
  [[ $(<"$work/$name.out") == $expected ]] ||
    { show "$name" >&2; fail "$name" "stdout is not '$expected'"; }
}

# The one report line, exactly once, followed by at least one backtrace frame (after the
# release build's hint to rerun in debug mode, where it gives one).
expect_report() {
  local name=$1
  local line="^traymalloc: $report\$"
  [[ $(grep -Ec "$line" "$work/$name.err") -eq 1 ]] ||
    { show "$name" >&2; fail "$name" "no single line matching: $line"; }
  grep -A2 -E "$line" "$work/$name.err" | grep -v "^traymalloc: rerun with TRAY_OPTIONS=debug=1 " |
    sed -n 2p | grep -Eq "$BACKTRACE_FRAME" ||
    { show "$name" >&2; fail "$name" "no backtrace after the report"; }
  # The backtrace starts at the program's frame, not in the allocator's library.
  if grep -A2 -E "$line" "$work/$name.err" | grep -v "^traymalloc: " | head -n1 |
    grep -q "libtraymalloc"; then
    show "$name" >&2
    fail "$name" "the backtrace starts inside libtraymalloc"
  fi
}

# traymalloc's lines in stderr other than the report, the abort hint and the statistics dump.
other_traymalloc_lines() {
  grep 'traymalloc' "$1" | grep -Ev "^traymalloc: ($report|stats: .*|rerun with TRAY_OPTIONS=debug=1 .*|accessed at:)\$" |
    grep -Fxv "$ABORT_HINT" | grep -Ev "$BACKTRACE_FRAME" || true
}

expect_nothing_else() {
  local name=$1 others
  others=$(other_traymalloc_lines "$work/$name.err")
  [[ -z $others ]] || { show "$name" >&2; fail "$name" "unexpected lines from traymalloc: $others"; }
}

# --- debug: report, backtrace, abort ------------------------------------------------------
run debug TRAY_OPTIONS=debug=1
expect_status debug "$debug_status"
expect_stdout debug "$debug_stdout"
if [[ -n $report ]]; then
  expect_report debug
  [[ $abort_hint == no ]] || grep -Fxq "$ABORT_HINT" "$work/debug.err" || fail debug "no abort hint"
fi
expect_nothing_else debug

# --- plain: no checks, no messages ------------------------------------------------------
case $plain in
  clean)
    run plain
    expect_status plain 0
    expect_stdout plain "$plain_stdout"
    grep -q traymalloc "$work/plain.err" && { show plain >&2; fail plain "traymalloc wrote to stderr"; } ;;
  stops)
    run plain
    expect_status plain "$SIGABRT_STATUS"
    report=$release_report expect_report plain ;;
  release-reports)
    run plain
    if [[ ${TRAY_RELEASE_HARDENING:-1} == 1 ]]; then
      expect_status plain "$SIGABRT_STATUS"
      report=$release_report expect_report plain
    else
      expect_status plain 0
    fi ;;
  unchecked) ;;
esac

# --- go-on: the report is counted and the program finishes --------------------------------
if [[ -n $go_on_stdout ]]; then
  run go-on TRAY_OPTIONS=debug=1,debug_abort=0,stats=1
  expect_status go-on 0
  expect_stdout go-on "$go_on_stdout"
  errors=1
  if [[ -n $report ]]; then expect_report go-on; else errors=0; fi
  grep -Fxq "$ABORT_HINT" "$work/go-on.err" && fail go-on "aborting, though debug_abort=0"
  grep -Eq "^  threads: .*, debug errors $errors\$" "$work/go-on.err" ||
    { show go-on >&2; fail go-on "the statistics do not count $errors debug error(s)"; }
  expect_nothing_else go-on
fi
echo "PASS [$mode]"
