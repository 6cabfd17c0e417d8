#include "span.hpp"

#include <algorithm>
#include <atomic>

#include "core/assert.hpp"
#include "core/bitmap.hpp"
#include "core/bits.hpp"
#include "core/config.hpp"
#include "core/recent_peak.hpp"
#include "platform/os.hpp"
#include "purger.hpp"
#include "segment.hpp"
#include "span_chunk.hpp"
#include "span_index.hpp"
#include "stats.hpp"

namespace tray {

namespace {

constexpr size_t kPagesPerUnit = kUnitBytes / kSpanPageBytes;  // the pool's unit, in pages

os::Mutex g_lock;
SpanChunk* g_chunks = nullptr;
size_t g_dirty_bytes = 0;
uint64_t g_last_alloc_ms = 0;  // the last span_alloc: dirty pages are kept only while they come
size_t g_live_bytes = 0;
constinit RecentPeak<kSpanPurgeDelayMs> g_peak_live_bytes;  // of g_live_bytes, lately
std::atomic<size_t> g_dirty_seen{0};
std::atomic<size_t> g_dirty_chunks_seen{0};

char* base_of(const void* p) { return static_cast<char*>(const_cast<void*>(p)); }

SpanChunk* chunk_of(const void* p) {
  return reinterpret_cast<SpanChunk*>(align_down(reinterpret_cast<uintptr_t>(p), kSegmentBytes));
}

size_t page_index(const SpanChunk* chunk, const void* p) {
  return size_t(base_of(p) - base_of(chunk)) >> kSpanPageShift;
}

// The first page at or after `from` whose bit is `value`, or kSpanChunkPages.
size_t next_with(const uint64_t* bits, size_t from, bool value) {
  return bitmap::next_with(bits, kSpanChunkPages, from, value);
}

using bitmap::count_range;
using bitmap::end_of_set;
using bitmap::set_range;

void* give_empty_chunk(uint64_t* resident_units);

bool chunk_empty(const SpanChunk* chunk) { return chunk->free_pages == kSpanChunkPages - 1; }

// The chunks that hold free resident pages, and of those the ones that hold no block, kept up
// to date as chunks change: counting them with a walk over every chunk (a TLB miss each, their
// headers 4 MiB apart) on every span allocation and free took 2.5% of `swing`'s samples.
size_t g_dirty_chunks = 0;
size_t g_empty_dirty_chunks = 0;

// Adds a chunk's part to the counts (`in`), or takes it out.
void count_chunk(const SpanChunk* chunk, bool in) {
  if (chunk->dirty_pages == 0) return;
  g_dirty_chunks = in ? g_dirty_chunks + 1 : g_dirty_chunks - 1;
  if (chunk_empty(chunk)) g_empty_dirty_chunks = in ? g_empty_dirty_chunks + 1 : g_empty_dirty_chunks - 1;
}

// Brackets every change to a chunk's free or dirty pages.
class Recount {
 public:
  explicit Recount(const SpanChunk* chunk) : chunk_(chunk) { count_chunk(chunk_, false); }
  ~Recount() { count_chunk(chunk_, true); }
  Recount(const Recount&) = delete;
  Recount& operator=(const Recount&) = delete;

