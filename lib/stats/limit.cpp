#include "stats/limit.hpp"

#include "core/core.hpp"
#include "events/events.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "stats/stats.hpp"

namespace tray {

constinit std::atomic<int64_t> g_limit_bytes{kLimitUndecided};
constinit std::atomic<bool> g_limit_pressed{false};

namespace {

// A cgroup's limit covers the whole process: its stacks, code, the C library's own memory,
// the page cache of the files it writes. malloc takes all but this share of it.
constexpr size_t kCgroupMarginShare = 8;
// Soft: a program whose live blocks stay above the limit would otherwise give back all it
// can on every page it takes; once per this interval is enough to keep to the limit.
constexpr uint64_t kSoftReclaimIntervalMs = 10;
constexpr size_t kSourceBytes = 512;
// Room for /proc/self/mountinfo: static, since the first admission may run on a small stack.
constexpr size_t kScratchBytes = 64 << 10;

os::Mutex g_decide_lock;
bool g_cgroup_read = false;  // under g_decide_lock
size_t g_cgroup_bytes = 0;
char g_cgroup_source[kSourceBytes];
char g_scratch[kScratchBytes];
std::atomic<bool> g_from_cgroup{false};
std::atomic<uint64_t> g_reached{0};
std::atomic<uint64_t> g_failures{0};
std::atomic<uint64_t> g_released{0};
std::atomic<uint64_t> g_last_soft_reclaim_ms{0};
// Giving back runs no admission of its own, but a thread that reached the limit from inside
// it (a page the purge of another layer takes) must not start a second round.
__thread bool tls_reclaiming = false;

int64_t decide() {
  os::LockGuard guard(g_decide_lock);
  int64_t bytes = option(Option::kMemoryLimit);
  const bool from_cgroup = bytes == kMemoryLimitAuto;
  if (from_cgroup) {
    if (!g_cgroup_read) {
      // Tests point this at a directory of files of their own (tests/stats/limit_test.cpp).
      const char* root = os::env("TRAY_CGROUP_ROOT");
      g_cgroup_bytes = os::cgroup_memory_limit(root != nullptr ? root : "", g_scratch, sizeof g_scratch,
                                               g_cgroup_source, sizeof g_cgroup_source);
      g_cgroup_read = true;
    }
    bytes = int64_t(g_cgroup_bytes - g_cgroup_bytes / kCgroupMarginShare);
  }
  g_from_cgroup.store(from_cgroup && bytes != 0, std::memory_order_relaxed);
  g_limit_bytes.store(bytes, std::memory_order_relaxed);
  return bytes;
}

// Gives back all that can go, counting what went.
void reclaim() {
  if (tls_reclaiming) return;
  tls_reclaiming = true;
  const size_t before = g_totals.bytes_purged.load(std::memory_order_relaxed);
  g_events.reclaim_memory();
  g_released.fetch_add(g_totals.bytes_purged.load(std::memory_order_relaxed) - before,
                       std::memory_order_relaxed);
  tls_reclaiming = false;
}

}  // namespace

size_t held_bytes() {
  const size_t segments = g_totals.segments_mapped.load(std::memory_order_relaxed) * kSegmentBytes;
  const size_t decommitted = g_totals.bytes_decommitted.load(std::memory_order_relaxed);
  return (segments > decommitted ? segments - decommitted : 0) +
         g_totals.bytes_large_committed.load(std::memory_order_relaxed) +
         g_totals.bytes_metadata.load(std::memory_order_relaxed);
}

bool limit_admit_slow(size_t bytes) {
  int64_t limit = g_limit_bytes.load(std::memory_order_relaxed);
  if (limit == kLimitUndecided) limit = decide();
  if (limit == 0) return true;
  const size_t cap = size_t(limit);
  size_t held = held_bytes();
  g_limit_pressed.store(held + bytes > cap - cap / kLimitPressureShare, std::memory_order_relaxed);
  if (held + bytes <= cap) return true;
  g_reached.fetch_add(1, std::memory_order_relaxed);
  const bool fail = option(Option::kMemoryLimitAction) == kLimitFail;
  if (!fail) {
    const uint64_t now = os::now_ms();
    uint64_t last = g_last_soft_reclaim_ms.load(std::memory_order_relaxed);
    if (now - last >= kSoftReclaimIntervalMs &&
        g_last_soft_reclaim_ms.compare_exchange_strong(last, now, std::memory_order_relaxed))
      reclaim();
    return true;
  }
  reclaim();
  held = held_bytes();
  if (held + bytes <= cap) return true;
  g_failures.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void limit_options_changed() {
  g_limit_bytes.store(kLimitUndecided, std::memory_order_relaxed);
  g_limit_pressed.store(false, std::memory_order_relaxed);
}

void limit_report(LimitReport* out) {
  // Not decided here: a dump may run in a signal handler that interrupted decide().
  const int64_t limit = g_limit_bytes.load(std::memory_order_relaxed);
  out->bytes = limit == kLimitUndecided ? 0 : size_t(limit);
  out->from_cgroup = g_from_cgroup.load(std::memory_order_relaxed);
  out->fail = option(Option::kMemoryLimitAction) == kLimitFail;
  out->source = out->from_cgroup ? g_cgroup_source : "memory_limit";
  out->cgroup_bytes = out->from_cgroup ? g_cgroup_bytes : 0;
  out->reached = g_reached.load(std::memory_order_relaxed);
  out->failures = g_failures.load(std::memory_order_relaxed);
  out->released_bytes = g_released.load(std::memory_order_relaxed);
}

}  // namespace tray
