#include "span/span.hpp"

#include <algorithm>
#include <atomic>

#include "core/core.hpp"
#include "events/events.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "span/config.hpp"
#include "span/span_arena.hpp"
#include "span/span_cache.hpp"
#include "span/span_chunk.hpp"
#include "span/span_index.hpp"
#include "stats/stats.hpp"

namespace tray {

constinit SpanArena g_span_arenas[kSpanArenaCount];

namespace {

constexpr size_t kPagesPerUnit = kUnitBytes / kOsPageBytes;  // the pool's unit, in pages

// One more than the highest arena a thread moved to.
std::atomic<size_t> g_arenas_in_use{1};
__thread uint32_t tls_arena = 0;  // the arena the thread allocated from last

// The calling thread's arena, locked: the one it allocated from last, unless another thread
// holds its lock, and then the first after it whose lock is free, which it keeps until it
// takes a run from another (place_elsewhere).
// Threads start in arena 0 and spread only as far as they meet: a program whose threads seldom
// allocate spans at once keeps them in one arena, where each free run serves any thread (a
// thread given an arena of its own at its start spread mstress's short-lived threads over four
// arenas: 55 -> 87 MiB peak RSS).
SpanArena& lock_thread_arena(uint64_t now) {
  SpanArena& own = g_span_arenas[tls_arena];
  if (TRAY_LIKELY(own.lock.try_lock())) return own;
  span_cache_contended(now);
  for (uint32_t step = 1; step < kSpanArenaCount; ++step) {
    const uint32_t next = uint32_t((tls_arena + step) % kSpanArenaCount);
    if (g_span_arenas[next].lock.try_lock()) {
      tls_arena = next;
      size_t in_use = g_arenas_in_use.load(std::memory_order_relaxed);
      while (in_use <= next && !g_arenas_in_use.compare_exchange_weak(in_use, next + 1, std::memory_order_relaxed)) {
      }
      return g_span_arenas[next];
    }
  }
  own.lock.lock();
  return own;
}

SpanChunk* chunk_of(const void* p) {
  return reinterpret_cast<SpanChunk*>(align_down(reinterpret_cast<uintptr_t>(p), kSegmentBytes));
}

size_t page_index(const SpanChunk* chunk, const void* p) {
  return size_t(span_bytes(p) - span_bytes(chunk)) >> kOsPageShift;
}

using bitmap::count_range;
using bitmap::end_of_set;
using bitmap::set_range;

void* give_empty_chunk(uint64_t* resident_units);

}  // namespace

size_t span_arenas_in_use() { return g_arenas_in_use.load(std::memory_order_relaxed); }

void span_count_chunk(const SpanChunk* chunk, bool in) {
  if (chunk->dirty_pages == 0) return;
  SpanArena& a = span_arena_of(chunk);
  a.dirty_chunks = in ? a.dirty_chunks + 1 : a.dirty_chunks - 1;
  if (span_chunk_empty(chunk)) a.empty_dirty_chunks = in ? a.empty_dirty_chunks + 1 : a.empty_dirty_chunks - 1;
}

void span_mark_used(SpanChunk* chunk, size_t first, size_t count) {
  const size_t start = bitmap::run_start(chunk->free_bits, first);
  const size_t end = span_next_with(chunk->free_bits, first, false);
  TRAY_ASSERT(end >= first + count);
  SpanIndex& index = span_arena_of(chunk).index;
  span_index_run_removed(index, chunk, end - start);
  if (first > start) span_index_run_added(index, chunk, first - start);
  if (end > first + count) span_index_run_added(index, chunk, end - first - count);
  set_range(chunk->free_bits, first, count, false);
}

void span_mark_free(SpanChunk* chunk, size_t first, size_t count) {
  const size_t start = bitmap::run_start(chunk->free_bits, first);
  const size_t end = span_next_with(chunk->free_bits, first + count, false);
  SpanIndex& index = span_arena_of(chunk).index;
  if (start < first) span_index_run_removed(index, chunk, first - start);
  if (end > first + count) span_index_run_removed(index, chunk, end - first - count);
  span_index_run_added(index, chunk, end - start);
  set_range(chunk->free_bits, first, count, true);
}

namespace {

// The touched bytes of the blocks the arena keeps whole.
size_t stash_dirty_bytes(const SpanArena& a) {
  size_t bytes = 0;
  for (size_t i = 0; i < a.stash_count; ++i) bytes += a.stash[i]->dirty_bytes;
  return bytes;
}

// The pages of `chunk` in blocks the arena keeps whole.
size_t stashed_pages(const SpanArena& a, const SpanChunk* chunk) {
  size_t pages = 0;
  for (size_t i = 0; i < a.stash_count; ++i)
    if (chunk_of(a.stash[i]) == chunk) pages += a.stash[i]->reserve_bytes >> kOsPageShift;
  return pages;
}

}  // namespace

// What the pool may take (give_empty_chunk):
// the empty chunks that hold resident pages, for a segment it would map; and for units that
// would fault in, the same only from arenas whose live bytes shrank to half their recent high
// or less. Spans that stay busy reuse their empty chunks soon, and a pool that took one for a
// page would leave the spans to map a new one. The pool sees the sums over the arenas: an
// arena whose offer changed stores it, then adds up all (sequentially consistent, so that of
// two arenas publishing at once, the later sum sees both). Only then: reading the other
// arenas' lines on every allocation made them bounce between the threads' cores.
void span_publish(SpanArena& a) {
#ifndef NDEBUG
  size_t dirty = 0;
  size_t empty = 0;
  for (const SpanChunk* c = a.chunks; c != nullptr; c = c->next) {
    dirty += c->dirty_pages != 0;
    empty += c->dirty_pages != 0 && span_chunk_empty(c);
    for (size_t w = 0; w < kSpanBitWords; ++w) {
      // A free page that started a block is resident; no block starts on a free page.
      TRAY_ASSERT((c->started_bits[w] & c->free_bits[w] & ~c->dirty_bits[w]) == 0);
      TRAY_ASSERT((c->block_bits[w] & c->free_bits[w]) == 0);
    }
  }
  TRAY_ASSERT(dirty == a.dirty_chunks && empty == a.empty_dirty_chunks);
  // No chunk is held by kept blocks alone.
  TRAY_ASSERT(a.stash_count <= kSpanStashBlocks);
  for (size_t i = 0; i < a.stash_count; ++i) {
    const SpanChunk* c = chunk_of(a.stash[i]);
    TRAY_ASSERT(c->free_pages + stashed_pages(a, c) + c->claimed_pages < kSpanChunkOsPages - 1);
  }
  span_index_check(a.index, a.chunks);
#endif
  a.dirty_chunks_seen.store(a.dirty_chunks + a.stash_count, std::memory_order_relaxed);
  // Blocks kept whole are freed memory kept resident for reuse, as free runs are.
  a.dirty_seen.store(a.dirty_bytes + stash_dirty_bytes(a), std::memory_order_relaxed);
  const bool shrunk = a.live_bytes <= a.peak_live_bytes.bytes() / 2;
  const size_t spare = shrunk ? a.empty_dirty_chunks : 0;
  if (a.offered_empty.load(std::memory_order_relaxed) == a.empty_dirty_chunks &&
      a.offered_spare.load(std::memory_order_relaxed) == spare)
    return;
  a.offered_empty.store(a.empty_dirty_chunks);
  a.offered_spare.store(spare);
  size_t empty_chunks = 0;
  size_t spare_chunks = 0;
  for (const SpanArena& other : g_span_arenas) {
    empty_chunks += other.offered_empty.load();
    spare_chunks += other.offered_spare.load();
  }
  segment_offer_empty_chunks(&give_empty_chunk, empty_chunks, spare_chunks);
}

namespace {

// Whether a block starts on pages [first, first + count): set for a block's first page when
// it is taken, cleared for every page given back. Under the lock; each word is stored whole
// for the frees that read it without (span_block_of).
void set_block_starts(SpanChunk* chunk, size_t first, size_t count, bool value) {
  bitmap::for_words(first, count, [&](size_t w, uint64_t mask) {
    const uint64_t word = chunk->block_bits[w];
    __atomic_store_n(&chunk->block_bits[w], value ? word | mask : word & ~mask, __ATOMIC_RELAXED);
  });
}

// The resident large bytes change by `added` less `removed`, in one update of the shared
// counter (threads that allocate spans at once bounce its line between their cores).
void count_committed(size_t added, size_t removed) {
  if (added > removed) count_add(g_totals.bytes_large_committed, added - removed);
  else if (removed > added) count_sub(g_totals.bytes_large_committed, removed - added);
}

// Takes pages [first, first + count) of `chunk` for a block: how many bytes from `first` up
// to the end of the last resident one (0 if none was). The resident ones, *dirty_bytes, leave
// the chunk's count for the block's, which the caller counts.
size_t take_pages(SpanChunk* chunk, size_t first, size_t count, size_t* dirty_bytes) {
  const SpanRecount recount(chunk);
  const size_t dirty = count_range(chunk->dirty_bits, first, count);
  const size_t touched_end = end_of_set(chunk->dirty_bits, first, count);
  span_mark_used(chunk, first, count);
  set_range(chunk->dirty_bits, first, count, false);
  chunk->free_pages -= uint32_t(count);
  chunk->dirty_pages -= uint32_t(dirty);
  SpanArena& a = span_arena_of(chunk);
  a.dirty_bytes -= dirty * kOsPageBytes;
  a.live_bytes += count * kOsPageBytes;
  *dirty_bytes = dirty * kOsPageBytes;
  return (touched_end - first) * kOsPageBytes;
}

// Gives pages [first, first + count) back to `chunk`, resident (the caller counts them).
void give_pages(SpanChunk* chunk, size_t first, size_t count, uint64_t now) {
  const SpanRecount recount(chunk);
  set_block_starts(chunk, first, count, false);
  span_mark_free(chunk, first, count);
  set_range(chunk->dirty_bits, first, count, true);
  chunk->free_pages += uint32_t(count);
  chunk->dirty_pages += uint32_t(count);
  chunk->freed_ms = now;
  SpanArena& a = span_arena_of(chunk);
  a.dirty_bytes += count * kOsPageBytes;
  a.live_bytes -= count * kOsPageBytes;
}

// Pages a block no longer holds go back to their chunk, every one counted resident (an upper
// bound, as for joined mappings) in place of the block's `block_dirty_bytes` of them, and what
// the dirty limit no longer allows is purged once the lock is let go.
void give_back(SpanChunk* chunk, size_t first, size_t count, size_t block_dirty_bytes) {
  count_committed(count * kOsPageBytes, block_dirty_bytes);
  SpanClaims claims;
  const uint64_t now = os::now_ms();
  SpanArena& a = span_arena_of(chunk);
  {
    os::LockGuard guard(a.lock);
    give_pages(chunk, first, count, now);
    span_claim_over_limit(a, &claims, now);
    span_publish(a);
  }
  span_purge_and_finish(a, &claims);
  purger_notify();
}

// A freed block's pages back to its chunk (the lock held), its touched bytes the chunk's now.
void give_block(LargeHeader* header, uint64_t now) {
  SpanChunk* chunk = chunk_of(header);
  count_committed(header->reserve_bytes, header->dirty_bytes);
  header->dirty_bytes = 0;
  give_pages(chunk, page_index(chunk, header), header->reserve_bytes >> kOsPageShift, now);
}

// Takes the arena's kept block at `i` out (lock held).
LargeHeader* unstash(SpanArena& a, size_t i) {
  LargeHeader* header = a.stash[i];
  for (size_t j = i; j + 1 < a.stash_count; ++j) a.stash[j] = a.stash[j + 1];
  --a.stash_count;
  return header;
}

// Programs that free a large block and then ask for one of about its size (buffers replaced
// one at a time, a request's I/O buffer given back and the next one's taken) get the block they
// freed, whole, from a few the arena keeps (kSpanStashBlocks): no search of the index, no
// bitmaps changed on either side, and its header's page, which the program wrote, is resident.
// Through the index it took a run the rounding had made of that one and its neighbours, on a
// first page that another block may never have written, a page fault for every block of a
// program that writes little of them (large_slots: 0.088 -> 0.056 s, peak RSS 73 -> 46 MiB).

// The newest kept block that fits a run of `want` pages (span_run_fits), taken out; nullptr if
// none (lock held).
LargeHeader* take_stashed(SpanArena& a, size_t want) {
  for (size_t i = a.stash_count; i-- > 0;)
    if (span_run_fits(a.stash[i]->reserve_bytes >> kOsPageShift, want)) return unstash(a, i);
  return nullptr;
}

// Keeps a freed block whole, making room by giving the oldest back, unless it touched more
// than the stash may hold (lock held). A chunk left with no live block but kept ones gives
// those back too: an empty chunk is what the pool takes when it needs memory, and what the
// purger unmaps. True if pages went back to a chunk.
bool stash(SpanArena& a, LargeHeader* header, uint64_t now) {
  SpanChunk* chunk = chunk_of(header);
  const size_t pages = header->reserve_bytes >> kOsPageShift;
  // Once span requests have stopped, nothing is kept for them (span_purge.cpp's limit).
  if (now >= a.last_alloc_ms + kSpanIdleMs) {
    span_stash_flush(a, now);
    give_block(header, now);
    return true;
  }
  if (chunk->free_pages + stashed_pages(a, chunk) + chunk->claimed_pages + pages == kSpanChunkOsPages - 1) {
    for (size_t i = a.stash_count; i-- > 0;)
      if (chunk_of(a.stash[i]) == chunk) give_block(unstash(a, i), now);
    give_block(header, now);
    return true;
  }
  if (header->dirty_bytes > kSpanStashDirtyBytes) {
    give_block(header, now);
    return true;
  }
  bool gave = false;
  while (a.stash_count == kSpanStashBlocks || stash_dirty_bytes(a) + header->dirty_bytes > kSpanStashDirtyBytes) {
    give_block(unstash(a, 0), now);
    gave = true;
  }
  a.stash[a.stash_count++] = header;
  return gave;
}

// Every page free; `resident_units` (64 KiB units, as the pool counts them) says which may
// hold memory already: those pages are free and dirty, the rest read zero.
SpanChunk* start_chunk(SpanArena& a, void* memory, uint64_t resident_units) {
  auto* chunk = static_cast<SpanChunk*>(memory);
  *chunk = SpanChunk{};
  chunk->magic = kSpanChunkMagic;
  chunk->arena = uint32_t(&a - g_span_arenas);
  chunk->free_pages = kSpanChunkOsPages - 1;
  span_index_add(a.index, chunk);
  span_mark_free(chunk, 1, kSpanChunkOsPages - 1);
  for (uint64_t left = resident_units; left != 0; left &= left - 1) {
    const size_t first = std::max<size_t>(1, size_t(__builtin_ctzll(left)) * kPagesPerUnit);
    const size_t end = (size_t(__builtin_ctzll(left)) + 1) * kPagesPerUnit;
    set_range(chunk->dirty_bits, first, end - first, true);
    chunk->dirty_pages += uint32_t(end - first);
  }
  chunk->freed_ms = os::now_ms();
  chunk->next = a.chunks;
  a.chunks = chunk;
  a.dirty_bytes += chunk->dirty_pages * kOsPageBytes;
  span_count_chunk(chunk, true);
  count_add(g_totals.bytes_large_committed, kOsPageBytes + chunk->dirty_pages * kOsPageBytes);
  chunk_map_set(chunk, kSegmentBytes, true);
  return chunk;
}

// For the pool, about to carve units that would fault in or to map a segment: the arena's empty
// chunk with the most resident pages, if any has one, as a 64 KiB unit mask of what may be
// resident. It leaves the chunks and their counts (the mapping stays counted); the pool sets
// the chunk map.
void* give_empty_chunk_of(SpanArena& a, uint64_t* resident_units) {
  os::LockGuard guard(a.lock);
  SpanChunk** best = nullptr;
  for (SpanChunk** link = &a.chunks; *link != nullptr; link = &(*link)->next)
    if (span_chunk_empty(*link) && (*link)->dirty_pages != 0 && (best == nullptr || (*link)->dirty_pages > (*best)->dirty_pages))
      best = link;
  if (best == nullptr) return nullptr;
  SpanChunk* chunk = *best;
  *best = chunk->next;
  span_count_chunk(chunk, false);
  span_index_remove(a.index, chunk);
  uint64_t units = 1;
  for (size_t i = span_next_with(chunk->dirty_bits, 1, true); i < kSpanChunkOsPages;) {
    units |= uint64_t{1} << (i / kPagesPerUnit);
    i = span_next_with(chunk->dirty_bits, (i / kPagesPerUnit + 1) * kPagesPerUnit, true);
  }
  *resident_units = units;
  a.dirty_bytes -= chunk->dirty_pages * kOsPageBytes;
  count_sub(g_totals.bytes_large_committed, kOsPageBytes + chunk->dirty_pages * kOsPageBytes);
  span_publish(a);
  return chunk;
}

// The first arena's with one (arenas that offer none are not locked).
void* give_empty_chunk(uint64_t* resident_units) {
  for (SpanArena& a : g_span_arenas)
    if (a.offered_empty.load(std::memory_order_relaxed) != 0)
      if (void* chunk = give_empty_chunk_of(a, resident_units)) return chunk;
  return nullptr;
}

// An empty segment of the pool whose units are still resident comes first: when a program's
// small blocks die as its big ones grow, the pool would purge those units while this faulted
// in new ones, the same memory twice. The pool asks the same of the chunks (give_empty_chunk).
SpanChunk* new_chunk(SpanArena& a) {
  if (!span_index_reserve(a.index)) return nullptr;
  uint64_t resident_units = 0;
  if (void* segment = segment_give_empty(&resident_units); segment != nullptr)
    return start_chunk(a, segment, resident_units);
  void* memory = segment_map_region();
  if (memory == nullptr) return nullptr;
  count_add(g_totals.bytes_mapped, kSegmentBytes);
  return start_chunk(a, memory, 0);
}

// Where a new block goes, and what taking its pages found there.
struct Placement {
  SpanChunk* chunk = nullptr;
  size_t first = 0;
  size_t count = 0;        // pages of its run
  size_t touched = 0;      // take_pages'
  size_t taken_dirty = 0;  // take_pages'
  LargeHeader* kept = nullptr;  // a freed block the arena kept whole, taken instead
};

// A block whose run's first page never held a header (what a shorter block left of a longer
// run, joined to the next block freed) starts instead on a page of the run where a block
// started before, if it fits from there and skips at most an eighth of its own pages: that
// page is resident, so the header and the program's first write land without a page fault.
// A program that writes little of its blocks (buffers sized for the worst case) otherwise
// faults in a page wherever a rounded length can end, a new one every few allocations. The
// bound keeps what is skipped, left free, as short as the rounding's slack: a run is not cut
// in two for a block that could have taken its front, which for blocks the program fills
// (every page resident anyway) would cost contiguous free pages and save nothing.
void start_where_one_started(Placement* at) {
  const size_t page = span_next_with(at->chunk->started_bits, at->first, true);
  if (page == at->first) return;
  const size_t run_end = span_next_with(at->chunk->free_bits, at->first, false);
  if (page + at->count <= run_end && page - at->first <= at->count / 8) at->first = page;
}

// Takes the placement's pages out of arena `a` (locked), which holds its chunk.
void take(SpanArena& a, Placement* at) {
  at->touched = take_pages(at->chunk, at->first, at->count, &at->taken_dirty);
  set_range(at->chunk->started_bits, at->first, 1, true);
  set_block_starts(at->chunk, at->first, 1, true);
  a.peak_live_bytes.note(a.live_bytes, a.last_alloc_ms);
  span_publish(a);
}

// A block of `need` pages from arena `a` (locked): a freed block it kept whole that fits
// (at->kept), else a free run, taken: of its rounded length, else, since that still beats a
// new chunk, one that holds its exact pages. False if none.
bool place(SpanArena& a, size_t need, Placement* at) {
  at->count = span_run_pages(need);
  // Its pages, counts and touched bytes are as they were while the block was live.
  if ((at->kept = take_stashed(a, at->count)) != nullptr) {
    span_publish(a);
    return true;
  }
  if (!span_index_find(a.index, at->count, &at->chunk, &at->first)) {
    if (at->count == need || !span_index_find(a.index, need, &at->chunk, &at->first)) return false;
    at->count = need;
  }
  start_where_one_started(at);
  take(a, at);
  return true;
}

// place, and if nothing fits, again once the blocks `a` (locked) keeps whole are given back:
// joined to their free neighbours, they may hold what none of them held alone.
bool place_or_give_back_kept(SpanArena& a, size_t need, Placement* at) {
  if (place(a, need, at)) return true;
  if (a.stash_count == 0) return false;
  span_stash_flush(a, a.last_alloc_ms);
  return place(a, need, at);
}

// Before a new chunk for arena `own`: a free run of another arena in use, each locked in turn
// (the caller holds no lock, so two threads never wait for each other's), and with
// `give_back_kept` the blocks such an arena keeps whole too. Threads that moved apart when
// they met still share what each other freed, rather than each holding chunks of its own
// (mstress, whose short-lived threads met now and then: 61 against 56 MiB peak RSS before
// this). The thread moves to the arena whose run it took: one that moved because the purger
// held its lock for a moment goes back to where its memory is, the blocks it kept there
// included (in CI's TSan run a thread so moved mapped a new chunk beside two it had kept).
bool place_elsewhere(const SpanArena& own, size_t need, uint64_t now, bool give_back_kept,
                     Placement* at) {
  for (size_t i = 0, in_use = span_arenas_in_use(); i < in_use; ++i) {
    SpanArena& a = g_span_arenas[i];
    if (&a == &own) continue;
    const os::LockGuard guard(a.lock);
    a.last_alloc_ms = std::max(a.last_alloc_ms, now);
    if (give_back_kept ? place_or_give_back_kept(a, need, at) : place(a, need, at)) {
      tls_arena = uint32_t(i);
      return true;
    }
  }
  return false;
}

// A new chunk for arena `own`, unless a run freed into it meanwhile holds the block, or one of
// the blocks it keeps whole does, given back, or, given back, one that another arena keeps.
bool place_new(SpanArena& own, size_t need, uint64_t now, Placement* at) {
  {
    const os::LockGuard guard(own.lock);
    if (place_or_give_back_kept(own, need, at)) return true;
  }
  if (place_elsewhere(own, need, now, true, at)) return true;
  const os::LockGuard guard(own.lock);
  if (place(own, need, at)) return true;
  at->chunk = new_chunk(own);
  if (at->chunk == nullptr) return false;
  at->first = 1;
  at->count = span_run_pages(need);
  take(own, at);
  return true;
}

}  // namespace

LargeHeader* span_alloc(size_t used_bytes) {
  TRAY_ASSERT(used_bytes <= kSpanMaxBytes && used_bytes % kOsPageBytes == 0);
  if (os::page_size() != kOsPageBytes) return nullptr;
  const size_t need = used_bytes >> kOsPageShift;
  const uint64_t now = os::now_ms();
  if (LargeHeader* kept = span_cache_take(span_run_pages(need), now); kept != nullptr) return kept;
  Placement at;
  SpanArena& own = lock_thread_arena(now);
  own.last_alloc_ms = std::max(own.last_alloc_ms, now);
  const bool placed = place(own, need, &at);
  own.lock.unlock();
  if (!placed && !place_elsewhere(own, need, now, false, &at) && !place_new(own, need, now, &at))
    return nullptr;
  if (at.kept != nullptr) return at.kept;
  SpanChunk* const chunk = at.chunk;
  const size_t first = at.first;
  const size_t count = at.count;
  // The pages are the block's now, out of every list: the header's page, which faults in
  // where no block started before, is written without the lock. Under it, a thread that wanted
  // the lock waited out the fault and went to sleep (two threads recycling blocks of 256..512
  // KiB took three times as long as one).
  auto* header = reinterpret_cast<LargeHeader*>(span_bytes(chunk) + first * kOsPageBytes);
  header->magic = kSpanBlockMagic;
  header->reserve_bytes = count * kOsPageBytes;
  // The header page is touched now, whatever the page held.
  header->dirty_bytes = std::max(at.touched, kOsPageBytes);
  count_committed(header->dirty_bytes, at.taken_dirty);
  return header;
}

// The nearest block start at or below p's page, and p must lie in that block's run: past it
// (free pages, or another chunk's header page) there is no block. Without the lock, so a bad
// pointer may read a header on its way in or out, as a bad pointer may read any block.
LargeHeader* span_block_of(const void* chunk, const void* p) {
  const auto* c = static_cast<const SpanChunk*>(chunk);
  const size_t page = page_index(c, p);
  size_t w = page / 64;
  uint64_t starts = __atomic_load_n(&c->block_bits[w], __ATOMIC_RELAXED) & (~uint64_t{0} >> (63 - page % 64));
  while (starts == 0) {
    if (w == 0) return nullptr;
    starts = __atomic_load_n(&c->block_bits[--w], __ATOMIC_RELAXED);
  }
  const size_t first = w * 64 + 63 - size_t(__builtin_clzll(starts));
  auto* header = reinterpret_cast<LargeHeader*>(span_bytes(c) + first * kOsPageBytes);
  if (page - first >= header->reserve_bytes >> kOsPageShift) return nullptr;
  return header;
}

void span_free(LargeHeader* header) {
  const uint64_t now = os::now_ms();
  if (span_cache_put(header, now)) {
    purger_notify();  // the purger gives it back once the thread's requests stop
    return;
  }
  span_arena_free(header, now);
}

void span_arena_free(LargeHeader* header, uint64_t now) {
  SpanArena& a = span_arena_of(chunk_of(header));
  SpanClaims claims;
  if (!a.lock.try_lock()) {
    span_cache_contended(now);
    a.lock.lock();
  }
  if (stash(a, header, now)) span_claim_over_limit(a, &claims, now);
  span_publish(a);
  a.lock.unlock();
  span_purge_and_finish(a, &claims);
  // Kept whole or given back, it is memory to give to the OS once requests stop.
  purger_notify();
}

void span_stash_flush(SpanArena& a, uint64_t now_ms) {
  while (a.stash_count != 0) give_block(unstash(a, 0), now_ms);
}

bool span_grow(LargeHeader* header, size_t new_used) {
  SpanChunk* chunk = chunk_of(header);
  const size_t first = page_index(chunk, header);
  const size_t end = first + (header->reserve_bytes >> kOsPageShift);
  const size_t new_end = first + (new_used >> kOsPageShift);
  if (new_end > kSpanChunkOsPages) return false;
  SpanArena& a = span_arena_of(chunk);
  os::LockGuard guard(a.lock);
  const size_t free_end = span_next_with(chunk->free_bits, end, false);
  if (free_end < new_end) return false;
  const size_t run_end = std::min(free_end, first + span_run_pages(new_end - first));
  // The taken pages' contents are the block's to overwrite: their touched bytes need no zeroing,
  // and the caller counts the whole grown block as touched; resident pages past it, in the
  // rounded run, stay counted here.
  size_t taken_dirty = 0;
  const size_t old_dirty = header->dirty_bytes;
  if (const size_t touched = take_pages(chunk, end, run_end - end, &taken_dirty); touched != 0)
    header->dirty_bytes = std::max(header->dirty_bytes, (end - first) * kOsPageBytes + touched);
  count_committed(header->dirty_bytes - old_dirty, taken_dirty);
  a.peak_live_bytes.note(a.live_bytes, os::now_ms());
  span_publish(a);
  header->reserve_bytes = (run_end - first) * kOsPageBytes;
  return true;
}

void span_shrink(LargeHeader* header, size_t new_used) {
  const size_t new_reserve = span_run_pages(new_used >> kOsPageShift) * kOsPageBytes;
  if (new_reserve >= header->reserve_bytes) return;
  SpanChunk* chunk = chunk_of(header);
  const size_t first = page_index(chunk, header);
  const size_t new_end = first + (new_reserve >> kOsPageShift);
  const size_t count = (header->reserve_bytes - new_reserve) >> kOsPageShift;
  // The pages move from the block's touched count to the chunk's.
  const size_t dirty = std::min(header->dirty_bytes, new_reserve);
  const size_t moved = header->dirty_bytes - dirty;
  header->dirty_bytes = dirty;
  header->reserve_bytes = new_reserve;
  give_back(chunk, new_end, count, moved);
}

}  // namespace tray