 private:
  const SpanChunk* chunk_;
};

// Pages [first, first + count), all in one free run, leave it; what is left of the run on
// either side stays free. The index learns of the runs that go and come.
void mark_used(SpanChunk* chunk, size_t first, size_t count) {
  const size_t start = bitmap::run_start(chunk->free_bits, first);
  const size_t end = next_with(chunk->free_bits, first, false);
  TRAY_ASSERT(end >= first + count);
  span_index_run_removed(chunk, end - start);
  if (first > start) span_index_run_added(chunk, first - start);
  if (end > first + count) span_index_run_added(chunk, end - first - count);
  set_range(chunk->free_bits, first, count, false);
}

// Pages [first, first + count), all used, become free, one run with the free runs beside them.
void mark_free(SpanChunk* chunk, size_t first, size_t count) {
  const size_t start = bitmap::run_start(chunk->free_bits, first);
  const size_t end = next_with(chunk->free_bits, first + count, false);
  if (start < first) span_index_run_removed(chunk, first - start);
  if (end > first + count) span_index_run_removed(chunk, end - first - count);
  span_index_run_added(chunk, end - start);
  set_range(chunk->free_bits, first, count, true);
}

// The counts that readers without the lock see, and what the pool may take (give_empty_chunk):
// the empty chunks that hold resident pages, for a segment it would map; and for units that
// would fault in, the same only once the spans have shrunk to half their recent high or less.
// Spans that stay busy reuse their empty chunks soon, and a pool that took one for a page would
// leave the spans to map a new one.
void publish() {
#ifndef NDEBUG
  size_t dirty = 0;
  size_t empty = 0;
  for (const SpanChunk* c = g_chunks; c != nullptr; c = c->next) {
    dirty += c->dirty_pages != 0;
    empty += c->dirty_pages != 0 && chunk_empty(c);
  }
  TRAY_ASSERT(dirty == g_dirty_chunks && empty == g_empty_dirty_chunks);
  span_index_check(g_chunks);
#endif
  g_dirty_chunks_seen.store(g_dirty_chunks, std::memory_order_relaxed);
  g_dirty_seen.store(g_dirty_bytes, std::memory_order_relaxed);
  const bool shrunk = g_live_bytes <= g_peak_live_bytes.bytes() / 2;
  segment_offer_empty_chunks(&give_empty_chunk, g_empty_dirty_chunks, shrunk ? g_empty_dirty_chunks : 0);
}

// A block's pages name its first page (0: no block). Written by the block's owner without the
// lock, while the pages are the block's: after they are taken, before they are given back.
// Frees read them without it too, and only a bad pointer can look at a block on its way.
void set_start(SpanChunk* chunk, size_t first, size_t count, uint16_t value) {
  for (size_t i = first; i < first + count; ++i)
    __atomic_store_n(&chunk->start[i], value, __ATOMIC_RELAXED);
}

// Takes pages [first, first + count) of `chunk` for a block: how many bytes from `first` up
// to the end of the last resident one (0 if none was).
size_t take_pages(SpanChunk* chunk, size_t first, size_t count) {
  const Recount recount(chunk);
  const size_t dirty = count_range(chunk->dirty_bits, first, count);
  const size_t touched_end = end_of_set(chunk->dirty_bits, first, count);
  mark_used(chunk, first, count);
  set_range(chunk->dirty_bits, first, count, false);
  chunk->free_pages -= uint32_t(count);
  chunk->dirty_pages -= uint32_t(dirty);
  g_dirty_bytes -= dirty * kSpanPageBytes;
  g_live_bytes += count * kSpanPageBytes;
  // The block's header counts them from now on (the caller sets its dirty_bytes).
  count_sub(g_totals.bytes_large_committed, dirty * kSpanPageBytes);
  return (touched_end - first) * kSpanPageBytes;
}

// Gives pages [first, first + count) back to `chunk`, resident.
void give_pages(SpanChunk* chunk, size_t first, size_t count, uint64_t now) {
  const Recount recount(chunk);
  mark_free(chunk, first, count);
  set_range(chunk->dirty_bits, first, count, true);
  chunk->free_pages += uint32_t(count);
  chunk->dirty_pages += uint32_t(count);
  chunk->freed_ms = now;
  g_dirty_bytes += count * kSpanPageBytes;
  g_live_bytes -= count * kSpanPageBytes;
  count_add(g_totals.bytes_large_committed, count * kSpanPageBytes);
}

// A free run that holds resident pages, taken out of its chunk for purging: its pages are
// neither free nor dirty while madvise runs without the lock, so no block takes them, no
// other purge picks them again and the chunk is not unmapped under it.
struct Claim {
  SpanChunk* chunk;
  uint16_t first;
  uint16_t count;
  uint16_t dirty;  // of the run's pages, the resident ones
  bool purged;
};

struct Claims {
  Claim runs[kSpanPurgeClaimsPerRound];
  size_t count = 0;
  bool full() const { return count == kSpanPurgeClaimsPerRound; }
};

// Claims the chunk's free runs that hold resident pages, each run whole: its clean pages go in
// the same madvise (harmless on free pages), so a run freed a block at a time, with clean
// gaps, is one call, not one per dirty stretch. False if the claims filled up first.
bool claim_chunk(SpanChunk* chunk, Claims* claims) {
  const Recount recount(chunk);
  for (size_t s = next_with(chunk->free_bits, 1, true); s < kSpanChunkPages;) {
    const size_t e = next_with(chunk->free_bits, s, false);
    const size_t dirty = count_range(chunk->dirty_bits, s, e - s);
    if (dirty != 0) {
      if (claims->full()) return false;
      claims->runs[claims->count++] = {chunk, uint16_t(s), uint16_t(e - s), uint16_t(dirty), false};
      mark_used(chunk, s, e - s);
      set_range(chunk->dirty_bits, s, e - s, false);
      chunk->free_pages -= uint32_t(e - s);
      chunk->dirty_pages -= uint32_t(dirty);
      g_dirty_bytes -= dirty * kSpanPageBytes;
    }
    s = next_with(chunk->free_bits, e, true);
  }
  return true;
}

// Without the lock.
void purge_claims(Claims* claims) {
  for (size_t i = 0; i < claims->count; ++i) {
    Claim& run = claims->runs[i];
    run.purged = os::purge(base_of(run.chunk) + run.first * kSpanPageBytes, run.count * kSpanPageBytes);
  }
}

// Puts the claimed runs back as free. Runs the kernel refused stay counted as resident, every
// page of them: a later calloc must not take one for zero.
void finish_claims(const Claims& claims) {
  for (size_t i = 0; i < claims.count; ++i) {
    const Claim& run = claims.runs[i];
    SpanChunk* chunk = run.chunk;
    const Recount recount(chunk);
    mark_free(chunk, run.first, run.count);
    chunk->free_pages += run.count;
    if (run.purged) {
      count_sub(g_totals.bytes_large_committed, run.dirty * kSpanPageBytes);
      count_add(g_totals.bytes_purged, run.dirty * kSpanPageBytes);
    } else {
      set_range(chunk->dirty_bits, run.first, run.count, true);
      chunk->dirty_pages += run.count;
      g_dirty_bytes += run.count * kSpanPageBytes;
      count_add(g_totals.bytes_large_committed, (run.count - run.dirty) * kSpanPageBytes);
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
size_t dirty_limit_bytes(uint64_t now_ms) {
  if (now_ms >= g_last_alloc_ms + kSpanIdleMs) return 0;
  const size_t peak = std::max(g_peak_live_bytes.recent(now_ms), g_live_bytes);
  return std::max(kSpanDirtyFloorBytes, peak / 100 * kSpanDirtyLivePercent) + (peak - g_live_bytes);
}

// Claims the chunks freed into longest ago until the resident free pages are within the limit.
void claim_over_limit(Claims* claims, uint64_t now_ms) {
  const size_t limit = dirty_limit_bytes(now_ms);
  while (g_dirty_bytes > limit && !claims->full()) {
    SpanChunk* oldest = nullptr;
    for (SpanChunk* c = g_chunks; c != nullptr; c = c->next)
      if (c->dirty_pages != 0 && (oldest == nullptr || c->freed_ms < oldest->freed_ms)) oldest = c;
    if (oldest == nullptr) return;
    claim_chunk(oldest, claims);
  }
}

// The claims' madvise, without the lock, and their return under it.
void purge_and_finish(Claims* claims) {
  if (claims->count == 0) return;
  purge_claims(claims);
  os::LockGuard guard(g_lock);
  finish_claims(*claims);
  publish();
}

// Purges the free runs of every chunk that `due` picks, a round of claims at a time, until a
// round is not full or the kernel refused all of it (those runs would be claimed again); true
// if any went back.
template <typename Due>
bool purge_chunks(Due due) {
  bool any = false;
  for (bool more = true; more;) {
    Claims claims;
    {
      os::LockGuard guard(g_lock);
      for (SpanChunk* c = g_chunks; c != nullptr && !claims.full(); c = c->next)
        if (c->dirty_pages != 0 && due(c)) claim_chunk(c, &claims);
      more = claims.full();
    }
    purge_and_finish(&claims);
    bool round_purged = false;
    for (size_t i = 0; i < claims.count; ++i) round_purged |= claims.runs[i].purged;
    any |= round_purged;
    more = more && round_purged;
  }
  return any;
}

// Pages a block no longer holds go back to their chunk, and what the dirty limit no longer
// allows is purged once the lock is let go.
void give_back(SpanChunk* chunk, size_t first, size_t count) {
  set_start(chunk, first, count, 0);
  Claims claims;
  const uint64_t now = os::now_ms();
  {
    os::LockGuard guard(g_lock);
    give_pages(chunk, first, count, now);
    claim_over_limit(&claims, now);
    publish();
  }
  purge_and_finish(&claims);
  purger_notify();
}

void unmap_chunk(SpanChunk* chunk) {
  count_chunk(chunk, false);
  span_index_remove(chunk);
  // Its header page is all that is counted resident once the free pages are gone.
  count_sub(g_totals.bytes_large_committed, kSpanPageBytes + chunk->dirty_pages * kSpanPageBytes);
  g_dirty_bytes -= chunk->dirty_pages * kSpanPageBytes;
  count_add(g_totals.bytes_purged, kSpanPageBytes + chunk->dirty_pages * kSpanPageBytes);
  count_sub(g_totals.bytes_mapped, kSegmentBytes);
  chunk_map_clear(chunk, kSegmentBytes);
  os::unmap(chunk, kSegmentBytes);
}

// Unlinks and unmaps the empty chunks that `expired` says may go.
template <typename Expired>
bool unmap_empty_chunks(Expired expired) {
  bool any = false;
  for (SpanChunk** link = &g_chunks; *link != nullptr;) {
    SpanChunk* c = *link;
    if (chunk_empty(c) && expired(c)) {
      *link = c->next;
      unmap_chunk(c);
      any = true;
    } else {
      link = &c->next;
    }
  }
  return any;
}

// Every page free; `resident_units` (64 KiB units, as the pool counts them) says which may
// hold memory already: those pages are free and dirty, the rest read zero.
SpanChunk* start_chunk(void* memory, uint64_t resident_units) {
  auto* chunk = static_cast<SpanChunk*>(memory);
  *chunk = SpanChunk{};
  chunk->magic = kSpanChunkMagic;
  chunk->free_pages = kSpanChunkPages - 1;
  span_index_add(chunk);
  mark_free(chunk, 1, kSpanChunkPages - 1);
  for (uint64_t left = resident_units; left != 0; left &= left - 1) {
    const size_t first = std::max<size_t>(1, size_t(__builtin_ctzll(left)) * kPagesPerUnit);
    const size_t end = (size_t(__builtin_ctzll(left)) + 1) * kPagesPerUnit;
    set_range(chunk->dirty_bits, first, end - first, true);
    chunk->dirty_pages += uint32_t(end - first);
  }
  chunk->freed_ms = os::now_ms();
  chunk->next = g_chunks;
  g_chunks = chunk;
  g_dirty_bytes += chunk->dirty_pages * kSpanPageBytes;
  count_chunk(chunk, true);
  count_add(g_totals.bytes_large_committed, kSpanPageBytes + chunk->dirty_pages * kSpanPageBytes);
  chunk_map_set(chunk, kSegmentBytes, true);
  return chunk;
}

// For the pool, about to carve units that would fault in or to map a segment: the empty
// chunk with the most resident pages, if any has one, as a 64 KiB unit mask of what may be
// resident. It leaves the chunks and their counts (the mapping stays counted); the pool sets
// the chunk map.
void* give_empty_chunk(uint64_t* resident_units) {
  os::LockGuard guard(g_lock);
  SpanChunk** best = nullptr;
  for (SpanChunk** link = &g_chunks; *link != nullptr; link = &(*link)->next)
    if (chunk_empty(*link) && (*link)->dirty_pages != 0 && (best == nullptr || (*link)->dirty_pages > (*best)->dirty_pages))
      best = link;
  if (best == nullptr) return nullptr;
  SpanChunk* chunk = *best;
  *best = chunk->next;
  count_chunk(chunk, false);
  span_index_remove(chunk);
  uint64_t units = 1;
  for (size_t i = next_with(chunk->dirty_bits, 1, true); i < kSpanChunkPages;) {
    units |= uint64_t{1} << (i / kPagesPerUnit);
    i = next_with(chunk->dirty_bits, (i / kPagesPerUnit + 1) * kPagesPerUnit, true);
  }
  *resident_units = units;
  g_dirty_bytes -= chunk->dirty_pages * kSpanPageBytes;
  count_sub(g_totals.bytes_large_committed, kSpanPageBytes + chunk->dirty_pages * kSpanPageBytes);
  publish();
  return chunk;
}

// An empty segment of the pool whose units are still resident comes first: when a program's
// small blocks die as its big ones grow, the pool would purge those units while this faulted
// in new ones, the same memory twice. The pool asks the same of the chunks (give_empty_chunk).
SpanChunk* new_chunk() {
  if (!span_index_reserve()) return nullptr;
  uint64_t resident_units = 0;
  if (void* segment = segment_give_empty(&resident_units); segment != nullptr)
    return start_chunk(segment, resident_units);
  void* memory = os::map_aligned(kSegmentBytes, kSegmentBytes);
  if (memory == nullptr) return nullptr;
  count_add(g_totals.bytes_mapped, kSegmentBytes);
  return start_chunk(memory, 0);
}

}  // namespace

LargeHeader* span_alloc(size_t used_bytes) {
  TRAY_ASSERT(used_bytes <= kSpanMaxBytes && used_bytes % kSpanPageBytes == 0);
  if (os::page_size() != kSpanPageBytes) return nullptr;
  const size_t need = used_bytes >> kSpanPageShift;
  size_t count = span_run_pages(need);
  SpanChunk* chunk = nullptr;
  size_t first = 0;
  size_t touched = 0;
  const uint64_t now = os::now_ms();
  {
    os::LockGuard guard(g_lock);
    g_last_alloc_ms = std::max(g_last_alloc_ms, now);
    // A free run that holds the block but not its rounded run still beats a new chunk.
    if (!span_index_find(count, &chunk, &first)) {
      if (count != need && span_index_find(need, &chunk, &first)) {
        count = need;
      } else {
        chunk = new_chunk();
        if (chunk == nullptr) return nullptr;
        first = 1;
      }
    }
    touched = take_pages(chunk, first, count);
    g_peak_live_bytes.note(g_live_bytes, g_last_alloc_ms);
    publish();
  }
  // The pages are the block's now, out of every list: the header's page, which faults in
  // where no block started before, is written without the lock. Under it, a thread that wanted
  // the lock waited out the fault and went to sleep (two threads recycling blocks of 256..512
  // KiB took three times as long as one).
  set_start(chunk, first, count, uint16_t(first));
  auto* header = reinterpret_cast<LargeHeader*>(base_of(chunk) + first * kSpanPageBytes);
  header->magic = kSpanBlockMagic;
  header->reserve_bytes = count * kSpanPageBytes;
  // The header page is touched now, whatever the page held.
  header->dirty_bytes = std::max(touched, kSpanPageBytes);
  count_add(g_totals.bytes_large_committed, header->dirty_bytes);
  return header;
}

LargeHeader* span_block_of(const void* chunk, const void* p) {
  const auto* c = static_cast<const SpanChunk*>(chunk);
  const size_t page = page_index(c, p);
  const size_t first = page == 0 ? 0 : __atomic_load_n(&c->start[page], __ATOMIC_RELAXED);
  if (first == 0) return nullptr;
  return reinterpret_cast<LargeHeader*>(base_of(c) + first * kSpanPageBytes);
}

void span_free(LargeHeader* header) {
  SpanChunk* chunk = chunk_of(header);
  const size_t first = page_index(chunk, header);
  // Every page of the block counts as resident now (an upper bound, as for joined mappings).
  count_sub(g_totals.bytes_large_committed, header->dirty_bytes);
  header->dirty_bytes = 0;
  give_back(chunk, first, header->reserve_bytes >> kSpanPageShift);
}

bool span_grow(LargeHeader* header, size_t new_used) {
  SpanChunk* chunk = chunk_of(header);
  const size_t first = page_index(chunk, header);
  const size_t end = first + (header->reserve_bytes >> kSpanPageShift);
  const size_t new_end = first + (new_used >> kSpanPageShift);
  if (new_end > kSpanChunkPages) return false;
  os::LockGuard guard(g_lock);
  const size_t free_end = next_with(chunk->free_bits, end, false);
  if (free_end < new_end) return false;
  const size_t run_end = std::min(free_end, first + span_run_pages(new_end - first));
  // The taken pages' contents are the block's to overwrite: their touched bytes need no zeroing,
  // and the caller counts the whole grown block as touched; resident pages past it, in the
  // rounded run, stay counted here.
  if (const size_t touched = take_pages(chunk, end, run_end - end); touched != 0) {
    const size_t dirty = (end - first) * kSpanPageBytes + touched;
    if (dirty > header->dirty_bytes) {
      count_add(g_totals.bytes_large_committed, dirty - header->dirty_bytes);
      header->dirty_bytes = dirty;
    }
  }
  set_start(chunk, end, run_end - end, uint16_t(first));
  g_peak_live_bytes.note(g_live_bytes, os::now_ms());
  publish();
  header->reserve_bytes = (run_end - first) * kSpanPageBytes;
  return true;
}

void span_shrink(LargeHeader* header, size_t new_used) {
  const size_t new_reserve = span_run_pages(new_used >> kSpanPageShift) * kSpanPageBytes;
  if (new_reserve >= header->reserve_bytes) return;
  SpanChunk* chunk = chunk_of(header);
  const size_t first = page_index(chunk, header);
  const size_t new_end = first + (new_reserve >> kSpanPageShift);
  const size_t count = (header->reserve_bytes - new_reserve) >> kSpanPageShift;
  // The pages move from the block's touched count to the chunk's.
  const size_t dirty = std::min(header->dirty_bytes, new_reserve);
  count_sub(g_totals.bytes_large_committed, header->dirty_bytes - dirty);
  header->dirty_bytes = dirty;
  header->reserve_bytes = new_reserve;
  give_back(chunk, new_end, count);
}

bool span_trim() {
  const bool purged = purge_chunks([](const SpanChunk*) { return true; });
  os::LockGuard guard(g_lock);
  const bool unmapped = unmap_empty_chunks([](const SpanChunk*) { return true; });
  publish();
  return purged || unmapped;
}

uint64_t span_purge_expired(uint64_t now_ms) {
  // A free may come after now_ms was read: it is not due.
  const auto expired = [now_ms](const SpanChunk* c) { return now_ms >= c->freed_ms + kSpanPurgeDelayMs; };
  // Runs kept warm for requests that have stopped go too: the limit is zero then.
  purge_chunks([&](const SpanChunk* c) { return expired(c) || dirty_limit_bytes(now_ms) == 0; });
  os::LockGuard guard(g_lock);
  unmap_empty_chunks(expired);
  uint64_t due = kNeverMs;
  for (SpanChunk* c = g_chunks; c != nullptr; c = c->next)
    if (c->dirty_pages != 0 || chunk_empty(c)) due = std::min(due, c->freed_ms + kSpanPurgeDelayMs);
  // Left dirty while requests came: due when they stop.
  if (g_dirty_bytes != 0 && g_last_alloc_ms + kSpanIdleMs > now_ms)
    due = std::min(due, g_last_alloc_ms + kSpanIdleMs);
  publish();
  return due;
}

void span_dirty_usage(size_t* chunks, size_t* bytes) {
  *chunks = g_dirty_chunks_seen.load(std::memory_order_relaxed);
  *bytes = g_dirty_seen.load(std::memory_order_relaxed);
}

void span_lock_for_fork() { g_lock.lock(); }

void span_unlock_after_fork() { g_lock.unlock(); }

}  // namespace tray
