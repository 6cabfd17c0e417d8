// A fully static executable (-static) with libtraymalloc.a: glibc's libc.a brings its own
// malloc, and ours must take its place for everything, the C library's internal allocations
// (strdup, thread start-up) included, without a duplicate-symbol clash at link time.
// A plain program, not GoogleTest: libgtest.a pulls in getaddrinfo, which draws a linker
// warning in static links. Exits 1 after printing each failed check.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "traymalloc.h"

namespace {

int g_failures = 0;

void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "FAIL: %s\n", what);
  ++g_failures;
}

void maps_no_shared_object() {
  std::ifstream maps("/proc/self/maps");
  size_t lines = 0;
  bool shared_object = false;
  for (std::string line; std::getline(maps, line); ++lines)
    shared_object |= line.find(".so") != std::string::npos;
  check(lines > 0, "/proc/self/maps is empty");
  check(!shared_object, "a shared object is mapped");
}

void malloc_new_and_libc_allocations_are_ours() {
  void* block = malloc(100);
  check(tray_owns(block) == 1, "malloc(100) is not ours");
  free(block);
  void* large = malloc(size_t{8} << 20);
  check(tray_owns(large) == 1, "malloc(8 MiB) is not ours");
  free(large);
  auto* text = new std::string(500, 's');
  check(tray_owns(text->data()) == 1, "operator new is not ours");
  delete text;
  char* copy = strdup("copied by libc's strdup");
  check(tray_owns(copy) == 1, "strdup's block is not ours");
  free(copy);
}

void threads_allocate_from_traymalloc() {
  std::vector<int> owned(4, -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&owned, t] {
      std::vector<void*> blocks;
      for (int i = 0; i < 1000; ++i) blocks.push_back(malloc(16 + i));
      int all = 1;
      for (void* p : blocks) all &= tray_owns(p);
      for (void* p : blocks) free(p);
      owned[t] = all;
    });
  }
  for (std::thread& t : threads) t.join();
  check(owned == std::vector<int>(4, 1), "a thread's blocks are not ours");
}

}  // namespace

int main() {
  maps_no_shared_object();
  malloc_new_and_libc_allocations_are_ours();
  threads_allocate_from_traymalloc();
  if (g_failures == 0) std::puts("PASS");
  return g_failures == 0 ? 0 : 1;
}
