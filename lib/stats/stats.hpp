// Counters. Process-wide ones are relaxed atomics bumped on slow paths (page and segment
// turnover, large blocks, thread life cycle). Per-class counts of allocations and frees are
// kept in each heap (HeapCounters) as plain integers that only the heap's thread writes, and
// only on slow paths: a heap counts the blocks of its slots' lists once they are handed out
// (every small allocation is a pop from a slot: heap/queue.hpp, slot_count_load), and the
// frees its own thread made into its pages when a slow path next looks at the page
// (page_account). So the counters never fall, and never run ahead of the truth; a dump adds
// what the calling thread's own heaps have not counted yet (report/report.cpp). The fast
// paths count nothing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "core/core.hpp"
#include "platform/platform.hpp"
#include "size_classes/size_classes.hpp"
#include "stats/limit.hpp"

namespace tray {

struct HeapCounters {
  // Blocks this heap's slots handed out, counted a slot's list at a time (slot_count_load).
  uint64_t allocations[kSizeClassCount] = {};
  // Frees: of blocks of other heaps' pages, counted by the freeing thread when it frees them;
  // of this heap's own blocks by its own thread, counted when a slow path looks at their page.
  uint64_t frees[kSizeClassCount] = {};
  // The bytes asked for, estimated: the request that made a slot take in a list stands for
  // every block of the list (exact where every request of a class has one size).
  uint64_t requested_bytes[kSizeClassCount] = {};
  uint64_t remote_frees = 0;             // frees of blocks that live in another heap
  // Blocks of other heaps' pages that this heap's thread freed and then allocated itself
  // (heap/remote.cpp, reuse runs): counted when its slot takes them in.
  uint64_t reused_blocks = 0;
};

// A heap's own counter. Other threads read these while it runs (dumps, peak sampling), which
// is harmless on every machine we run on; ThreadSanitizer cannot know that, so its builds use
// relaxed atomic loads and stores (still no read-modify-write).
TRAY_INLINE void counter_add(uint64_t& counter, uint64_t n) {
#if defined(TRAY_TSAN)
  __atomic_store_n(&counter, __atomic_load_n(&counter, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
#else
  counter += n;
#endif
}
TRAY_INLINE uint64_t counter_read(const uint64_t& counter) {
  return __atomic_load_n(&counter, __ATOMIC_RELAXED);
}

struct ClassTotals {
  std::atomic<uint64_t> pages{0};
  std::atomic<uint64_t> peak_pages{0};
  std::atomic<uint64_t> peak_live_blocks{0};
  // The most each dump has reported: a dump from a thread sees its own heaps' uncounted
  // allocations and frees, one from another thread does not, and reported counts never fall.
  std::atomic<uint64_t> reported_allocations{0};
  std::atomic<uint64_t> reported_frees{0};
  std::atomic<uint64_t> reported_requested_bytes{0};
  std::atomic<uint64_t> unowned_frees{0};  // frees by threads that never had a heap
};

struct Totals {
  std::atomic<size_t> bytes_mapped{0};         // segments and large mappings
  std::atomic<size_t> bytes_decommitted{0};    // of the segments: free units not resident
  std::atomic<size_t> bytes_large_committed{0};  // of the large mappings: touched, not purged
  std::atomic<size_t> bytes_metadata{0};       // mapped for heaps and debug tables
  std::atomic<size_t> bytes_index{0};          // the unit map's leaves (address space, mostly untouched)
  std::atomic<size_t> bytes_large{0};          // usable bytes of live large blocks
  std::atomic<size_t> bytes_large_peak{0};
  std::atomic<size_t> bytes_purged{0};
  std::atomic<size_t> segments_mapped{0};
  std::atomic<size_t> large_allocations{0};
  std::atomic<size_t> large_frees{0};
  std::atomic<size_t> heaps_created{0};
  std::atomic<size_t> heaps_abandoned{0};      // parked, waiting for a thread
  std::atomic<size_t> threads_attached{0};     // threads that own a heap now
  std::atomic<size_t> threads_exited{0};
  std::atomic<size_t> unowned_remote_frees{0};
  std::atomic<size_t> foreign_frees{0};
  std::atomic<size_t> debug_errors{0};
  ClassTotals classes[kSizeClassCount];
};

extern Totals g_totals;

inline void count_add(std::atomic<size_t>& counter, size_t n) {
  counter.fetch_add(n, std::memory_order_relaxed);
}
inline void count_sub(std::atomic<size_t>& counter, size_t n) {
  counter.fetch_sub(n, std::memory_order_relaxed);
}
// Memory for the allocator's own tables (a heap's side tables, debug and profile tables),
// counted in bytes_metadata; zeroed, as a fresh mapping is. nullptr if the OS refuses.
inline void* map_metadata(size_t bytes) {
  void* memory = os::map(bytes);
  if (memory != nullptr) count_add(g_totals.bytes_metadata, bytes);
  return memory;
}
// One such table, a T built in OS pages of its own (a heap's side tables). nullptr as above.
template <class T>
T* new_metadata() {
  void* memory = map_metadata(align_up(sizeof(T), os::page_size()));
  return memory != nullptr ? new (memory) T : nullptr;
}
inline void count_max(std::atomic<size_t>& counter, size_t value) {
  size_t seen = counter.load(std::memory_order_relaxed);
  while (value > seen && !counter.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace tray
