#include "large/large_cache.hpp"

#include <algorithm>
#include <atomic>

#include "core/core.hpp"
#include "events/events.hpp"
#include "large/config.hpp"
#include "large/large.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "span/span.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

os::Mutex g_cache_lock;
LargeHeader* g_cache[kLargeCacheCount];
size_t g_cache_used = 0;
size_t g_cache_bytes = 0;  // bytes the cached mappings may hold resident (their dirty_bytes)
// Copies of the two for the statistics, which read them without the lock.
std::atomic<size_t> g_cache_used_seen{0};
std::atomic<size_t> g_cache_bytes_seen{0};
uint64_t g_last_request_ms = 0;  // the last large request that could take from the cache
// Mappings evicted from the cache for the purger thread to unmap (kLargeUnmapDeferBytes says
// why), under g_cache_lock: a fork's child finds them consistent, and whoever unmaps them
// first takes them out.
LargeHeader* g_doomed[kLargeCacheCount];
size_t g_doomed_used = 0;
size_t g_doomed_bytes = 0;
// Held by whoever takes the doomed mappings, from before it takes them until they are unmapped,
// so that large_trim waits for a purger that is unmapping some: a program that trims and then
// reads its resident size must find them gone. Taken before g_cache_lock.
os::Mutex g_doomed_unmap_lock;

// Mappings waiting for the purger are not the cache's: they count as committed until unmapped.
void publish_cache_usage() {
  g_cache_used_seen.store(g_cache_used, std::memory_order_relaxed);
  g_cache_bytes_seen.store(g_cache_bytes, std::memory_order_relaxed);
}

char* base_of(const LargeHeader* header) {
  return reinterpret_cast<char*>(const_cast<LargeHeader*>(header));
}

void cache_remove_at(size_t i) {
  g_cache_bytes -= g_cache[i]->dirty_bytes;
  g_cache[i] = g_cache[--g_cache_used];
}

constinit RecentPeak<kLargeCacheDelayMs> g_peak_live;  // bytes of live large blocks; lock held

// What the cache may hold: the most of a floor, a share of the live large bytes and a share of
// the most live large bytes of the last cache delay (kLargeCache* in large/config.hpp say why each).
// The last is no more than the live blocks held a moment before, so keeping it does not grow
// resident memory, and a program that frees its large blocks together, at the end of a round
// or of its run, leaves them to the idle purger instead of unmapping them in its own time.
// `freeing` is the block on its way into the cache, live until now.
size_t cache_limit_bytes(uint64_t now, size_t freeing) {
  const size_t live = g_totals.bytes_large.load(std::memory_order_relaxed) + freeing;
  g_peak_live.note(live, now);
  return std::max({kLargeCacheFloorBytes, (live - freeing) / 100 * kLargeCacheLivePercent,
                   g_peak_live.bytes() / 100 * kLargeCachePeakPercent});
}

// Index of the cached mapping that sat longest.
size_t cache_oldest() {
  size_t oldest = 0;
  for (size_t i = 1; i < g_cache_used; ++i)
    if (g_cache[i]->cached_ms < g_cache[oldest]->cached_ms) oldest = i;
  return oldest;
}

// When a cached mapping goes: kLargeCacheDelayMs after it came in, or kLargeCacheIdleMs after
// that or after the last large request, whichever is later, if that is sooner. Lock held.
uint64_t cache_expiry_ms(const LargeHeader* header) {
  const uint64_t idle_from = std::max(header->cached_ms, g_last_request_ms);
  return std::min(header->cached_ms + kLargeCacheDelayMs, idle_from + kLargeCacheIdleMs);
}

// Where an evicted mapping goes: to the purger thread while it runs and has room for it,
// else into `out`, for the caller to unmap after unlocking. Lock held.
void evict(LargeHeader* header, LargeHeader** out, size_t* count) {
  if (g_purger_state.load(std::memory_order_relaxed) == PurgerState::kRunning &&
      g_doomed_used < kLargeCacheCount && g_doomed_bytes + header->dirty_bytes <= kLargeUnmapDeferBytes) {
    g_doomed[g_doomed_used++] = header;
    g_doomed_bytes += header->dirty_bytes;
  } else {
    out[(*count)++] = header;
  }
}

