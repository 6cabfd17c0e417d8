// A program with known allocation sites for the heap profile tests (prof_test.py): each site
// allocates blocks of one size, so the profile's estimates can be checked against the truth.
// Modes:
//   sites PATH   three sites hold about 16 MB each (16 B, 1000 B with new[], 192 KiB blocks:
//                the size of a big class, whose samples count its blocks' bytes);
//                writes the profile to PATH with tray_prof_dump, keeps everything to the end
//   peak         site_peak holds 32 MB and frees it, then site_after holds 4 MB
//   signal       raises SIGUSR1 while site_small's blocks are live
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "traymalloc.h"

namespace {

constexpr int kSmallCount = 1000000;
constexpr int kMediumCount = 16384;
constexpr int kLargeCount = 80;
constexpr int kLargeBytes = 192 * 1024;
void* g_small[kSmallCount];
char* g_medium[kMediumCount];
void* g_large[kLargeCount];

}  // namespace

// Not static: the profile's readers name them from the symbol table.
__attribute__((noinline)) void site_small() {
  for (void*& p : g_small) p = malloc(16);
}
__attribute__((noinline)) void site_medium() {
  for (char*& p : g_medium) p = new char[1000];
}
__attribute__((noinline)) void site_large() {
  for (void*& p : g_large) p = malloc(kLargeBytes);
}
__attribute__((noinline)) void site_peak() {
  for (void*& p : g_small) p = malloc(32);
}
__attribute__((noinline)) void site_after() {
  for (int i = 0; i < kSmallCount / 4; ++i) g_small[i] = malloc(16);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (std::strcmp(mode, "sites") == 0 && argc > 2) {
    site_small();
    site_medium();
    site_large();
    const int result = tray_prof_dump(argv[2]);
    std::printf("small %d %d\nmedium %d %d\nlarge %d %d\n", kSmallCount, 16, kMediumCount, 1000,
                kLargeCount, kLargeBytes);
    return result;
  }
  if (std::strcmp(mode, "peak") == 0) {
    site_peak();
    for (void* p : g_small) free(p);
    site_after();
    return 0;
  }
  if (std::strcmp(mode, "signal") == 0) {
    site_small();
    return raise(SIGUSR1);
  }
  std::fprintf(stderr, "usage: prof_sites sites PATH | peak | signal\n");
  return 2;
}
