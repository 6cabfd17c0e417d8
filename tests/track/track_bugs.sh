#!/usr/bin/env bash
# Runs track_bugs.c (linked with libtraymalloc.a) one way and checks what the tool reports:
#   memcheck   valgrind --leak-check=full; --soname-synonyms=somalloc=nouserintercepts keeps
#              memcheck from replacing the program's malloc (ours) with its own, so it sees our
#              blocks only through the client requests of a TRAY_VALGRIND build;
#   memcheck-static   the same program linked -static (memcheck cannot replace anything there);
#              static glibc itself gets reports of its own from memcheck, so only ours are checked;
#   asan       built with -fsanitize=address against a TRAY_ASAN build.
# Mode buggy must report its use after free (and, under memcheck, its leak); mode clean nothing.
#
# Usage: track_bugs.sh memcheck|memcheck-static|asan VALGRIND|none PROGRAM buggy|clean
set -euo pipefail

[[ $# -eq 4 ]] || { echo "usage: $0 TOOL VALGRIND PROGRAM MODE" >&2; exit 2; }
tool=$1 valgrind=$2 program=$3 mode=$4
readonly ERROR_STATUS=99

out=$(mktemp) err=$(mktemp)
trap 'rm -f -- "$out" "$err"' EXIT
fail() { echo "FAIL [$tool $mode]: $1" >&2; echo "--- stdout:"; cat "$out"; echo "--- stderr:"; cat "$err"; exit 1; }
# has ERE [FOLLOWING_ERE]: a line matches ERE (and one of the next 4 lines FOLLOWING_ERE).
has() {
  if [[ $# -eq 1 ]]; then grep -Eq -- "$1" "$err"; return; fi
  grep -E -A4 -- "$1" "$err" | grep -Eq -- "$2"
}

status=0
case $tool in
  memcheck|memcheck-static)
    args=(--leak-check=full --error-exitcode=$ERROR_STATUS)
    [[ $tool == memcheck ]] && args+=(--soname-synonyms=somalloc=nouserintercepts)
    "$valgrind" "${args[@]}" "$program" "$mode" >"$out" 2>"$err" || status=$? ;;
  asan)
    ASAN_OPTIONS=exitcode=$ERROR_STATUS "$program" "$mode" >"$out" 2>"$err" || status=$? ;;
  *) echo "unknown tool '$tool'" >&2; exit 2 ;;
esac

if [[ $mode == clean ]]; then
  [[ $status -eq 0 ]] || fail "exit status $status, expected 0"
  [[ "$(cat "$out")" == finished ]] || fail "the program did not finish"
  if [[ $tool == asan ]]; then
    has 'ERROR: AddressSanitizer' && fail "ASan reported an error"
  else
    has 'ERROR SUMMARY: 0 errors from 0 contexts' || fail "memcheck reported errors"
    has 'All heap blocks were freed' || fail "memcheck saw blocks left at exit"
  fi
  echo "PASS [$tool $mode]"
  exit 0
fi

[[ $status -eq $ERROR_STATUS ]] || fail "exit status $status, expected $ERROR_STATUS"
if [[ $tool == asan ]]; then
  # Our poisoning is not ASan's own heap: it says use-after-poison.
  has 'ERROR: AddressSanitizer: use-after-poison' 'WRITE of size 1' || fail "no use-after-poison report"
  has 'WRITE of size 1' 'in write_after_free .*track_bugs.c:' || fail "the report does not name write_after_free"
else
  has 'Invalid write of size 1' 'at 0x[0-9A-F]+: write_after_free \(track_bugs.c:' ||
    fail "no invalid write in write_after_free"
  has '200 bytes in 1 blocks are definitely lost' 'by 0x[0-9A-F]+: leak_a_block \(track_bugs.c:' ||
    fail "no definite leak of 200 bytes from leak_a_block"
  if [[ $tool == memcheck ]]; then
    has 'ERROR SUMMARY: 2 errors from 2 contexts' || fail "more than the two errors"
  fi
fi
echo "PASS [$tool $mode]"
