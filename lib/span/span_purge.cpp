// Giving span chunks' free pages back to the OS: claims (a purge's runs, madvised without the
// lock), each arena's dirty limit, trim, what the purger thread finds due, the dirty counts
// that statistics read, and the arenas' locks for fork.
#include <algorithm>
#include <atomic>

#include "core/core.hpp"
#include "events/events.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "span/config.hpp"
#include "span/span.hpp"
#include "span/span_arena.hpp"
#include "span/span_cache.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

using bitmap::count_range;
using bitmap::set_range;

// Claims the chunk's free runs that hold resident pages, each run whole: its clean pages go in
// the same madvise (harmless on free pages), so a run freed a block at a time, with clean
// gaps, is one call, not one per dirty stretch. False if the claims filled up first.
bool claim_chunk(SpanChunk* chunk, SpanClaims* claims) {
  const SpanRecount recount(chunk);
  for (size_t s = span_next_with(chunk->free_bits, 1, true); s < kSpanChunkOsPages;) {
    const size_t e = span_next_with(chunk->free_bits, s, false);
    const size_t dirty = count_range(chunk->dirty_bits, s, e - s);
    if (dirty != 0) {
      if (claims->full()) return false;
      claims->runs[claims->count++] = {chunk, uint16_t(s), uint16_t(e - s), uint16_t(dirty), false};
      span_mark_used(chunk, s, e - s);
      set_range(chunk->dirty_bits, s, e - s, false);
      set_range(chunk->started_bits, s, e - s, false);
      chunk->free_pages -= uint32_t(e - s);
      chunk->claimed_pages += uint32_t(e - s);
      chunk->dirty_pages -= uint32_t(dirty);
      span_arena_of(chunk).dirty_bytes -= dirty * kOsPageBytes;
    }
    s = span_next_with(chunk->free_bits, e, true);
  }
  return true;
}

// Without the lock.
void purge_claims(SpanClaims* claims) {
  for (size_t i = 0; i < claims->count; ++i) {
    SpanClaim& run = claims->runs[i];
    run.purged = os::purge(span_bytes(run.chunk) + run.first * kOsPageBytes, run.count * kOsPageBytes);
  }
}

// Puts the claimed runs back as free. Runs the kernel refused stay counted as resident, every
// page of them: a later calloc must not take one for zero.
void finish_claims(const SpanClaims& claims) {
  for (size_t i = 0; i < claims.count; ++i) {
    const SpanClaim& run = claims.runs[i];
    SpanChunk* chunk = run.chunk;
    const SpanRecount recount(chunk);
    span_mark_free(chunk, run.first, run.count);
    chunk->free_pages += run.count;
    chunk->claimed_pages -= run.count;
    if (run.purged) {
      count_sub(g_totals.bytes_large_committed, run.dirty * kOsPageBytes);
      count_add(g_totals.bytes_purged, run.dirty * kOsPageBytes);
    } else {
      set_range(chunk->dirty_bits, run.first, run.count, true);
      chunk->dirty_pages += run.count;
      span_arena_of(chunk).dirty_bytes += run.count * kOsPageBytes;
      count_add(g_totals.bytes_large_committed, (run.count - run.dirty) * kOsPageBytes);
    }
  }
}

// The floor and the live share keep freed runs warm for a program that still asks for spans.
// One that has stopped (its big blocks went out of use with a phase of its work, and die one
// by one while it allocates small ones) would keep every run freed in the last delay for
// nobody: up to the floor, 16 MiB, through the soak's small phases.
// Beyond both, what was live at the recent peak and has been freed since: a program that frees
// its spans together, at the end of a round, finds them warm in the next one, and keeping them
// makes nothing resident that was not a moment before. (large_realloc frees all its spans at
// the end of each round: past the floor they were purged and faulted in again.) A
// program that replaces spans one by one keeps its live bytes near the peak: nothing more.
// The live share is of that peak too: of the live bytes of the moment, it shrank as they were
// freed, and what the peak's share had let stay went, a chunk at a time (bench's `swing`,
// its part of blocks of hundreds of KiB: a fifth more page faults).
// The floor is shared by the arenas in use: a program of one thread keeps all of it.
size_t dirty_limit_bytes(const SpanArena& a, uint64_t now_ms) {
  if (now_ms >= a.last_alloc_ms + kSpanIdleMs) return 0;
  const size_t peak = std::max(a.peak_live_bytes.recent(now_ms), a.live_bytes);
  return std::max(kSpanDirtyFloorBytes / span_arenas_in_use(), peak / 100 * kSpanDirtyLivePercent) + (peak - a.live_bytes);
}

}  // namespace

void span_claim_over_limit(SpanArena& a, SpanClaims* claims, uint64_t now_ms) {
  const size_t limit = dirty_limit_bytes(a, now_ms);
  while (a.dirty_bytes > limit && !claims->full()) {
    SpanChunk* oldest = nullptr;
    for (SpanChunk* c = a.chunks; c != nullptr; c = c->next)
      if (c->dirty_pages != 0 && (oldest == nullptr || c->freed_ms < oldest->freed_ms)) oldest = c;
    if (oldest == nullptr) return;
    claim_chunk(oldest, claims);
  }
}

