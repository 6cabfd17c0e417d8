// The memory limit: what the allocator holds from the OS (held_bytes: the committed bytes of
// the statistics) against memory_limit, or, with that option unset, the process's cgroup's
// limit less a margin for what is not malloc's. The layers that take memory from the OS ask
// limit_admit first (the segment pool before it hands out a page, the large blocks before
// they map or reuse one), never the fast paths, and never under a lock of theirs: reaching
// the limit gives back all that can go (g_events.reclaim_memory), which takes those locks.
// Soft (memory_limit_action=soft, the default) then goes on regardless; fail refuses what
// would still go over, and the allocation returns NULL with ENOMEM. Near the limit
// (limit_pressed), what the program frees goes back to the OS at once instead of after its
// delay.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

// The limit in bytes: 0 for none, kLimitUndecided until the options (and perhaps the cgroup's
// files) are read, at the first limit_admit.
inline constexpr int64_t kLimitUndecided = -1;
extern constinit std::atomic<int64_t> g_limit_bytes;
// What is held is within kLimitPressureShare of the limit (as the last limit_admit saw it).
inline constexpr size_t kLimitPressureShare = 8;
extern constinit std::atomic<bool> g_limit_pressed;

// The bytes the allocator holds from the OS now: segments but their decommitted units, the
// touched pages of large mappings and span chunks, metadata.
size_t held_bytes();

bool limit_admit_slow(size_t bytes);
// Before taking `bytes` more from the OS: false if memory_limit_action=fail and the limit
// would be passed even after giving back all that can go. Without a limit, one load.
TRAY_INLINE bool limit_admit(size_t bytes) {
  if (TRAY_LIKELY(g_limit_bytes.load(std::memory_order_relaxed) == 0)) return true;
  return limit_admit_slow(bytes);
}
TRAY_INLINE bool limit_pressed() { return g_limit_pressed.load(std::memory_order_relaxed); }

// memory_limit or memory_limit_action changed (tray_option_set): decided again at the next
// limit_admit (the cgroup's files are read once per process).
void limit_options_changed();

// For the statistics.
struct LimitReport {
  size_t bytes;            // 0: no limit
  bool from_cgroup;
  bool fail;               // memory_limit_action=fail
  const char* source;      // "memory_limit", or the cgroup file the limit came from
  size_t cgroup_bytes;     // the cgroup's own limit, before the margin (0: none or not read)
  uint64_t reached;        // admissions that found the limit passed
  uint64_t failures;       // of which refused
  uint64_t released_bytes; // what giving back then returned to the OS
};
void limit_report(LimitReport* out);

}  // namespace tray
