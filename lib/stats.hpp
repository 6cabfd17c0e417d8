// Process-wide counters, bumped on slow paths only (page and segment turnover, large blocks,
// heap life cycle), so they cost nothing on the fast path and are always on.
#pragma once

#include <atomic>
#include <cstddef>

namespace tray {

struct Totals {
  std::atomic<size_t> bytes_mapped{0};
  std::atomic<size_t> bytes_in_pages{0};
  std::atomic<size_t> bytes_large{0};
  std::atomic<size_t> bytes_purged{0};
  std::atomic<size_t> segments_mapped{0};
  std::atomic<size_t> pages_acquired{0};
  std::atomic<size_t> large_allocations{0};
  std::atomic<size_t> heaps_created{0};
  std::atomic<size_t> heaps_abandoned{0};
  std::atomic<size_t> foreign_frees{0};
};

extern Totals g_totals;

inline void count_add(std::atomic<size_t>& counter, size_t n) {
  counter.fetch_add(n, std::memory_order_relaxed);
}
inline void count_sub(std::atomic<size_t>& counter, size_t n) {
  counter.fetch_sub(n, std::memory_order_relaxed);
}

// One line to stderr: what TRAY_OPTIONS=stats=1 prints at exit.
void stats_print_summary();

}  // namespace tray
