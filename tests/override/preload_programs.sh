#!/usr/bin/env bash
# Runs real programs from Debian with libtraymalloc.so preloaded, checks their results against
# answers computed once under glibc's malloc, and checks that traymalloc served them: with
# TRAY_OPTIONS=stats=1 every process prints its statistics to stderr at exit.
#
# Usage: preload_programs.sh LIBTRAYMALLOC {python|perl|git|sqlite|sort|compile|archive|all}
# Exit status: 0 pass, 1 fail, 77 the program is not installed (ctest reports it as skipped).
set -euo pipefail

readonly programs=(python perl git sqlite sort compile archive)
# shellcheck source-path=SCRIPTDIR source=../support/preload_programs_lib.sh
source "$(dirname "$0")/../support/preload_programs_lib.sh"
parse_arguments "$@"
make_work_dir tray-preload

# The stderr of one preloaded process tree must show that traymalloc served at least one page,
# and must hold no other message from traymalloc (those report misuse or corruption).
check_served() {
  local stderr_file=$1 what=$2
  if ! grep -Eq '^traymalloc: stats: pid=[0-9]+ reason=exit$' "$stderr_file" ||
     ! grep -Eq '^  small: [1-9][0-9]* live blocks .* in [1-9][0-9]* pages' "$stderr_file"; then
    cat "$stderr_file" >&2
    fail "$what: no statistics with live blocks in pages on stderr"
  fi
  if awk '/traymalloc/ && !/^traymalloc: stats: / { found = 1 } END { exit !found }' \
       "$stderr_file"; then
    cat "$stderr_file" >&2
    fail "$what: traymalloc reported a problem"
  fi
  echo "$what: $(grep -c '^traymalloc: stats: ' "$stderr_file") process(es) served," \
       "first: $(grep -m1 '^traymalloc: stats: ' "$stderr_file")"
}

# preloaded STDOUT_FILE COMMAND...: runs COMMAND under traymalloc, stdout to STDOUT_FILE.
preloaded() { run_under_traymalloc stats=1 check_served "$@"; }

# Dict, list and str churn in three threads. PYTHONMALLOC=malloc routes every object through
# malloc: by default pymalloc would carve small objects from its own mmap'ed arenas.
test_python() {
  local python=/usr/bin/python3
  require "$python"
  cat >"$work/workload.py" <<'EOF'
import hashlib, json, threading

def workload(seed):
    table = {}
    for i in range(200_000):
        key = f"k{(i * 2654435761 + seed) % 4294967296:08x}-{i}"
        table[key] = [i, str(i * i), key[::-1]]
    for key in list(table)[::3]:
        del table[key]
    words = sorted(table, key=lambda k: (k[::-1], len(k)))
    text = "\n".join(f"{w}:{table[w][1]}" for w in words)
    groups = {}
    for w in words:
        groups.setdefault(w[1:3], []).append(w)
    summary = json.dumps({k: len(v) for k, v in groups.items()}, sort_keys=True)
    return hashlib.sha256((text + summary).encode()).hexdigest()

results = [None] * 3
def run(slot):
    results[slot] = workload(slot)
threads = [threading.Thread(target=run, args=(slot,)) for slot in range(3)]
for t in threads: t.start()
for t in threads: t.join()
print(hashlib.sha256("".join(results).encode()).hexdigest())
EOF
  PYTHONMALLOC=malloc preloaded "$work/out" "$python" "$work/workload.py"
  expect_output "$work/out" 6da7295e80d813fed4f1baabd06b498ab45749bb29f1474846ef5a3a1ebb1bf0
}

