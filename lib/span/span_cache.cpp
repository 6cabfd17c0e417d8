#include "span/span_cache.hpp"

#include <algorithm>
#include <atomic>

#include "events/events.hpp"
#include "platform/platform.hpp"
#include "span/config.hpp"
#include "span/span.hpp"
#include "span/span_arena.hpp"

namespace tray {

__thread SpanCache* tls_span_cache = nullptr;

namespace {

// Every heap's cache, newest first: pushed under the heaps lock, never unlinked (heaps live on).
std::atomic<SpanCache*> g_span_caches{nullptr};
// The cache of the thread that asked for a span last, and when a thread asked after another
// had: a thread alone in asking keeps blocks without contention. Written only when the asker
// changes, so a thread alone writes neither.
std::atomic<SpanCache*> g_last_asker{nullptr};
std::atomic<uint64_t> g_askers_mixed_ms{0};

// A slot's word: the header's address, the run's pages below it, the touched pages above it.
constexpr uint64_t kRunPagesMask = (uint64_t{1} << kOsPageShift) - 1;
constexpr unsigned kTouchedShift = 48;
constexpr uint64_t kAddressMask = ((uint64_t{1} << kTouchedShift) - 1) & ~kRunPagesMask;
static_assert(kSpanChunkOsPages <= kRunPagesMask, "a run's pages fit below the header's address");

LargeHeader* header_of(uint64_t word) { return reinterpret_cast<LargeHeader*>(word & kAddressMask); }
size_t run_pages_of(uint64_t word) { return size_t(word & kRunPagesMask); }
size_t touched_bytes_of(uint64_t word) { return size_t(word >> kTouchedShift) << kOsPageShift; }

// The block's word, or 0 if it is not one to keep.
uint64_t word_of(const LargeHeader* header) {
  const auto address = reinterpret_cast<uintptr_t>(header);
  if (header->reserve_bytes > kSpanCacheMaxRunBytes || header->dirty_bytes > kSpanCacheDirtyBytes ||
      (address & ~kAddressMask) != 0)
    return 0;
  const uint64_t touched_pages = align_up(header->dirty_bytes, kOsPageBytes) >> kOsPageShift;
  return address | (header->reserve_bytes >> kOsPageShift) | touched_pages << kTouchedShift;
}

// Whether slot i was filled after slot j (put serials wrap).
bool newer(const SpanCache& cache, size_t i, size_t j) {
  return int32_t(cache.put_serial[i] - cache.put_serial[j]) > 0;
}

// Takes the block in a slot out, if it still holds one, and gives it back to its arena.
void give_back(std::atomic<uint64_t>& slot, uint64_t now_ms) {
  if (const uint64_t word = slot.exchange(0, std::memory_order_acquire); word != 0)
    span_arena_free(header_of(word), now_ms);
}

void flush(SpanCache& cache, uint64_t now_ms) {
  for (std::atomic<uint64_t>& slot : cache.slots) give_back(slot, now_ms);
}

bool holds_any(const SpanCache& cache) {
  for (const std::atomic<uint64_t>& slot : cache.slots)
    if (slot.load(std::memory_order_relaxed) != 0) return true;
  return false;
}

}  // namespace

void span_cache_register(SpanCache* cache) {
  cache->next_registered = g_span_caches.load(std::memory_order_relaxed);
  g_span_caches.store(cache, std::memory_order_release);
}

void span_cache_attach(SpanCache* cache) {
  if (SpanCache* old = tls_span_cache; old != nullptr && old != cache) flush(*old, os::now_ms());
  tls_span_cache = cache;
}

LargeHeader* span_cache_take(size_t run_pages, uint64_t now_ms) {
  SpanCache* cache = tls_span_cache;
  if (cache == nullptr) return nullptr;
  cache->last_request_ms.store(now_ms, std::memory_order_relaxed);
  if (SpanCache* last = g_last_asker.load(std::memory_order_relaxed); last != cache) {
    if (last != nullptr) g_askers_mixed_ms.store(now_ms, std::memory_order_relaxed);
    g_last_asker.store(cache, std::memory_order_relaxed);
  }
  size_t best = kSpanCacheBlocks;
  uint64_t best_word = 0;
  for (size_t i = 0; i < kSpanCacheBlocks; ++i) {
    const uint64_t word = cache->slots[i].load(std::memory_order_relaxed);
    if (word != 0 && span_run_fits(run_pages_of(word), run_pages) &&
        (best == kSpanCacheBlocks || newer(*cache, i, best))) {
      best = i;
      best_word = word;
    }
  }
  // The purger or a trim may have taken it since: then the slot reads 0.
  if (best == kSpanCacheBlocks ||
      !cache->slots[best].compare_exchange_strong(best_word, 0, std::memory_order_acquire,
                                                  std::memory_order_relaxed))
    return nullptr;
  LargeHeader* header = header_of(best_word);
  TRAY_ASSERT(header->magic == kSpanBlockMagic && header->user == nullptr);
  return header;
}

void span_cache_contended(uint64_t now_ms) {
  SpanCache* cache = tls_span_cache;
  if (cache == nullptr) return;
  if (now_ms >= cache->contention_since_ms + kSpanCacheContendedMs) {
    cache->contention_since_ms = now_ms;
    cache->contentions = 0;
  }
  if (++cache->contentions >= kSpanCacheContentions) cache->contended_ms = now_ms;
}

bool span_cache_put(LargeHeader* header, uint64_t now_ms) {
  SpanCache* cache = tls_span_cache;
  if (cache == nullptr) return false;
  const uint64_t word = word_of(header);
  if (word == 0) return false;
  // Requests stopped, or the arenas serve them without a wait while other threads ask too:
  // nothing is kept for them, and what was kept goes back.
  const bool contended = cache->contended_ms != 0 && now_ms < cache->contended_ms + kSpanCacheContendedMs;
  const bool alone = g_last_asker.load(std::memory_order_relaxed) == cache &&
                     now_ms >= g_askers_mixed_ms.load(std::memory_order_relaxed) + kSpanIdleMs;
  if (now_ms >= cache->last_request_ms.load(std::memory_order_relaxed) + kSpanIdleMs ||
      (!contended && !alone)) {
    flush(*cache, now_ms);
    return false;
  }
  // Each round finds room, or empties the oldest slot (or finds it emptied by the purger).
  for (;;) {
    size_t touched = touched_bytes_of(word);
    size_t empty = kSpanCacheBlocks;
    size_t oldest = kSpanCacheBlocks;
    for (size_t i = 0; i < kSpanCacheBlocks; ++i) {
      const uint64_t held = cache->slots[i].load(std::memory_order_relaxed);
      if (held == 0) {
        empty = i;
        continue;
      }
      touched += touched_bytes_of(held);
      if (oldest == kSpanCacheBlocks || newer(*cache, oldest, i)) oldest = i;
    }
    if (empty != kSpanCacheBlocks && touched <= kSpanCacheDirtyBytes) {
      cache->put_serial[empty] = ++cache->puts;
      // The header's writes (large_free's) before the word: whoever takes it reads them.
      cache->slots[empty].store(word, std::memory_order_release);
      return true;
    }
    TRAY_ASSERT(oldest != kSpanCacheBlocks);
    give_back(cache->slots[oldest], now_ms);
  }
}

void span_cache_flush_all() {
  const uint64_t now = os::now_ms();
  for (SpanCache* c = g_span_caches.load(std::memory_order_acquire); c != nullptr; c = c->next_registered)
    flush(*c, now);
}

uint64_t span_cache_expire(uint64_t now_ms) {
  uint64_t due = kNeverMs;
  for (SpanCache* c = g_span_caches.load(std::memory_order_acquire); c != nullptr; c = c->next_registered) {
    if (!holds_any(*c)) continue;
    const uint64_t idle_at = c->last_request_ms.load(std::memory_order_relaxed) + kSpanIdleMs;
    if (now_ms >= idle_at) flush(*c, now_ms);
    else due = std::min(due, idle_at);
  }
  return due;
}

void span_cache_usage(size_t* blocks, size_t* touched_bytes) {
  *blocks = 0;
  *touched_bytes = 0;
  for (SpanCache* c = g_span_caches.load(std::memory_order_acquire); c != nullptr; c = c->next_registered) {
    for (const std::atomic<uint64_t>& slot : c->slots) {
      const uint64_t word = slot.load(std::memory_order_relaxed);
      if (word == 0) continue;
      ++*blocks;
      *touched_bytes += touched_bytes_of(word);
    }
  }
}

}  // namespace tray
