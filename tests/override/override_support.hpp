// Helpers shared by the override tests: the tray_* functions found at run time, and byte
// patterns that show whether a block was overwritten.
#pragma once

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "traymalloc.h"

namespace tray_test {

// The tray_* functions of whichever libtraymalloc.so the process has, preloaded or linked. A
// program that is only preloaded cannot link against them; null when traymalloc is absent.
struct LoadedTray {
  decltype(&tray_owns) owns;
  decltype(&tray_stats_get) stats_get;

  static LoadedTray find() {
    return {reinterpret_cast<decltype(&tray_owns)>(dlsym(RTLD_DEFAULT, "tray_owns")),
            reinterpret_cast<decltype(&tray_stats_get)>(dlsym(RTLD_DEFAULT, "tray_stats_get"))};
  }
  bool present() const { return owns != nullptr && stats_get != nullptr; }

  tray_stats stats() const {
    tray_stats s{};
    s.version = TRAY_STATS_VERSION;
    stats_get(&s);
    return s;
  }
};

// glibc's own allocator, reached through libc.so.6 itself: under LD_PRELOAD the plain names
// are traymalloc's. Its mallinfo2 tells how many bytes glibc's malloc has handed out.
struct LibcMalloc {
  void* (*malloc)(size_t);
  void* (*realloc)(void*, size_t);
  void (*free)(void*);
  size_t (*usable_size)(void*);
  struct mallinfo2 (*mallinfo2)();

  static LibcMalloc find() {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (libc == nullptr) return {};
    const LibcMalloc found{
        reinterpret_cast<void* (*)(size_t)>(dlsym(libc, "malloc")),
        reinterpret_cast<void* (*)(void*, size_t)>(dlsym(libc, "realloc")),
        reinterpret_cast<void (*)(void*)>(dlsym(libc, "free")),
        reinterpret_cast<size_t (*)(void*)>(dlsym(libc, "malloc_usable_size")),
        reinterpret_cast<struct mallinfo2 (*)()>(dlsym(libc, "mallinfo2"))};
    // glibc's first malloc in a thread allocates that thread's cache, for good: done here,
    // it does not show up later as a block that was never freed.
    if (found.present()) found.free(found.malloc(1));
    return found;
  }
  bool present() const {
    return malloc && realloc && free && usable_size && mallinfo2;
  }
  // Bytes in glibc's blocks, heap and mmap'ed ones. Blocks parked in glibc's per-thread
  // cache (up to 1032 bytes) still count as in use.
  size_t bytes_in_use() const {
    const struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
  }
};

// Path of the object that defines the symbol the process-wide lookup finds for `name`.
inline std::string defining_object(const char* name) {
  void* symbol = dlsym(RTLD_DEFAULT, name);
  Dl_info info{};
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

// True if any mapping of this process comes from a file whose name contains `fragment`.
inline bool process_maps_file(const std::string& fragment) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(fragment) != std::string::npos) return true;
  return false;
}

inline unsigned char pattern_byte(uint32_t seed, size_t i) {
  return static_cast<unsigned char>((seed * 131u + i * 7u) ^ (i >> 8));
}

inline void fill_pattern(void* block, size_t bytes, uint32_t seed) {
  auto* p = static_cast<unsigned char*>(block);
  for (size_t i = 0; i < bytes; ++i) p[i] = pattern_byte(seed, i);
}

inline bool has_pattern(const void* block, size_t bytes, uint32_t seed) {
  const auto* p = static_cast<const unsigned char*>(block);
  for (size_t i = 0; i < bytes; ++i)
    if (p[i] != pattern_byte(seed, i)) return false;
  return true;
}

inline bool is_aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// With a program heap as the thread's default, malloc, calloc, realloc, operator new and what
// libc allocates on the program's behalf (strdup) land in it, on that thread only; a reset
// frees them all. True if every check held; `why` says which failed.
inline bool default_heap_routes_this_thread(std::string* why) {
  tray_heap_t* heap = tray_heap_new();
  if (heap == nullptr) return *why = "tray_heap_new failed", false;
  tray_heap_set_default(heap);
  void* block = malloc(100);
  void* zeroed = calloc(3, 100);
  void* grown = realloc(malloc(10), 50000);
  auto* object = new std::string(300, 'x');
  char* copy = strdup("a string libc copies");
  void* elsewhere = nullptr;
  pthread_t thread;
  pthread_create(&thread, nullptr, [](void* out) -> void* {
    *static_cast<void**>(out) = malloc(100);
    return nullptr;
  }, &elsewhere);
  pthread_join(thread, nullptr);
  tray_heap_set_default(nullptr);
  void* after = malloc(100);
  const struct { const char* name; const void* p; bool in_heap; } checks[] = {
      {"malloc", block, true}, {"calloc", zeroed, true}, {"realloc", grown, true},
      {"new", object, true}, {"strdup", copy, true}, {"another thread's malloc", elsewhere, false},
      {"malloc after the default", after, false}};
  for (const auto& check : checks) {
    if ((tray_heap_of(check.p) == heap) != check.in_heap)
      return *why = std::string(check.name) + (check.in_heap ? " missed" : " went into") + " the heap", false;
  }
  free(elsewhere);
  free(after);
  tray_heap_destroy(heap);  // block, zeroed, grown, object's buffer and copy with it
  return true;
}

}  // namespace tray_test