# Hash and string churn: 200k keys, deletions, a custom sort, a regex rewrite of 10 MB.
test_perl() {
  require perl
  local script
  script=$(cat <<'EOF'
use strict; use warnings; use Digest::SHA qw(sha256_hex);
my %table;
for my $i (0 .. 199_999) {
  my $key = sprintf("k%08x-%d", ($i * 2654435761) % 4294967296, $i);
  $table{$key} = join(",", reverse(split(//, $key)), $i * $i);
}
delete @table{grep { /7-/ } keys %table};
my @sorted = sort { length($table{$a}) <=> length($table{$b}) or $a cmp $b } keys %table;
my $text = join("\n", map { "$_=$table{$_}" } @sorted);
(my $squeezed = $text) =~ s/([0-9a-f])\1+/$1/g;
print sha256_hex($text . $squeezed), " ", scalar(@sorted), "\n";
EOF
)
  preloaded "$work/out" perl -e "$script"
  expect_output "$work/out" "4c4bf1ce391c462e72977e482a68028cb27709553aa63c0756ef8bdb1347547c 187500"
}

# Two commits of 3000 files, gc (pack-objects with threads) and a full fsck. Fixed identities
# and dates make the commit id a known answer; no user or system configuration is read.
test_git() {
  require git
  require perl
  cat >"$work/generate.pl" <<'EOF'
# ROUND 1 writes 3000 files in 30 directories; ROUND 2 rewrites every third one.
my $round = shift;
for my $i (0 .. 2999) {
  next if $round == 2 && $i % 3;
  my $dir = sprintf("dir%02d", $i % 30);
  mkdir $dir;
  open(my $out, ">", "$dir/file$i.txt") or die "$dir/file$i.txt: $!";
  print $out join("\n", map { "round $round line $_ of file $i " . ("x" x ($i % 97)) } 1 .. 40), "\n";
  close($out);
}
EOF
  enter_new_git_repo_dir
  perl "$work/generate.pl" 1
  preloaded "$work/out" git -c init.defaultBranch=main init -q
  preloaded "$work/out" git add -A
  preloaded "$work/out" git commit -q -m one
  perl "$work/generate.pl" 2
  preloaded "$work/out" git rm -q dir05/file5.txt
  preloaded "$work/out" git add -A
  preloaded "$work/out" git commit -q -m two
  preloaded "$work/out" git -c pack.threads=2 gc -q --prune=now
  preloaded "$work/out" git fsck --full --strict
  preloaded "$work/out" git rev-parse HEAD
  expect_output "$work/out" 4246dc2ed8e58702db8c70f69c4bb3017ec077ba
  preloaded "$work/out" git count-objects -v
  grep -qx 'in-pack: 4045' "$work/out" || fail "unexpected object count: $(<"$work/out")"
}

# 100k rows from a recursive CTE, two indexes, deletions, VACUUM; a 64 MiB page cache keeps
# the database pages in malloc'ed memory. sha3_query hashes the whole sorted table.
test_sqlite() {
  require sqlite3
  cat >"$work/workload.sql" <<'EOF'
PRAGMA cache_size = -65536;
PRAGMA temp_store = memory;
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT NOT NULL, val INTEGER NOT NULL);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000)
INSERT INTO t SELECT x, printf('row-%06d-%08x', x, (x * 2654435761) % 4294967296),
                     (x * x) % 1000003 FROM c;
CREATE INDEX t_val ON t(val);
CREATE INDEX t_name ON t(name);
DELETE FROM t WHERE id % 7 = 0;
VACUUM;
PRAGMA integrity_check;
SELECT count(*), sum(val), sum(length(name)) FROM t;
SELECT hex(sha3_query('SELECT name, val FROM t ORDER BY val, name'));
SELECT length(group_concat(name, ',')) FROM (SELECT name FROM t ORDER BY substr(name, 12) DESC);
EOF
  preloaded "$work/out" sqlite3 "$work/test.db" -init /dev/null -bail -batch <"$work/workload.sql"
  expect_output "$work/out" "ok
85715|42721580735|1628585
E0EC2252FDCA97900F701C715CCD08FCBAA5A6FFE9A33093E5447750F37BD37B
1714299"
}

# 50 MB of lines sorted twice, in memory and as an external merge of 8 MiB runs, both with
# two threads; the reference is the same sort under glibc's malloc.
test_sort() {
  require sort
  require perl
  perl -e 'my $x = 1;
    for my $i (1 .. 2_300_000) {
      $x = ($x * 1103515245 + 12345) % 2147483648;
      printf("%08x%04x %d %s\n", $x, $i % 65536, $x % 1000, "v" x ($i % 9));
    }' >"$work/input"
  # shellcheck disable=SC2054  # commas belong to sort's key syntax
  local keys=(-t ' ' -k2,2n -k1,1)
  LC_ALL=C sort "${keys[@]}" "$work/input" >"$work/expected"
  LC_ALL=C preloaded "$work/in-memory" sort --parallel=2 "${keys[@]}" "$work/input"
  cmp -s "$work/expected" "$work/in-memory" || fail "in-memory sort differs from the reference"
  LC_ALL=C preloaded "$work/merged" sort --parallel=2 -S 8M -T "$work" "${keys[@]}" "$work/input"
  cmp -s "$work/expected" "$work/merged" || fail "external-merge sort differs from the reference"
}

# The toolchain under traymalloc: make -j2 runs gcc -O2 (cc1, as, collect2, ld: every process
# preloaded) over 20 C files and a C++ program with templates, iostreams and <regex>, then
# runs what it built; the program's answer is fixed.
test_compile() {
  require make
  require g++
  mkdir "$work/src"
  local i
  for i in $(seq 1 20); do
    echo "int f$i(int x) { return x * $i + $((i % 7)); }" >"$work/src/f$i.c"
  done
  cat >"$work/src/main.cpp" <<'EOF'
#include <iostream>
#include <map>
#include <regex>
#include <string>
#include <vector>
extern "C" int f1(int);
extern "C" int f7(int);
extern "C" int f20(int);
int main() {
  std::map<std::string, std::vector<int>> table;
  for (int i = 0; i < 20000; ++i) table[std::to_string(i % 997)].push_back(i);
  const std::regex repeated("([0-9])\\1");
  size_t count = 0;
  for (const auto& [key, values] : table) {
    if (std::regex_search(key, repeated)) count += values.size();
  }
  std::cout << table.size() << " " << count << " " << f1(3) + f7(3) + f20(3) << "\n";
}
EOF
  printf '%s\n' 'OBJECTS = $(patsubst %.c,%.o,$(wildcard f*.c))' \
    'program: main.o libf.a' $'\tg++ -O2 -o $@ main.o libf.a' \
    'libf.a: $(OBJECTS)' $'\tar rcs $@ $^' \
    '%.o: %.c' $'\tgcc -O2 -c $< -o $@' \
    'main.o: main.cpp' $'\tg++ -O2 -std=c++20 -c $< -o $@' >"$work/src/Makefile"
  preloaded "$work/out" make -s -j2 -C "$work/src"
  preloaded "$work/out" "$work/src/program"
  expect_output "$work/out" "997 3545 91"
}

# A tree of 300 files through tar, multi-threaded xz, xz -d, gzip and gzip -d, all preloaded in
# one pipeline, must give back the byte stream tar writes under glibc's malloc.
test_archive() {
  require tar
  require xz
  require gzip
  mkdir "$work/tree"
  local i
  for i in $(seq 1 300); do
    mkdir -p "$work/tree/d$((i % 13))"
    seq "$i" $((i * 37)) >"$work/tree/d$((i % 13))/f$i"
  done
  local tar_options=(--sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work"
                     -cf - tree)
  tar "${tar_options[@]}" >"$work/expected"
  # shellcheck disable=SC2016  # the inner shell expands "$@"
  preloaded "$work/roundtrip" sh -c 'tar "$@" | xz -T2 -6 | xz -d | gzip -c | gzip -dc' sh \
    "${tar_options[@]}"
  cmp -s "$work/expected" "$work/roundtrip" || fail "the tar stream came back changed"
}

run_requested_program
