#include "segment/segment.hpp"

#include <algorithm>
#include <bit>
#include <new>

#include "core/core.hpp"
#include "events/events.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "segment/address_maps.hpp"
#include "segment/runs.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

os::Mutex g_pool_lock;
Segment* g_all_segments = nullptr;  // from joining the pool to leaving it, full ones included
Segment* g_partial = nullptr;       // segments with at least one free unit
Segment* g_cache = nullptr;         // empty, purged segments kept mapped
size_t g_cache_count = 0;
size_t g_dirty_bytes = 0;
size_t g_page_bytes = 0;            // units that belong to pages
uint64_t g_last_purge_ms = 0;
constinit RecentPeak<kPoolHoldWindowMs> g_peak_demand;  // of demand_bytes(), lately
uint64_t g_last_pool_call_ms = 0;   // the last page taken or returned
// Whether the last look at the dirty units found some held (held_dirty_bytes): a large block
// that grows what the program holds may end that, and only then looks again. Written under
// the lock, read without it.
std::atomic<bool> g_pool_holding{false};

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

void all_segments_add(Segment* s) {
  s->all_prev = nullptr;
  s->all_next = g_all_segments;
  if (g_all_segments != nullptr) g_all_segments->all_prev = s;
  g_all_segments = s;
}

void all_segments_remove(Segment* s) {
  if (s->all_prev != nullptr) s->all_prev->all_next = s->all_next;
  else g_all_segments = s->all_next;
  if (s->all_next != nullptr) s->all_next->all_prev = s->all_prev;
  s->all_next = s->all_prev = nullptr;
}

std::atomic<EmptyChunkSource> g_empty_chunk_source{nullptr};
// As the source last said: how many chunks it may give for a new segment, and how many
// before units that would fault in.
std::atomic<size_t> g_source_empty_chunks{0};
std::atomic<size_t> g_source_spare_chunks{0};

// A segment over `memory` (4 MiB, aligned), every unit free; those of `resident_units` still
// hold memory (dirty, counted into g_dirty_bytes when it joins the pool, under the lock), the
// others read zero. nullptr if the unit map cannot take it.
Segment* segment_start(void* memory, uint64_t resident_units) {
  auto* s = static_cast<Segment*>(memory);
  if (!unit_map_prepare(s)) return nullptr;
  s->magic = kSegmentMagic;
  s->free_units = kUsableUnits;
  s->dirty_units = resident_units & kUsableUnits;
  s->untouched_units.store(0, std::memory_order_relaxed);
  s->dirty_since_ms = os::now_ms();
  s->next = s->prev = nullptr;
  s->all_next = s->all_prev = nullptr;
  for (auto& page : s->pages) new (&page) Page();
  for (auto& states : s->debug_states) states = nullptr;
  for (auto& bits : s->sparse_purged) bits = 0;
  unit_map_set(s, 0, kUnitsPerSegment, &s->pages[0]);
  chunk_map_set(s, kSegmentBytes, false);
  count_add(g_totals.segments_mapped, 1);
  count_add(g_totals.bytes_decommitted, kSegmentBytes - kUnitBytes - size_t(popcount64(s->dirty_units)) * kUnitBytes);
  return s;
}

// An empty chunk that still holds resident memory, from the source; nullptr if it has none.
Segment* segment_from_source() {
  EmptyChunkSource source = g_empty_chunk_source.load(std::memory_order_acquire);
  if (source == nullptr || g_source_empty_chunks.load(std::memory_order_relaxed) == 0) return nullptr;
  uint64_t resident_units = 0;
  void* memory = source(&resident_units);
  if (memory == nullptr) return nullptr;
  track_unmapped(memory, kSegmentBytes);
  if (Segment* s = segment_start(memory, resident_units); s != nullptr) return s;
  // The source's mapping, still counted and marked as its own.
  chunk_map_clear(memory, kSegmentBytes);
  os::unmap(memory, kSegmentBytes);
  count_sub(g_totals.bytes_mapped, kSegmentBytes);
  return nullptr;
}

