#!/usr/bin/env bash
# Builds the Debian packages (tools/build-debs), checks them with lintian, installs them on this
# machine and uses them as a user would, then purges them and checks that nothing of them is
# left. Needs root and a Debian system with no traymalloc package installed; it leaves the
# machine as it found it (the purge runs on failure too), so CI runs it (tools/run-tests).
#
#   - libtraymalloc0 and traymalloc-tools alone (no unversioned .so): the ldconfig trigger
#     ran; the installed tray-run preloads /usr/lib/<multiarch>/libtraymalloc.so.0 into
#     python3, whose statistics show traymalloc served it; LD_PRELOAD=libtraymalloc.so.0 too;
#   - with libtraymalloc-dev: a C program built with `pkg-config --cflags --libs traymalloc`
#     (no rpath) and the CMake project of tests/install (find_package(traymalloc), nothing on
#     CMAKE_PREFIX_PATH) run on the installed library; tray-stats and tray-prof read what it
#     wrote;
#   - after apt-get purge: no package left in dpkg's database, no file or directory of theirs,
#     nothing named traymalloc in their directories, none in the ldconfig cache.
#
# Usage: tests/package/run.sh [DEB_DIR]   DEB_DIR: the three .deb files (default: built here)
# Environment: CC, CXX, CMAKE as in tests/install/run.sh.
set -euo pipefail