// Empties a list of mappings (the cache or the doomed ones) under the cache lock and unmaps
// what it held once the lock is let go; how many.
size_t unmap_all(LargeHeader* const* list, size_t* used, size_t* bytes) {
  LargeHeader* taken[kLargeCacheCount];
  size_t count;
  {
    os::LockGuard guard(g_cache_lock);
    count = *used;
    std::copy_n(list, count, taken);
    *used = 0;
    *bytes = 0;
    publish_cache_usage();
  }
  for (size_t i = 0; i < count; ++i) large_unmap_mapping(taken[i]);
  return count;
}

// Unmaps every mapping waiting for the purger, after any that another thread is unmapping;
// how many this call unmapped. No lock held.
size_t unmap_doomed() {
  os::LockGuard unmapping(g_doomed_unmap_lock);
  return unmap_all(g_doomed, &g_doomed_used, &g_doomed_bytes);
}

// Unmaps what eviction left to the caller, and wakes the purger for what it left to it.
// Lock not held.
void finish_evictions(LargeHeader** evicted, size_t count, bool doomed) {
  for (size_t i = 0; i < count; ++i) large_unmap_mapping(evicted[i]);
  if (doomed) purger_wake();
}

// Moves mappings out of the cache (see evict): the expired ones, then the oldest until
// `incoming` more bytes and one more mapping fit. The count put in `out`. Lock held.
size_t cache_evict(uint64_t now, size_t incoming, size_t limit, LargeHeader** out) {
  size_t count = 0;
  for (size_t i = 0; i < g_cache_used;) {
    if (now >= cache_expiry_ms(g_cache[i])) {
      evict(g_cache[i], out, &count);
      cache_remove_at(i);
    } else {
      ++i;
    }
  }
  while (g_cache_used > 0 &&
         (g_cache_used == kLargeCacheCount || g_cache_bytes + incoming > limit)) {
    const size_t oldest = cache_oldest();
    evict(g_cache[oldest], out, &count);
    cache_remove_at(oldest);
  }
  return count;
}

void cache_insert(LargeHeader* header) {
  g_cache[g_cache_used++] = header;
  g_cache_bytes += header->dirty_bytes;
}

// Cuts the reservation of `header` after `keep_bytes` (whole chunks) and caches the rest as a
// mapping of its own, with whatever it had touched: a big freed mapping serves a small
// request without its other pages being given back and faulted in again. Lock held.
void cache_split(LargeHeader* header, size_t keep_bytes) {
  if (g_cache_used == kLargeCacheCount || header->reserve_bytes - keep_bytes < kSegmentBytes) return;
  auto* tail = reinterpret_cast<LargeHeader*>(base_of(header) + keep_bytes);
  tail->magic = kLargeMagic;
  tail->user = nullptr;
  tail->reserve_bytes = header->reserve_bytes - keep_bytes;
  tail->cached_ms = header->cached_ms;
  // The tail's header page is touched now, whatever the head had touched.
  const size_t dirty = header->dirty_bytes;
  tail->dirty_bytes = 0;
  large_set_dirty_bytes(tail, std::max(dirty > keep_bytes ? dirty - keep_bytes : 0, os::page_size()));
  large_set_dirty_bytes(header, std::min(dirty, keep_bytes));
  header->reserve_bytes = keep_bytes;
  chunk_map_set(tail, tail->reserve_bytes, true);
  cache_insert(tail);
}