Segment* segment_map_new() {
  void* memory = segment_map_region();
  if (memory == nullptr) return nullptr;
  Segment* s = segment_start(memory, 0);
  if (s == nullptr) {
    os::unmap(memory, kSegmentBytes);
    return nullptr;
  }
  count_add(g_totals.bytes_mapped, kSegmentBytes);
  // Pages freed later will need the purger, and frees may not start it: the allocation that
  // mapped this will. Not for the first segment, which the loader's first allocation may map
  // before the C library could start a thread.
  if (g_totals.segments_mapped.load(std::memory_order_relaxed) > 1) purger_expect();
  return s;
}

}  // namespace

void* segment_map_region() {
  void* memory = os::map_aligned(kSegmentBytes, kSegmentBytes);
  const int64_t thp = option(Option::kThp);
  if (memory != nullptr && thp != kThpSystem)
    os::advise_huge_pages(memory, kSegmentBytes, thp == kThpMadvise);
  return memory;
}

void thp_advise_large(void* p, size_t bytes) {
  if (option(Option::kThp) == kThpNever) os::advise_huge_pages(p, bytes, false);
}

namespace {

// A segment from segment_map_new joins the pool.
void pool_add_new(Segment* s) {
  all_segments_add(s);
  list_push(g_partial, s);
  g_dirty_bytes += size_t(popcount64(s->dirty_units)) * kUnitBytes;
}

void segment_unmap(Segment* s) {
  chunk_map_clear(s, kSegmentBytes);
  unit_map_set(s, 0, kUnitsPerSegment, nullptr);
  track_unmapped(s, kSegmentBytes);
  os::unmap(s, kSegmentBytes);
  count_sub(g_totals.segments_mapped, 1);
  count_sub(g_totals.bytes_mapped, kSegmentBytes);
  // Only empty, purged segments are unmapped: of their memory, only the header was resident.
  count_add(g_totals.bytes_purged, kUnitBytes);
  count_sub(g_totals.bytes_decommitted, kSegmentBytes - kUnitBytes);
}

// Units a purge took out of the pool: off both the free and the dirty masks while madvise
// runs outside the lock, so that no thread hands them out and no other purge picks them.
struct PurgeClaim {
  Segment* segment;
  uint64_t units;
};

// What a lock holder set aside for the system calls that follow once it lets go: the pool
// lock guards a few list and mask updates, never madvise, mmap or munmap, so threads that take
// or return pages do not wait behind another thread's call into the kernel.
struct PoolWork {
  PurgeClaim claims[kPoolPurgeClaimsPerRound];
  unsigned count = 0;
  bool more = false;          // dirty units were left for the next round
  bool trim = false;          // empty segments are unmapped, not cached
  Segment* unmap = nullptr;   // retired beyond the cache, linked through `next`
};

// The dirty units of s in huge pages whose usable units are all free: under thp=madvise, what
// a purge that is only due to the delay takes (huge_pages_only). A purge of part of a huge page
// makes the kernel split it (the rest stays resident as 4 KiB pages, and khugepaged may fill
// the hole again to rebuild it), so the units of a huge page that still holds a page wait
// until the rest of it is free too, or until the dirty limit, trim or memory_limit purge them.
uint64_t purgeable_units(const Segment* s, bool huge_pages_only) {
  if (!huge_pages_only) return s->dirty_units;
  uint64_t units = 0;
  for (unsigned first = 0; first < kUnitsPerSegment; first += kUnitsPerHugePage) {
    const uint64_t huge_page = run_mask(first, kUnitsPerHugePage) & kUsableUnits;
    if ((s->free_units & huge_page) == huge_page) units |= s->dirty_units & huge_page;
  }
  return units;
}

bool huge_pages_whole() { return option(Option::kThp) == kThpMadvise; }

void claim_dirty(Segment* s, uint64_t units, PoolWork& work) {
  TRAY_ASSERT(units != 0 && (units & ~s->dirty_units) == 0);
  TRAY_ASSERT((units & ~s->free_units) == 0);
  s->free_units &= ~units;
  s->dirty_units &= ~units;
  if (s->free_units == 0) list_remove(g_partial, s);
  g_dirty_bytes -= size_t(popcount64(units)) * kUnitBytes;
  work.claims[work.count++] = {s, units};
}

// Outside the lock. The runs the kernel would not purge, which stay dirty for a later try.
uint64_t purge_claim(const PurgeClaim& claim) {
  uint64_t failed = 0;
  for (uint64_t left = claim.units; left != 0;) {
    const unsigned first = unsigned(std::countr_zero(left));
    const unsigned count = unsigned(std::countr_one(left >> first));
    const uint64_t run = run_mask(first, count);
    left &= ~run;
    if (!os::purge(reinterpret_cast<char*>(claim.segment) + first * kUnitBytes, count * kUnitBytes)) {
      failed |= run;
      continue;
    }
    count_add(g_totals.bytes_purged, count * kUnitBytes);
    count_add(g_totals.bytes_decommitted, count * kUnitBytes);
  }
  return failed;
}

// An empty segment whose memory is already back with the OS is cached or set aside to unmap.
void retire_if_empty(Segment* s, PoolWork& work) {
  if (s->free_units != kUsableUnits || s->dirty_units != 0) return;
  list_remove(g_partial, s);
  if (!work.trim && g_cache_count < kSegmentCacheCount) {
    s->next = g_cache;
    g_cache = s;
    ++g_cache_count;
  } else {
    all_segments_remove(s);
    s->next = work.unmap;
    work.unmap = s;
  }
}

// The claimed units come back to the pool, purged (or dirty again where the kernel refused).
void settle_claim(const PurgeClaim& claim, uint64_t failed, uint64_t now, PoolWork& work) {
  Segment* s = claim.segment;
  if (s->free_units == 0) list_push(g_partial, s);
  s->free_units |= claim.units;
  if (failed != 0) {
    if (s->dirty_units == 0) s->dirty_since_ms = now;
    s->dirty_units |= failed;
    g_dirty_bytes += size_t(popcount64(failed)) * kUnitBytes;
  }
  retire_if_empty(s, work);
}

// Dirty units go back to the OS once they have been free for kPurgeDelayMs. When more than
// dirty_limit_bytes() pile up sooner, segments are purged until half the limit is left: enough
// to bound the resident size, while the most recently freed units stay for quick reuse (a
// program whose working set swings by more than the limit would otherwise fault in every
// page it frees). force (trim) purges everything. `again`: the next round of a purge whose
// claims did not fit one round, which the delay must not stop halfway.
size_t dirty_limit_bytes() {
  return std::max(kDirtyFloorBytes, g_page_bytes / 100 * kDirtyPercentOfInUse);
}

// What the program's memory holds outside the pool's dirty units: the bytes in pages, and
// the resident bytes of large blocks, live or kept for reuse (span chunks' free pages, cached
// mappings). Counting the large blocks' live bytes instead, a block cut from pages that were
// already resident counted as new memory, and the pool purged as much as it took: in `swing`
// and in programs like it, units the next phase of small blocks faulted in again.
size_t demand_bytes() {
  return g_page_bytes + g_totals.bytes_large_committed.load(std::memory_order_relaxed);
}

// Dirty units that neither the delay nor the limit purge: while the program keeps taking and
// returning pages, those that would bring its memory (demand_bytes) back to its most of the
// last kPoolHoldWindowMs. It held that much a moment ago, so keeping them adds nothing to its
// peak, and a program whose pages swing (a phase of big blocks after one of small ones, a
// burst of requests) takes them back without a page fault each. Large blocks count too: pages
// held for a phase of small blocks while a phase of large ones grows would add to the peak.
// Once the program goes quiet, or stays smaller for a window, they go as before.
size_t held_dirty_bytes(uint64_t now) {
  if (now - g_last_pool_call_ms >= kPoolQuietMs) return 0;
  const size_t peak = g_peak_demand.recent(now);
  const size_t demand = demand_bytes();
  return peak > demand ? peak - demand : 0;
}

void select_purges(uint64_t now, bool force, bool again, PoolWork& work) {
  // Near the memory limit, freed units go back at once.
  force |= limit_pressed();
  const size_t held = held_dirty_bytes(now);
  g_pool_holding.store(held != 0, std::memory_order_relaxed);
  const size_t limit = std::max(dirty_limit_bytes(), held);
  const bool over_limit = g_dirty_bytes > limit;
  if (!force && !again && !over_limit && now - g_last_purge_ms < kPurgeDelayMs) return;
  g_last_purge_ms = now;
  const size_t keep_when_over = std::max(limit / 2, held);
  const bool whole = huge_pages_whole();
  for (Segment* s = g_partial; s != nullptr;) {
    Segment* next = s->next;
    const bool expired = now - s->dirty_since_ms >= kPurgeDelayMs && g_dirty_bytes > held;
    const bool still_over = g_dirty_bytes > keep_when_over;
    const bool pressed = force || (over_limit && still_over);
    const uint64_t units = purgeable_units(s, whole && !pressed);
    if (units != 0 && (pressed || expired)) {
      if (work.count == kPoolPurgeClaimsPerRound) {
        work.more = true;
        return;
      }
      claim_dirty(s, units, work);
    } else {
      retire_if_empty(s, work);
    }
    s = next;
  }
}

// After the lock is let go: the system calls, then the claims settled under the lock again,
// round after round while a purge had more to claim than one round holds (not after a refusal
// by the kernel, which the next round would only meet again).
void finish_pool_work(PoolWork& work, uint64_t now, bool force) {
  for (;;) {
    uint64_t failed[kPoolPurgeClaimsPerRound];
    bool any_failed = false;
    for (unsigned i = 0; i < work.count; ++i) {
      failed[i] = purge_claim(work.claims[i]);
      any_failed |= failed[i] != 0;
    }
    while (work.unmap != nullptr) {
      Segment* s = work.unmap;
      work.unmap = s->next;
      segment_unmap(s);
    }
    if (work.count == 0) return;
    PoolWork next;
    next.trim = work.trim;
    {
      os::LockGuard guard(g_pool_lock);
      for (unsigned i = 0; i < work.count; ++i) settle_claim(work.claims[i], failed[i], now, next);
      if (work.more && !any_failed) select_purges(now, force, true, next);
    }
    work = next;
  }
}

// `committed` of the page's units are committed now; its clean ones past them stay untouched
// (not counted as held) until the page touches them (segment_page_touch). *resident_bytes:
// from the page's start to the end of its last unit that holds memory already.
Page* carve_page(Segment* s, int first, unsigned units, unsigned committed, size_t* resident_bytes) {
  const uint64_t mask = run_mask(unsigned(first), units);
  const uint64_t clean = ~s->dirty_units & mask;
  const uint64_t untouched = clean & ~run_mask(unsigned(first), committed);
  g_dirty_bytes -= size_t(popcount64(s->dirty_units & mask)) * kUnitBytes;
  count_sub(g_totals.bytes_decommitted, size_t(popcount64(clean & ~untouched)) * kUnitBytes);
  s->untouched_units.fetch_or(untouched, std::memory_order_relaxed);
  const uint64_t resident = s->dirty_units & mask;
  *resident_bytes = resident == 0 ? 0 : size_t(64 - std::countl_zero(resident) - unsigned(first)) * kUnitBytes;
  s->dirty_units &= ~mask;
  s->free_units &= ~mask;
  g_page_bytes += size_t(units) * kUnitBytes;
  if (s->free_units == 0) list_remove(g_partial, s);
  Page* page = &s->pages[first];
  unit_map_set(s, unsigned(first), units, page);
  page->unit_count = uint8_t(units);
  page->blocks = reinterpret_cast<uint8_t*>(s) + size_t(first) * kUnitBytes;
  return page;
}

}  // namespace

