#include "segment.hpp"

#include <algorithm>
#include <new>

#include "core/assert.hpp"
#include "platform/os.hpp"
#include "purger.hpp"
#include "stats.hpp"
#include "track.hpp"

namespace tray {

constinit uint8_t g_chunk_map[kChunkCount];

namespace {

constexpr uint64_t kUsableUnits = ~uint64_t{1};  // unit 0 holds the header

os::Mutex g_pool_lock;
Segment* g_partial = nullptr;       // segments with at least one free unit
Segment* g_cache = nullptr;         // empty, purged segments kept mapped
size_t g_cache_count = 0;
size_t g_dirty_bytes = 0;
size_t g_page_bytes = 0;            // units that belong to pages
uint64_t g_last_purge_ms = 0;

void list_push(Segment*& head, Segment* s) {
  s->prev = nullptr;
  s->next = head;
  if (head != nullptr) head->prev = s;
  head = s;
}

void list_remove(Segment*& head, Segment* s) {
  if (s->prev != nullptr) s->prev->next = s->next;
  else head = s->next;
  if (s->next != nullptr) s->next->prev = s->prev;
  s->next = s->prev = nullptr;
}

uint64_t run_mask(unsigned first, unsigned count) {
  return (count == 64 ? ~uint64_t{0} : ((uint64_t{1} << count) - 1)) << first;
}

// Lowest start of `count` consecutive set bits in `bits`, or -1.
int find_run(uint64_t bits, unsigned count) {
  uint64_t starts = bits;
  for (unsigned i = 1; i < count && starts != 0; ++i) starts &= bits >> i;
  return starts == 0 ? -1 : std::countr_zero(starts);
}

Segment* segment_map_new() {
  void* memory = os::map_aligned(kSegmentBytes, kSegmentBytes);
  if (memory == nullptr) return nullptr;
  auto* s = static_cast<Segment*>(memory);
  s->magic = kSegmentMagic;
  s->free_units = kUsableUnits;
  s->dirty_units = 0;
  s->dirty_since_ms = 0;
  s->next = s->prev = nullptr;
  for (auto& page : s->pages) new (&page) Page();
  for (auto& states : s->debug_states) states = nullptr;
  for (auto& bits : s->sparse_purged) bits = 0;
  for (auto& offset : s->page_offset) offset = page_offset_of(0);
  chunk_map_set(s, kSegmentBytes, false);
  count_add(g_totals.segments_mapped, 1);
  count_add(g_totals.bytes_mapped, kSegmentBytes);
  count_add(g_totals.bytes_decommitted, kSegmentBytes - kUnitBytes);  // untouched so far
  return s;
}

void segment_unmap(Segment* s) {
  chunk_map_clear(s, kSegmentBytes);
  track_unmapped(s, kSegmentBytes);
  os::unmap(s, kSegmentBytes);
  count_sub(g_totals.segments_mapped, 1);
  count_sub(g_totals.bytes_mapped, kSegmentBytes);
  // Only empty, purged segments are unmapped: of their memory, only the header was resident.
  count_add(g_totals.bytes_purged, kUnitBytes);
  count_sub(g_totals.bytes_decommitted, kSegmentBytes - kUnitBytes);
}

// Units the kernel would not purge stay dirty, for a later purge to try again.
void purge_dirty_units(Segment* s) {
  uint64_t dirty = s->dirty_units;
  while (dirty != 0) {
    const unsigned first = unsigned(std::countr_zero(dirty));
    const unsigned count = unsigned(std::countr_one(dirty >> first));
    const uint64_t run = run_mask(first, count);
    dirty &= ~run;
    if (!os::purge(reinterpret_cast<char*>(s) + first * kUnitBytes, count * kUnitBytes)) continue;
    s->dirty_units &= ~run;
    g_dirty_bytes -= count * kUnitBytes;
    count_add(g_totals.bytes_purged, count * kUnitBytes);
    count_add(g_totals.bytes_decommitted, count * kUnitBytes);
  }
}

// An empty segment whose memory is already back with the OS is cached or unmapped.
void retire_if_empty(Segment* s) {
  if (s->free_units != kUsableUnits || s->dirty_units != 0) return;
  list_remove(g_partial, s);
  if (g_cache_count < kSegmentCacheCount) {
    s->next = g_cache;
    g_cache = s;
    ++g_cache_count;
  } else {
    segment_unmap(s);
  }
}

// Dirty units go back to the OS once they have been free for kPurgeDelayMs. When more than
// dirty_limit_bytes() pile up sooner, segments are purged until half the limit is left: enough
// to bound the resident size, while the most recently freed units stay for quick reuse (a
// program whose working set swings by more than the limit would otherwise fault in every
// page it frees). force (trim) purges everything.
size_t dirty_limit_bytes() {
  return std::max(kDirtyFloorBytes, g_page_bytes / 100 * kDirtyPercentOfInUse);
}

void purge_locked(uint64_t now, bool force) {
  const size_t limit = dirty_limit_bytes();
  const bool over_limit = g_dirty_bytes > limit;
  if (!force && !over_limit && now - g_last_purge_ms < kPurgeDelayMs) return;
  g_last_purge_ms = now;
  for (Segment* s = g_partial; s != nullptr;) {
    Segment* next = s->next;
    const bool expired = now - s->dirty_since_ms >= kPurgeDelayMs;
    const bool still_over = g_dirty_bytes > limit / 2;
    if (s->dirty_units != 0 && (force || expired || (over_limit && still_over)))
      purge_dirty_units(s);
    retire_if_empty(s);
    s = next;
  }
}

// Dirty units first: reusing them costs no page faults.
bool find_units(unsigned units, Segment** found, int* first) {
  for (int pass = 0; pass < 2; ++pass) {
    for (Segment* s = g_partial; s != nullptr; s = s->next) {
      const uint64_t candidates = pass == 0 ? (s->free_units & s->dirty_units) : s->free_units;
      const int start = find_run(candidates, units);
      if (start >= 0) {
        *found = s;
        *first = start;
        return true;
      }
    }
  }
  return false;
}

}  // namespace

void chunk_map_set(const void* base, size_t bytes, bool large) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(base) >> kSegmentShift;
  const size_t count = div_ceil(bytes, kSegmentBytes);
  for (size_t k = 0; k < count; ++k) {
    uint8_t value = kChunkSegment;
    if (large) value = k < size_t(kChunkGuard - kChunkLarge) ? uint8_t(kChunkLarge + k) : kChunkLargeFar;
    __atomic_store_n(&g_chunk_map[first + k], value, __ATOMIC_RELAXED);
  }
}