void span_purge_and_finish(SpanArena& a, SpanClaims* claims) {
  if (claims->count == 0) return;
  purge_claims(claims);
  os::LockGuard guard(a.lock);
  finish_claims(*claims);
  span_publish(a);
}

namespace {

// Purges the free runs of every chunk that `due` picks, a round of claims at a time, until a
// round is not full or the kernel refused all of it (those runs would be claimed again); true
// if any went back.
template <typename Due>
bool purge_chunks(SpanArena& a, Due due) {
  bool any = false;
  for (bool more = true; more;) {
    SpanClaims claims;
    {
      os::LockGuard guard(a.lock);
      for (SpanChunk* c = a.chunks; c != nullptr && !claims.full(); c = c->next)
        if (c->dirty_pages != 0 && due(c)) claim_chunk(c, &claims);
      more = claims.full();
    }
    span_purge_and_finish(a, &claims);
    bool round_purged = false;
    for (size_t i = 0; i < claims.count; ++i) round_purged |= claims.runs[i].purged;
    any |= round_purged;
    more = more && round_purged;
  }
  return any;
}

void unmap_chunk(SpanChunk* chunk) {
  span_count_chunk(chunk, false);
  SpanArena& a = span_arena_of(chunk);
  span_index_remove(a.index, chunk);
  // Its header page is all that is counted resident once the free pages are gone.
  count_sub(g_totals.bytes_large_committed, kOsPageBytes + chunk->dirty_pages * kOsPageBytes);
  a.dirty_bytes -= chunk->dirty_pages * kOsPageBytes;
  count_add(g_totals.bytes_purged, kOsPageBytes + chunk->dirty_pages * kOsPageBytes);
  count_sub(g_totals.bytes_mapped, kSegmentBytes);
  chunk_map_clear(chunk, kSegmentBytes);
  os::unmap(chunk, kSegmentBytes);
}

// Unlinks and unmaps the empty chunks that `expired` says may go.
template <typename Expired>
bool unmap_empty_chunks(SpanArena& a, Expired expired) {
  bool any = false;
  for (SpanChunk** link = &a.chunks; *link != nullptr;) {
    SpanChunk* c = *link;
    if (span_chunk_empty(c) && expired(c)) {
      *link = c->next;
      unmap_chunk(c);
      any = true;
    } else {
      link = &c->next;
    }
  }
  return any;
}

}  // namespace

void span_stash_flush_all() {
  const uint64_t now = os::now_ms();
  for (SpanArena& a : g_span_arenas) {
    os::LockGuard guard(a.lock);
    span_stash_flush(a, now);
    span_publish(a);
  }
}

bool span_trim() {
  span_cache_flush_all();
  span_stash_flush_all();
  bool any = false;
  for (SpanArena& a : g_span_arenas) {
    any |= purge_chunks(a, [](const SpanChunk*) { return true; });
    os::LockGuard guard(a.lock);
    any |= unmap_empty_chunks(a, [](const SpanChunk*) { return true; });
    span_publish(a);
  }
  return any;
}

uint64_t span_purge_expired(uint64_t now_ms) {
  // A free may come after now_ms was read: it is not due.
  const auto expired = [now_ms](const SpanChunk* c) { return now_ms >= c->freed_ms + kSpanPurgeDelayMs; };
  // Threads' blocks first: what goes back joins the arenas' dirty pages, purged below.
  uint64_t due = span_cache_expire(now_ms);
  for (SpanArena& a : g_span_arenas) {
    // Blocks kept whole for requests that have stopped go back to their chunks, and with the
    // limit at zero their pages go to the OS below.
    {
      os::LockGuard guard(a.lock);
      if (a.stash_count != 0 && now_ms >= a.last_alloc_ms + kSpanIdleMs) span_stash_flush(a, now_ms);
    }
    // Runs kept warm for requests that have stopped go too: the limit is zero then.
    purge_chunks(a, [&](const SpanChunk* c) { return expired(c) || dirty_limit_bytes(a, now_ms) == 0; });
    os::LockGuard guard(a.lock);
    unmap_empty_chunks(a, expired);
    for (SpanChunk* c = a.chunks; c != nullptr; c = c->next)
      if (c->dirty_pages != 0 || span_chunk_empty(c)) due = std::min(due, c->freed_ms + kSpanPurgeDelayMs);
    // Left dirty, or kept whole, while requests came: due when they stop.
    if ((a.dirty_bytes != 0 || a.stash_count != 0) && a.last_alloc_ms + kSpanIdleMs > now_ms)
      due = std::min(due, a.last_alloc_ms + kSpanIdleMs);
    span_publish(a);
  }
  return due;
}

void span_dirty_usage(size_t* chunks, size_t* bytes) {
  *chunks = 0;
  *bytes = 0;
  for (const SpanArena& a : g_span_arenas) {
    *chunks += a.dirty_chunks_seen.load(std::memory_order_relaxed);
    *bytes += a.dirty_seen.load(std::memory_order_relaxed);
  }
}

// fork() (api/process.cpp): every arena's lock, in index order.
void span_lock_for_fork() {
  for (SpanArena& a : g_span_arenas) a.lock.lock();
}

void span_unlock_after_fork() {
  for (SpanArena& a : g_span_arenas) a.lock.unlock();
}

}  // namespace tray