// Where a page's units come from, cheapest first: the pool's free dirty units; an empty chunk
// of the source's that still holds resident memory (before units that would fault in); free
// clean units; a cached segment; a new mapping. The source is asked and the mapping made
// outside the lock; if another thread made room meanwhile, what they brought joins the pool
// like any empty segment.
Page* segment_take_page(unsigned units, size_t commit_bytes, size_t* resident_bytes) {
  TRAY_ASSERT(units > 0 && units < kUnitsPerSegment);
  const auto committed = unsigned(std::min<size_t>(units, div_ceil(commit_bytes, kUnitBytes)));
  // As if every unit were new: near the limit, giving back purges the dirty ones anyway.
  if (!limit_admit(size_t(committed) * kUnitBytes)) return nullptr;
  const uint64_t now = os::now_ms();
  PoolWork work;
  Page* page = nullptr;
  Segment* fresh = nullptr;  // from the source or a new mapping, not in the pool yet
  bool asked_source = false;
  for (;;) {
    bool clean = false;
    {
      os::LockGuard guard(g_pool_lock);
      Segment* s = nullptr;
      int first = -1;
      const bool found = find_units(g_partial, units, &s, &first, &clean);
      const bool source_first = found && clean && fresh == nullptr && !asked_source &&
                                g_source_spare_chunks.load(std::memory_order_relaxed) != 0;
      if (!source_first) {
        if (fresh != nullptr && (!found || (clean && fresh->dirty_units != 0))) {
          s = fresh;
          fresh = nullptr;
          pool_add_new(s);
          first = first_fit(s, units);
        } else if (!found && g_cache != nullptr) {
          s = g_cache;
          g_cache = s->next;
          --g_cache_count;
          list_push(g_partial, s);
          first = first_fit(s, units);
        }
      }
      if (s != nullptr && !source_first) {
        page = carve_page(s, first, units, committed, resident_bytes);
        g_peak_demand.note(demand_bytes(), now);
        g_last_pool_call_ms = now;
        if (fresh != nullptr) {
          pool_add_new(fresh);
          retire_if_empty(fresh, work);
        }
        select_purges(now, false, false, work);
        break;
      }
    }
    if (!asked_source) {
      asked_source = true;
      fresh = segment_from_source();
      if (fresh != nullptr || clean) continue;
    }
    fresh = segment_map_new();
    if (fresh == nullptr) return nullptr;
  }
  finish_pool_work(work, now, false);
  return page;
}