void chunk_map_set_guard(const void* base, size_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(base) >> kSegmentShift;
  for (size_t k = 0; k < div_ceil(bytes, kSegmentBytes); ++k)
    __atomic_store_n(&g_chunk_map[first + k], kChunkGuard, __ATOMIC_RELAXED);
}

void chunk_map_clear(const void* base, size_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(base) >> kSegmentShift;
  const size_t count = div_ceil(bytes, kSegmentBytes);
  for (size_t k = 0; k < count; ++k)
    __atomic_store_n(&g_chunk_map[first + k], kChunkForeign, __ATOMIC_RELAXED);
}

Page* segment_take_page(unsigned units) {
  TRAY_ASSERT(units > 0 && units < kUnitsPerSegment);
  os::LockGuard guard(g_pool_lock);
  Segment* s = nullptr;
  int first = -1;
  if (!find_units(units, &s, &first)) {
    if (g_cache != nullptr) {
      s = g_cache;
      g_cache = s->next;
      --g_cache_count;
    } else {
      s = segment_map_new();
      if (s == nullptr) return nullptr;
    }
    list_push(g_partial, s);
    first = find_run(s->free_units, units);
    TRAY_CHECK(first >= 1);
  }
  const uint64_t mask = run_mask(unsigned(first), units);
  g_dirty_bytes -= size_t(popcount64(s->dirty_units & mask)) * kUnitBytes;
  count_sub(g_totals.bytes_decommitted, size_t(popcount64(~s->dirty_units & mask)) * kUnitBytes);
  s->dirty_units &= ~mask;
  s->free_units &= ~mask;
  g_page_bytes += size_t(units) * kUnitBytes;
  if (s->free_units == 0) list_remove(g_partial, s);
  for (unsigned u = 0; u < units; ++u) s->page_offset[first + int(u)] = page_offset_of(unsigned(first));
  Page* page = &s->pages[first];
  page->unit_count = uint8_t(units);
  page->blocks = reinterpret_cast<uint8_t*>(s) + size_t(first) * kUnitBytes;
  purge_locked(os::now_ms(), false);
  return page;
}

void segment_return_page(Page* page) {
  Segment* s = segment_of(page);
  const unsigned first = unsigned(page - s->pages);
  const unsigned units = page->unit_count;
  const uint64_t mask = run_mask(first, units);
  const uint64_t now = os::now_ms();
  {
    os::LockGuard guard(g_pool_lock);
    TRAY_CHECK(s->magic == kSegmentMagic);    // a page descriptor that is not in a segment
    TRAY_CHECK((s->free_units & mask) == 0);  // a page returned twice would corrupt the pool
    for (unsigned u = 0; u < units; ++u) s->page_offset[first + u] = page_offset_of(0);
    page->unit_count = 0;
    if (s->free_units == 0) list_push(g_partial, s);
    if (s->dirty_units == 0) s->dirty_since_ms = now;
    s->free_units |= mask;
    s->dirty_units |= mask;
    g_dirty_bytes += size_t(units) * kUnitBytes;
    g_page_bytes -= size_t(units) * kUnitBytes;
    purge_locked(now, false);
  }
  purger_notify();
}

uint64_t segment_purge_expired(uint64_t now_ms) {
  os::LockGuard guard(g_pool_lock);
  purge_locked(now_ms, false);
  uint64_t due = kNeverMs;
  for (Segment* s = g_partial; s != nullptr; s = s->next)
    if (s->dirty_units != 0) due = std::min(due, s->dirty_since_ms + kPurgeDelayMs);
  return due == kNeverMs ? due : std::max(due, g_last_purge_ms + kPurgeDelayMs);
}

bool segment_trim() {
  os::LockGuard guard(g_pool_lock);
  const size_t before = g_totals.bytes_purged.load(std::memory_order_relaxed);
  purge_locked(os::now_ms(), true);
  while (g_cache != nullptr) {
    Segment* s = g_cache;
    g_cache = s->next;
    segment_unmap(s);
  }
  g_cache_count = 0;
  return g_totals.bytes_purged.load(std::memory_order_relaxed) != before;
}

void segment_lock_for_fork() { g_pool_lock.lock(); }

void segment_unlock_after_fork() { g_pool_lock.unlock(); }

}  // namespace tray
