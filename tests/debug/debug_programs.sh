#!/usr/bin/env bash
# Runs real programs from Debian under libtraymalloc.so in debug mode: correct programs must
# run to the end with no report (a report here is a false alarm, or a bug in the checks), and
# give the answers computed once under glibc's malloc. stats=1 makes every process print its
# statistics at exit, which shows that traymalloc served it and counted no debug error.
#
# Usage: debug_programs.sh LIBTRAYMALLOC {python|perl|git|sqlite|all}
# Exit status: 0 pass, 1 fail, 77 the program is not installed (ctest reports it as skipped).
set -euo pipefail

readonly programs=(python perl git sqlite)
# shellcheck source-path=SCRIPTDIR source=../support/preload_programs_lib.sh
source "$(dirname "$0")/../support/preload_programs_lib.sh"
parse_arguments "$@"
make_work_dir tray-debug-programs

# Every process of the tree printed its statistics with no debug error, and traymalloc wrote
# nothing else: no report, no warning about the options.
check_clean() {
  local stderr_file=$1 what=$2 dumps
  dumps=$(grep -c '^traymalloc: stats: pid=[0-9]* reason=exit$' "$stderr_file" || true)
  [[ $dumps -gt 0 ]] || { cat "$stderr_file" >&2; fail "$what: no statistics on stderr"; }
  [[ $(grep -c '^  threads: .*, debug errors 0$' "$stderr_file" || true) -eq $dumps ]] ||
    { cat "$stderr_file" >&2; fail "$what: debug errors counted"; }
  if grep 'traymalloc' "$stderr_file" | grep -qv '^traymalloc: stats: '; then
    cat "$stderr_file" >&2
    fail "$what: traymalloc reported a problem"
  fi
  echo "$what: $dumps process(es), no report"
}

# debugged STDOUT_FILE COMMAND...: runs COMMAND under traymalloc in debug mode.
debugged() { run_under_traymalloc debug=1,stats=1 check_clean "$@"; }

# JSON and regex work on a 100k-entry dict, built in a second thread so that the main thread
# frees what another allocated. PYTHONMALLOC=malloc sends every object through malloc. The
# first line is the first word of a fresh malloc'ed block, read through ctypes: the debug fill,
# which shows that debug mode is on.
test_python() {
  local python=/usr/bin/python3
  require "$python"
  cat >"$work/workload.py" <<'EOF'
import ctypes, hashlib, json, re, threading

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
block = libc.malloc(64)
print(f"{ctypes.c_uint32.from_address(block).value:08x}")
libc.free(block)

tables = []
def build():
    tables.append({f"key{i:06d}": [i, str(i * i), {"odd": i % 2 == 1}] for i in range(100_000)})
builder = threading.Thread(target=build)
builder.start()
builder.join()
table = tables.pop()

text = json.dumps(table, sort_keys=True)
assert json.loads(text) == table
sevens = re.findall(r'"key(\d*7\d*)": \[\d+, "(\d+)"', text)
ranked = sorted(table.items(), key=lambda item: (int(item[1][1]) % 1009, item[0]))
summary = ",".join(key for key, _ in ranked[:1000])
print(len(sevens), hashlib.sha256((text + summary).encode()).hexdigest())
EOF
  PYTHONMALLOC=malloc debugged "$work/out" "$python" "$work/workload.py"
  expect_output "$work/out" "a110ca7e
40951 2764066e19fd548a5972342d833bb516afc09b3e4101ad944049d91c08fcdf26"
}

# A 100k-entry hash, a sort, and regex matches and substitutions over the joined text.
test_perl() {
  require perl
  local script
  script=$(cat <<'EOF'
use strict; use warnings; use Digest::SHA qw(sha256_hex);
my %table;
$table{"k$_"} = "v" . ($_ * 7919 % 100_003) for 0 .. 99_999;
my $sevens = grep { /^v\d*7\d*$/ } values %table;
my $text = join(",", map { "$_=$table{$_}" } sort keys %table);
(my $marked = $text) =~ s/(\d)\1/<$1>/g;
my @pairs = ($marked =~ /<(\d)>/g);
print "$sevens ", scalar(@pairs), " ", sha256_hex($marked), "\n";
EOF
)
  debugged "$work/out" perl -e "$script"
  expect_output "$work/out" "40950 72366 d9895c4920cd38ecef449e42cc70608bc4efc6b809e216d0e536208dc981a29f"
}

# write_files ROUND STEP: rewrites every STEP-th of the 40 files, 50 lines each.
write_files() {
  local file line
  for ((file = 0; file < 40; file += $2)); do
    for ((line = 1; line <= 50; line++)); do echo "round $1, line $line of file $file"; done \
      >"file$file.txt"
  done
}

# A repository of 40 files, two commits, the log, gc (which runs pack-objects and others) and a
# full fsck. Fixed identities and dates make the commit ids known answers.
test_git() {
  require git
  enter_new_git_repo_dir
  debugged "$work/out" git -c init.defaultBranch=main init -q
  write_files 1 1
  debugged "$work/out" git add -A
  debugged "$work/out" git commit -q -m one
  write_files 2 3
  debugged "$work/out" git commit -q -a -m two
  debugged "$work/out" git log --format='%H %s'
  expect_output "$work/out" "64235f2b91dea612c1e63bbedb5cb4c6205d29eb two
b0d93114f5d610e77d53e7a8dd9b0e61d457419c one"
  debugged "$work/out" git gc -q --prune=now
  debugged "$work/out" git fsck --full --strict
}

# 20k INSERT statements in one transaction (each parsed and prepared: much malloc traffic), an
# index, and a GROUP BY.
test_sqlite() {
  require sqlite3
  {
    echo 'CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER NOT NULL, name TEXT NOT NULL);'
    echo 'BEGIN;'
    awk 'BEGIN { for (i = 1; i <= 20000; i++)
                   printf("INSERT INTO t VALUES(%d, %d, '\''name-%05d'\'');\n", i, (i * 7) % 13, i) }'
    echo 'COMMIT;'
    echo 'CREATE INDEX t_grp ON t(grp);'
    echo 'SELECT grp, count(*), sum(id), max(name) FROM t GROUP BY grp ORDER BY grp LIMIT 3;'
    echo 'SELECT count(DISTINCT substr(name, 6, 3)) FROM t WHERE grp > 6;'
  } >"$work/workload.sql"
  debugged "$work/out" sqlite3 "$work/test.db" -init /dev/null -bail -batch <"$work/workload.sql"
  expect_output "$work/out" "0|1538|15385383|name-19994
1|1539|15388461|name-19996
2|1539|15391539|name-19998
200"
}

run_requested_program