bool segment_page_touch(Page* page, size_t touched_bytes) {
  Segment* s = segment_of(page);
  const auto first = unsigned(page - s->pages);
  const auto touched = unsigned(std::min<size_t>(page->unit_count, div_ceil(touched_bytes, kUnitBytes)));
  const uint64_t wanted = s->untouched_units.load(std::memory_order_relaxed) & run_mask(first, touched);
  if (wanted == 0) return true;
  if (!limit_admit(size_t(popcount64(wanted)) * kUnitBytes)) return false;
  const uint64_t taken = s->untouched_units.fetch_and(~wanted, std::memory_order_relaxed) & wanted;
  count_sub(g_totals.bytes_decommitted, size_t(popcount64(taken)) * kUnitBytes);
  return true;
}

void segment_return_page(Page* page) {
  Segment* s = segment_of(page);
  const unsigned first = unsigned(page - s->pages);
  const unsigned units = page->unit_count;
  const uint64_t mask = run_mask(first, units);
  const uint64_t now = os::now_ms();
  PoolWork work;
  {
    os::LockGuard guard(g_pool_lock);
    TRAY_CHECK(s->magic == kSegmentMagic);    // a page descriptor that is not in a segment
    TRAY_CHECK((s->free_units & mask) == 0);  // a page returned twice would corrupt the pool
    unit_map_set(s, first, units, &s->pages[0]);
    page->unit_count = 0;
    // Units the page never touched are clean still (and were never counted as held).
    const uint64_t clean = s->untouched_units.fetch_and(~mask, std::memory_order_relaxed) & mask;
    if (s->free_units == 0) list_push(g_partial, s);
    if (s->dirty_units == 0) s->dirty_since_ms = now;
    s->free_units |= mask;
    s->dirty_units |= mask & ~clean;
    g_dirty_bytes += size_t(popcount64(mask & ~clean)) * kUnitBytes;
    g_page_bytes -= size_t(units) * kUnitBytes;
    // The purger giving back a parked heap's pages is not the program at work.
    if (!tls_in_purger) g_last_pool_call_ms = now;
    select_purges(now, false, false, work);
  }
  finish_pool_work(work, now, false);
  purger_notify();
}