// Joins `header` with cached mappings right before or after it, so the address space that
// blocks of any size give back can serve a block of any other size. The dirty count of the
// joined mapping is an upper bound: the lower part's untouched tail is counted as touched.
// Lock held; the mappings are not yet (header) or no longer (the rest) in the cache's totals.
LargeHeader* cache_coalesce(LargeHeader* header) {
  for (size_t i = 0; i < g_cache_used;) {
    LargeHeader* other = g_cache[i];
    LargeHeader* lower;
    LargeHeader* upper;
    if (base_of(other) + other->reserve_bytes == base_of(header)) {
      lower = other, upper = header;
    } else if (base_of(header) + header->reserve_bytes == base_of(other)) {
      lower = header, upper = other;
    } else {
      ++i;
      continue;
    }
    cache_remove_at(i);
    // Every mapping has touched at least its header page, so the joined one counts as touched
    // up to the end of the upper part's touched prefix (the stale header included).
    const size_t joined_dirty = lower->reserve_bytes + upper->dirty_bytes;
    lower->dirty_bytes += upper->dirty_bytes;  // moved, not new: the totals stay
    upper->dirty_bytes = 0;
    large_set_dirty_bytes(lower, joined_dirty);
    lower->reserve_bytes += upper->reserve_bytes;
    lower->cached_ms = std::max(lower->cached_ms, upper->cached_ms);
    chunk_map_set(lower, lower->reserve_bytes, true);
    header = lower;
    i = 0;  // the joined mapping may now touch another one
  }
  return header;
}

size_t distance(size_t a, size_t b) { return a > b ? a - b : b - a; }

}  // namespace

// dirty_bytes is what the statistics call committed: keep the total in step with it.
void large_set_dirty_bytes(LargeHeader* header, size_t bytes) {
  if (bytes > header->dirty_bytes) count_add(g_totals.bytes_large_committed, bytes - header->dirty_bytes);
  else if (bytes < header->dirty_bytes) count_sub(g_totals.bytes_large_committed, header->dirty_bytes - bytes);
  header->dirty_bytes = bytes;
}

void large_unmap_mapping(LargeHeader* header) {
  const size_t bytes = header->reserve_bytes;
  const size_t resident = header->dirty_bytes;
  large_set_dirty_bytes(header, 0);
  chunk_map_clear(header, bytes);
  os::unmap(header, bytes);
  count_sub(g_totals.bytes_mapped, bytes);
  count_add(g_totals.bytes_purged, resident);
}

// The cached mapping to serve `used_bytes`: the smallest reservation that holds it, cut down to
// what the block needs; else the one with the most touched pages, for the caller to grow
// (moving pages costs less than faulting in fresh ones). nullptr if the cache is empty.
LargeHeader* large_cache_take(size_t used_bytes) {
  LargeHeader* evicted[kLargeCacheCount];
  size_t evicted_count;
  bool doomed;
  bool orphaned;
  LargeHeader* best = nullptr;
  {
    os::LockGuard guard(g_cache_lock);
    const uint64_t now = os::now_ms();
    g_last_request_ms = now;
    const size_t doomed_before = g_doomed_used;
    evicted_count = cache_evict(now, 0, cache_limit_bytes(now, 0), evicted);
    doomed = g_doomed_used > doomed_before;
    // No purger to unmap what waits for it (a fork's child, before its purger starts again):
    // the program's next large request does.
    orphaned = g_doomed_used != 0 &&
               g_purger_state.load(std::memory_order_relaxed) != PurgerState::kRunning;
    size_t best_index = 0;
    for (size_t i = 0; i < g_cache_used; ++i) {
      LargeHeader* h = g_cache[i];
      if (h->reserve_bytes < used_bytes) continue;
      // Among equal reservations (every block under a chunk has one chunk), the touched size
      // nearest the request: fewest pages to fault in or to give back.
      if (best == nullptr || h->reserve_bytes < best->reserve_bytes ||
          (h->reserve_bytes == best->reserve_bytes &&
           distance(h->dirty_bytes, used_bytes) < distance(best->dirty_bytes, used_bytes))) {
        best = h;
        best_index = i;
      }
    }
    if (best != nullptr) {
      cache_remove_at(best_index);
      cache_split(best, align_up(used_bytes, kSegmentBytes));
    } else if (g_cache_used != 0) {
      for (size_t i = 1; i < g_cache_used; ++i)
        if (g_cache[i]->dirty_bytes > g_cache[best_index]->dirty_bytes) best_index = i;
      best = g_cache[best_index];
      cache_remove_at(best_index);
    }
    publish_cache_usage();
  }
  finish_evictions(evicted, evicted_count, doomed);
  if (orphaned) unmap_doomed();
  return best;
}

