/* A C program built against an installed traymalloc with `pkg-config --cflags --libs
 * traymalloc` alone, as tests/install/run.sh builds it, and run without LD_LIBRARY_PATH: the
 * .pc file's rpath must find the library. It checks that its malloc is traymalloc's and
 * prints the file libtraymalloc.so was loaded from, for run.sh to compare with the prefix.
 * tests/downstream and tests/package build it too: linked with traymalloc::traymalloc_static
 * by a parent project, and against the Debian packages.
 *
 * It keeps kLiveBytes live to the end, so that a heap profile written at exit
 * (prof_final=1) holds samples of a site named keep_live for tray-prof to find. */
#define _GNU_SOURCE
#include <traymalloc.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

enum { kLiveBlocks = 64, kLiveBlockBytes = 64 << 10 };

static void* live[kLiveBlocks];

/* Not inlined: the profile's site is the innermost frame outside the allocator. */
__attribute__((noinline)) void keep_live(void) {
  for (int i = 0; i < kLiveBlocks; ++i) live[i] = malloc(kLiveBlockBytes);
}

int main(void) {
  tray_stats before = {.version = TRAY_STATS_VERSION};
  tray_stats after = {.version = TRAY_STATS_VERSION};
  if (tray_stats_get(&before) != 0) {
    fprintf(stderr, "FAIL: tray_stats_get\n");
    return 1;
  }
  keep_live();
  if (tray_stats_get(&after) != 0) {
    fprintf(stderr, "FAIL: tray_stats_get\n");
    return 1;
  }
  int failures = 0;
  for (int i = 0; i < kLiveBlocks; ++i) {
    if (tray_owns(live[i]) != 1 || tray_usable_size(live[i]) < kLiveBlockBytes) {
      fprintf(stderr, "FAIL: malloc's block %p is not traymalloc's\n", live[i]);
      ++failures;
      break;
    }
  }
  unsigned long long allocations = after.large.allocations - before.large.allocations;
  for (unsigned c = 0; c < after.class_count; ++c)
    allocations += after.classes[c].allocations - before.classes[c].allocations;
  if (allocations < kLiveBlocks) {
    fprintf(stderr, "FAIL: traymalloc counted %llu allocations of the %d malloc calls\n",
            allocations, kLiveBlocks);
    ++failures;
  }
  Dl_info library;
  if (dladdr((void*)&tray_owns, &library) == 0 || library.dli_fname == NULL) {
    fprintf(stderr, "FAIL: dladdr does not know tray_owns\n");
    return 1;
  }
  printf("traymalloc %d.%d.%d served %llu mallocs from %s\n", TRAY_VERSION_MAJOR,
         TRAY_VERSION_MINOR, TRAY_VERSION_PATCH, allocations, library.dli_fname);
  return failures == 0 ? 0 : 1;
}