uint64_t segment_purge_expired(uint64_t now_ms) {
  PoolWork work;
  {
    os::LockGuard guard(g_pool_lock);
    select_purges(now_ms, false, false, work);
  }
  finish_pool_work(work, now_ms, false);
  os::LockGuard guard(g_pool_lock);
  uint64_t due = kNeverMs;
  // Units that wait for the rest of their huge page (purgeable_units) are due with it.
  const bool whole = huge_pages_whole();
  for (Segment* s = g_partial; s != nullptr; s = s->next)
    if (purgeable_units(s, whole) != 0) due = std::min(due, s->dirty_since_ms + kPurgeDelayMs);
  if (due == kNeverMs) return due;
  due = std::max(due, g_last_purge_ms + kPurgeDelayMs);
  // What is held waits for the program to go quiet or for its peak to age out.
  if (g_dirty_bytes <= held_dirty_bytes(now_ms)) {
    const uint64_t hold_ends =
        std::min(g_last_pool_call_ms + kPoolQuietMs, g_peak_demand.until_ms());
    due = std::max(due, hold_ends);
  }
  return due;
}

void segment_large_grew() {
  if (!g_pool_holding.load(std::memory_order_relaxed)) return;
  const uint64_t now = os::now_ms();
  PoolWork work;
  {
    os::LockGuard guard(g_pool_lock);
    select_purges(now, false, false, work);
  }
  finish_pool_work(work, now, false);
}