// Caches a freed mapping, or evicts it (see evict) if it is more than the cache may hold.
void large_cache_put(LargeHeader* header, size_t usable) {
  LargeHeader* evicted[kLargeCacheCount];
  size_t evicted_count = 0;
  bool doomed;
  bool cached = false;
  header->cached_ms = os::now_ms();
  {
    os::LockGuard guard(g_cache_lock);
    const size_t doomed_before = g_doomed_used;
    const size_t limit = cache_limit_bytes(header->cached_ms, usable);
    // Keeping it would evict the oldest mapping: not if that one holds more touched pages. At
    // the end of a round of large_realloc, at the floor, a freed 16 MiB block pushed out a
    // 36 MiB mapping (joined), which the next round faulted in again.
    const bool displaces_more = g_cache_used != 0 && g_cache_bytes + header->dirty_bytes > limit &&
                                g_cache[cache_oldest()]->dirty_bytes > header->dirty_bytes;
    if (header->dirty_bytes <= limit && !displaces_more) {
      header = cache_coalesce(header);
      evicted_count = cache_evict(header->cached_ms, header->dirty_bytes, limit, evicted);
      cache_insert(header);
      cached = true;
    } else {
      evict(header, evicted, &evicted_count);  // too big to keep, or displacing more
    }
    doomed = g_doomed_used > doomed_before;
    publish_cache_usage();
  }
  finish_evictions(evicted, evicted_count, doomed);
  if (cached) purger_notify();
}

// Takes out of the cache the mapping that starts at `address` if it holds at least `bytes`,
// cut down to them; nullptr if there is none.
LargeHeader* large_cache_take_at(const char* address, size_t bytes) {
  os::LockGuard guard(g_cache_lock);
  for (size_t i = 0; i < g_cache_used; ++i) {
    LargeHeader* h = g_cache[i];
    if (base_of(h) != address) continue;
    if (h->reserve_bytes < bytes) return nullptr;
    cache_remove_at(i);
    cache_split(h, bytes);
    publish_cache_usage();
    return h;
  }
  return nullptr;
}

bool large_trim() {
  const size_t doomed = unmap_doomed();
  const size_t count = unmap_all(g_cache, &g_cache_used, &g_cache_bytes);
  const bool spans = span_trim();
  return doomed + count != 0 || spans;
}

uint64_t large_purge_expired(uint64_t now_ms) {
  LargeHeader* evicted[kLargeCacheCount];
  size_t count;
  uint64_t due = kNeverMs;
  bool doomed;
  {
    os::LockGuard guard(g_cache_lock);
    count = cache_evict(now_ms, 0, cache_limit_bytes(now_ms, 0), evicted);
    for (size_t i = 0; i < g_cache_used; ++i)
      due = std::min(due, cache_expiry_ms(g_cache[i]));
    doomed = g_doomed_used != 0;
    publish_cache_usage();
  }
  for (size_t i = 0; i < count; ++i) large_unmap_mapping(evicted[i]);
  // With what the eviction handed to the purger: it is this thread's to unmap now.
  if (doomed) unmap_doomed();
  return std::min(due, span_purge_expired(now_ms));
}

void large_cache_usage(size_t* blocks, size_t* bytes) {
  size_t span_chunks;
  size_t span_bytes;
  span_dirty_usage(&span_chunks, &span_bytes);
  size_t kept_blocks;
  size_t kept_bytes;
  span_cache_usage(&kept_blocks, &kept_bytes);
  *blocks = g_cache_used_seen.load(std::memory_order_relaxed) + span_chunks + kept_blocks;
  *bytes = g_cache_bytes_seen.load(std::memory_order_relaxed) + span_bytes + kept_bytes;
}

void large_lock_for_fork() {
  g_doomed_unmap_lock.lock();
  g_cache_lock.lock();
}

void large_unlock_after_fork() {
  g_cache_lock.unlock();
  g_doomed_unmap_lock.unlock();
}

}  // namespace tray