root=$(cd "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
cc=${CC:-cc}
cmake=${CMAKE:-cmake}
packages=(libtraymalloc0 libtraymalloc-dev traymalloc-tools)
apt=(apt-get -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends)
export DEBIAN_FRONTEND=noninteractive

fail() { echo "FAIL: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || fail "installs packages: run it as root"
for package in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -qv 'not-installed'; then
    fail "$package is installed on this machine already; this test would remove it"
  fi
done
# Another traymalloc (e.g. cmake --install to /usr/local) would be found before the packages'.
if pkg-config --exists traymalloc; then
  fail "pkg-config finds a traymalloc already: $(pkg-config --variable=pcfiledir traymalloc)"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tray-package.XXXXXX")
# apt reads local .deb files as its own user, _apt.
chmod 755 "$work"
installed_here=()  # what this test installed, for the purge

cleanup() {
  local status=$?
  if ((${#installed_here[@]})); then
    "${apt[@]}" purge "${installed_here[@]}" >"$work/cleanup.log" 2>&1 ||
      { cat "$work/cleanup.log" >&2; echo "FAIL: purge of ${installed_here[*]} failed" >&2; status=1; }
  fi
  rm -rf -- "$work"
  exit "$status"
}
trap cleanup EXIT

# quietly LOG COMMAND...: runs COMMAND with its output in LOG, shown only if it fails.
quietly() {
  local log=$1; shift
  "$@" >"$log" 2>&1 || { cat "$log" >&2; fail "'$*' failed"; }
}

# install DEB...: installs the packages with apt, which brings their dependencies; all of them
# are purged at the end.
install() {
  local plan
  plan=$("${apt[@]}" --simulate install "$@" | sed -n 's/^Inst \([^ ]*\) .*/\1/p')
  # shellcheck disable=SC2206  # package names are words
  installed_here+=($plan)
  quietly "$work/install.log" "${apt[@]}" install "$@"
}

multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=/usr/lib/$multiarch

# from_libdir OUTPUT: a test program's "... from PATH" names the packaged library (the loader
# may name it through /lib, which is a link to /usr/lib).
from_libdir() {
  [[ $1 == *" from "* ]] && [[ $(realpath -- "${1##* from }") == "$libdir"/libtraymalloc.so.0.* ]]
}

# --- build and lintian --------------------------------------------------------------------
if [[ $# -ge 1 ]]; then
  debs=$(realpath -- "$1")
else
  debs=$work/debs
  echo "=== build the packages (tools/build-debs)"
  start=$SECONDS
  "$root/tools/build-debs" "$debs"
  echo "built in $((SECONDS - start)) s"
fi
deb() { find "$debs" -maxdepth 1 -name "${1}_*.deb" -print -quit; }
for package in "${packages[@]}"; do
  [[ -n $(deb "$package") ]] || fail "no ${package}_*.deb in $debs"
done
ls -l "$debs"/*.deb

echo "=== lintian"
# Errors fail the test; warnings are shown (docs/GUIDE.md, "Debian packages", lists those
# that remain).
status=0
lintian --fail-on error "$(deb libtraymalloc0)" "$(deb libtraymalloc-dev)" \
  "$(deb traymalloc-tools)" >"$work/lintian.out" 2>&1 || status=$?
grep -v '^running with root privileges' "$work/lintian.out" || true
[[ $status -eq 0 ]] || fail "lintian found errors"

# Which of the packages' directories were here before, to tell theirs from the system's.
existed_before=$work/existed-before
for package in "${packages[@]}"; do
  dpkg-deb --fsys-tarfile "$(deb "$package")" | tar -t | sed 's|^\./|/|; s|/$||' | grep -v '^$'
done | sort -u | while read -r path; do
  if [[ -e $path || -L $path ]]; then echo "$path"; fi
done >"$existed_before"

# --- the runtime and the tools, without -dev ----------------------------------------------
echo "=== install libtraymalloc0 and traymalloc-tools"
install "$(deb libtraymalloc0)" "$(deb traymalloc-tools)"
[[ -f $libdir/libtraymalloc.so.0 ]] || fail "no $libdir/libtraymalloc.so.0"
[[ ! -e $libdir/libtraymalloc.so ]] || fail "libtraymalloc0 installed the unversioned .so link"
# The package runs no ldconfig itself: only its trigger can have put the library in the cache
# (under /lib where /lib is /usr/lib).
ldconfig -p | grep -Eq "libtraymalloc\.so\.0 .*=> (/usr)?/lib/$multiarch/libtraymalloc\.so\.0$" ||
  fail "the ldconfig cache has no libtraymalloc.so.0 (trigger)"

# shellcheck disable=SC2016  # expanded by the inner shell
preload=$(/usr/bin/tray-run sh -c 'printf %s "$LD_PRELOAD"')
[[ $preload == "$libdir/libtraymalloc.so.0" ]] || fail "tray-run preloaded '$preload'"

# stats_served LOG: the statistics dump shows traymalloc served the program.
stats_served() {
  grep -Eq '^  small: [1-9][0-9]* live blocks .* in [1-9][0-9]* pages' "$1" ||
    fail "no traymalloc statistics: $(<"$1")"
}
program=(/usr/bin/python3 -c 'import json; print(len(json.dumps([str(i) for i in range(100000)])))')
TRAY_OPTIONS=stats=1 /usr/bin/tray-run "${program[@]}" >/dev/null 2>"$work/tray-run.err" ||
  fail "tray-run python3 failed: $(<"$work/tray-run.err")"
stats_served "$work/tray-run.err"
TRAY_OPTIONS=stats=1 LD_PRELOAD=libtraymalloc.so.0 "${program[@]}" >/dev/null \
  2>"$work/preload.err" || fail "LD_PRELOAD=libtraymalloc.so.0 python3 failed: $(<"$work/preload.err")"
stats_served "$work/preload.err"
LD_PRELOAD=libtraymalloc.so.0 /usr/bin/python3 -c 'print(open("/proc/self/maps").read())' \
  >"$work/maps"
grep -q " $libdir/libtraymalloc\.so\.0\.[0-9.]*$" "$work/maps" ||
  fail "python3 did not map $libdir's library: $(grep traymalloc "$work/maps")"
echo "tray-run and LD_PRELOAD=libtraymalloc.so.0: python3 served by $libdir/libtraymalloc.so.0"

# --- the development package ----------------------------------------------------------------
echo "=== install libtraymalloc-dev"
install "$(deb libtraymalloc-dev)"
flags=$(pkg-config --cflags --libs traymalloc)
[[ $flags != *rpath* ]] || fail "pkg-config's flags hold an rpath: $flags"
# shellcheck disable=SC2086  # the flags are words
quietly "$work/pkg-config.log" "$cc" -std=c11 -Wall -Wextra -Werror \
  "$root/tests/install/pkg_config_app.c" -o "$work/app_c" $flags
output=$("$work/app_c") || fail "app_c failed"
echo "pkg-config: $output"
from_libdir "$output" || fail "app_c did not load $libdir's library"
readelf -d "$work/app_c" | grep -Eq 'RPATH|RUNPATH' && fail "app_c carries an rpath"

quietly "$work/cmake-configure.log" "$cmake" -S "$root/tests/install" -B "$work/cmake-build" \
  -DCMAKE_CXX_COMPILER="${CXX:-c++}"
quietly "$work/cmake-build.log" "$cmake" --build "$work/cmake-build"
output=$("$work/cmake-build/app_shared" shared) || fail "app_shared failed"
echo "find_package: $output"
from_libdir "$output" || fail "app_shared did not load $libdir's library"
"$work/cmake-build/app_static" static || fail "app_static failed"

# The installed viewers on what the installed (stripped) library wrote.
TRAY_OPTIONS=stats=1,stats_format=json,stats_file="$work/stats.jsonl" "$work/app_c" >/dev/null ||
  fail "app_c failed with stats=1"
/usr/bin/tray-stats "$work/stats.jsonl" >"$work/tray-stats.out" 2>&1 ||
  fail "tray-stats failed: $(<"$work/tray-stats.out")"
grep -q '^size classes holding memory' "$work/tray-stats.out" ||
  fail "tray-stats did not show the dump: $(<"$work/tray-stats.out")"
TRAY_OPTIONS=prof=1,prof_final=1,prof_sample=64k,prof_file="$work/app.heap" "$work/app_c" \
  >/dev/null || fail "app_c failed with prof=1"
/usr/bin/tray-prof top "$work/app.heap" -n 5 >"$work/tray-prof.out" 2>&1 ||
  fail "tray-prof failed: $(<"$work/tray-prof.out")"
grep -Eq '  keep_live$' "$work/tray-prof.out" ||
  fail "tray-prof did not name app_c's site: $(<"$work/tray-prof.out")"
echo "tray-stats and tray-prof read the installed library's dump and profile"

# --- purge: nothing left ------------------------------------------------------------------
# dpkg -L names the root "/.": it was there before.
for package in "${packages[@]}"; do dpkg -L "$package"; done | grep -vx '/\.' | sort -u >"$work/files"
echo "=== purge (${#installed_here[@]} packages: ${installed_here[*]})"
quietly "$work/purge.log" "${apt[@]}" purge "${installed_here[@]}"
installed_here=()
for package in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -qv 'not-installed'; then
    fail "$package is still in dpkg's database: $(dpkg -l "$package" | tail -1)"
  fi
done
left=$(while read -r path; do
  if [[ -e $path || -L $path ]] && ! grep -qxF -- "$path" "$existed_before"; then
    echo "$path"
  fi
done <"$work/files")
[[ -z $left ]] || fail "left after the purge: $left"
left=$(find "$libdir" /usr/include /usr/bin /usr/share/doc \
  \( -name '*traymalloc*' -o -name 'tray-*' -o -path /usr/include/tray \) -print)
[[ -z $left ]] || fail "left after the purge: $left"
if ldconfig -p | grep -q libtraymalloc; then
  fail "the ldconfig cache still has libtraymalloc: $(ldconfig -p | grep libtraymalloc)"
fi
echo "purged: no package in dpkg's database; of the $(wc -l <"$work/files") paths dpkg -L" \
  "listed, only directories that were here before are left; none in the ldconfig cache"
echo "PASS"