bool segment_trim() {
  const size_t before = g_totals.bytes_purged.load(std::memory_order_relaxed);
  const uint64_t now = os::now_ms();
  PoolWork work;
  work.trim = true;
  {
    os::LockGuard guard(g_pool_lock);
    select_purges(now, true, false, work);
    while (g_cache != nullptr) {
      Segment* s = g_cache;
      g_cache = s->next;
      all_segments_remove(s);
      s->next = work.unmap;
      work.unmap = s;
    }
    g_cache_count = 0;
  }
  finish_pool_work(work, now, true);
  return g_totals.bytes_purged.load(std::memory_order_relaxed) != before;
}

void* segment_give_empty(uint64_t* resident_units) {
  Segment* s = nullptr;
  {
    os::LockGuard guard(g_pool_lock);
    for (Segment* c = g_partial; c != nullptr; c = c->next)
      if (c->free_units == kUsableUnits && (s == nullptr || popcount64(c->dirty_units) > popcount64(s->dirty_units)))
        s = c;
    if (s == nullptr || s->dirty_units == 0) return nullptr;
    list_remove(g_partial, s);
    all_segments_remove(s);
    const size_t dirty = size_t(popcount64(s->dirty_units));
    g_dirty_bytes -= dirty * kUnitBytes;
    *resident_units = s->dirty_units | 1;
    // Its free units become the caller's: neither resident nor purged segment memory any more.
    count_sub(g_totals.bytes_decommitted, (kUnitsPerSegment - 1 - dirty) * kUnitBytes);
    count_sub(g_totals.segments_mapped, 1);
    unit_map_set(s, 0, kUnitsPerSegment, nullptr);
  }
  track_unmapped(s, kSegmentBytes);
  return s;
}

void segment_offer_empty_chunks(EmptyChunkSource source, size_t empty, size_t spare) {
  if (g_empty_chunk_source.load(std::memory_order_relaxed) != source)
    g_empty_chunk_source.store(source, std::memory_order_release);
  if (g_source_empty_chunks.load(std::memory_order_relaxed) != empty)
    g_source_empty_chunks.store(empty, std::memory_order_relaxed);
  if (g_source_spare_chunks.load(std::memory_order_relaxed) != spare)
    g_source_spare_chunks.store(spare, std::memory_order_relaxed);
}

void segment_forget_owner_threads(uintptr_t keep) {
  for (Segment* s = g_all_segments; s != nullptr; s = s->all_next)
    for (Page& page : s->pages)
      if (page.owner_thread != keep && page.owner_thread != 0)
        __atomic_store_n(&page.owner_thread, uintptr_t{0}, __ATOMIC_RELAXED);
}

void segment_lock_for_fork() { g_pool_lock.lock(); }

void segment_unlock_after_fork() { g_pool_lock.unlock(); }

}  // namespace tray
