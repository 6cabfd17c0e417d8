# shellcheck shell=bash
# Shared harness of the scripts that run real programs with libtraymalloc.so preloaded
# (tests/override/preload_programs.sh, tests/debug/debug_programs.sh). Sourced, never run.
#
# Provides: parse_arguments and make_work_dir, which set the variables library, which_program
# and work; fail, require, describe, expect_output, enter_new_git_repo_dir;
# run_under_traymalloc, which runs a command under traymalloc and hands its stderr to a check
# function of the caller; run_requested_program; and SKIPPED (77, which ctest reports as skipped).
# The sourcing script must define the array `programs` (its workload names, in the order "all"
# runs them) before it calls parse_arguments, and a function test_NAME for each of them before
# it calls run_requested_program.

readonly SKIPPED=77
step=0

# parse_arguments "$@": expects LIBTRAYMALLOC and a program name (or "all"); exits 2 with the
# usage otherwise, and 1 when the library does not exist.
# shellcheck disable=SC2154  # programs is the sourcing script's
parse_arguments() {
  if [[ $# -ne 2 ]]; then
    local IFS='|'
    echo "usage: $0 LIBTRAYMALLOC {${programs[*]}|all}" >&2
    exit 2
  fi
  library=$(realpath -- "$1")
  which_program=$2
  [[ -f $library ]] || { echo "FAIL: $library does not exist" >&2; exit 1; }
}

# make_work_dir NAME: a fresh directory for this run's files, removed when the script exits.
make_work_dir() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  trap 'rm -rf -- "$work"' EXIT
}

fail() { echo "FAIL [$which_program]: $*" >&2; exit 1; }

require() {
  command -v "$1" >/dev/null || { echo "SKIP: $1 is not installed"; exit "$SKIPPED"; }
}

# A command line for messages: the program's name, and its arguments unless they are long.
describe() {
  local text word
  text=$(basename -- "$1")
  for word in "${@:2}"; do
    if [[ ${#word} -le 40 ]]; then text+=" $word"; else text+=" ..."; fi
  done
  echo "$text"
}

expect_output() {
  local file=$1 expected=$2
  [[ $(<"$file") == "$expected" ]] ||
    fail "unexpected output:"$'\n'"$(<"$file")"$'\n'"expected:"$'\n'"$expected"
}

# run_under_traymalloc TRAY_OPTIONS CHECK STDOUT_FILE COMMAND...: runs COMMAND with traymalloc
# preloaded, stdout to STDOUT_FILE; fails if it exits nonzero, else runs
# CHECK STDERR_FILE DESCRIPTION to judge what traymalloc wrote on stderr.
run_under_traymalloc() {
  local options=$1 check=$2 stdout_file=$3; shift 3
  local stderr_file=$work/stderr.$((++step)) status=0
  LD_PRELOAD="$library${LD_PRELOAD:+:$LD_PRELOAD}" TRAY_OPTIONS=$options \
    "$@" >"$stdout_file" 2>"$stderr_file" || status=$?
  if [[ $status -ne 0 ]]; then
    cat "$stderr_file" >&2
    fail "'$(describe "$@")' exited with status $status"
  fi
  "$check" "$stderr_file" "$(describe "$@")"
}

# Makes $work/repo the current directory, for a repository that git builds with no user or
# system configuration and with fixed identities and dates: its commit ids are known answers.
enter_new_git_repo_dir() {
  export HOME=$work GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
  export GIT_AUTHOR_NAME=Tray GIT_AUTHOR_EMAIL=tray@example.invalid
  export GIT_AUTHOR_DATE=2024-01-01T00:00:00Z GIT_COMMITTER_DATE=2024-01-01T00:00:00Z
  export GIT_COMMITTER_NAME=Tray GIT_COMMITTER_EMAIL=tray@example.invalid
  mkdir "$work/repo"
  cd "$work/repo" || exit
}

# Runs test_NAME for the program named on the command line; "all" runs this script once per
# program, each in a fresh process, and counts a skipped one as passed.
run_requested_program() {
  local program
  if [[ $which_program == all ]]; then
    for program in "${programs[@]}"; do
      "$0" "$library" "$program" || [[ $? -eq $SKIPPED ]]
    done
  else
    is_listed_program "$which_program" ||
      { echo "unknown program '$which_program'" >&2; exit 2; }
    "test_$which_program"
  fi
  echo "PASS [$which_program]"
}

is_listed_program() {
  local program
  for program in "${programs[@]}"; do
    if [[ $program == "$1" ]]; then return 0; fi
  done
  return 1
}
