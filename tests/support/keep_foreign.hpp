// Turns the freeing side's reuse of other threads' blocks (lib/heap/reuse.hpp) on or off for the
// calling thread at once, instead of after the spans of frees its counters decide on: for
// tests that run those paths in threads that do little.
#pragma once

#include <cstdint>

#include "heap/heap.hpp"
#include "traymalloc.h"

namespace tray_test {

inline void keep_foreign_blocks(bool on) {
  if (tray::tls_own_heap == nullptr) tray_free(tray_malloc(16));  // the thread's heap
  tray::Heap* heap = tray::tls_own_heap;
  heap->reuse_on = on;
  heap->reuse_next_look = on ? UINT64_MAX : heap->counters.remote_frees + tray::kReuseEpochFrees;
  heap->reuse_left = 1;  // the next free of another heap's block takes the keeping path
}

}  // namespace tray_test
