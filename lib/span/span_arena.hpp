// Span arenas: the state that span.cpp (allocation and frees) and span_purge.cpp (giving
// free pages back to the OS) share. Each arena's chunks, index and counts change under its
// lock only, and the functions here are called with it held unless they say otherwise.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "span/config.hpp"
#include "span/span_chunk.hpp"
#include "span/span_index.hpp"

namespace tray {

// An arena: chunks, their index and their counts, under a lock of its own.
struct SpanArena {
  os::Mutex lock;
  SpanChunk* chunks = nullptr;
  size_t dirty_bytes = 0;
  uint64_t last_alloc_ms = 0;  // the last span_alloc: dirty pages are kept only while they come
  size_t live_bytes = 0;
  RecentPeak<kSpanPurgeDelayMs> peak_live_bytes;  // of live_bytes, lately
  // The chunks that hold free resident pages, and of those the ones that hold no block, kept
  // up to date as chunks change: counting them with a walk over every chunk (a TLB miss each,
  // their headers 4 MiB apart) on every span allocation and free took 2.5% of `swing`'s
  // samples.
  size_t dirty_chunks = 0;
  size_t empty_dirty_chunks = 0;
  SpanIndex index;
  // Freed blocks kept whole (kSpanStashBlocks), oldest first: their pages stay taken, counted
  // live and resident, until span_stash_flush gives them back. So few that their touched
  // bytes and each chunk's share are summed when needed rather than counted.
  LargeHeader* stash[kSpanStashBlocks] = {};
  size_t stash_count = 0;
  // What readers without the lock see (publish).
  std::atomic<size_t> dirty_seen{0};
  std::atomic<size_t> dirty_chunks_seen{0};
  std::atomic<size_t> offered_empty{0};
  std::atomic<size_t> offered_spare{0};
};
extern SpanArena g_span_arenas[kSpanArenaCount];

inline SpanArena& span_arena_of(const SpanChunk* chunk) { return g_span_arenas[chunk->arena]; }

// A span chunk's or block's address, for byte arithmetic.
inline char* span_bytes(const void* p) { return static_cast<char*>(const_cast<void*>(p)); }
// One more than the highest arena a thread has moved to (lock-free).
size_t span_arenas_in_use();

// The first page at or after `from` whose bit is `value`, or kSpanChunkOsPages.
inline size_t span_next_with(const uint64_t* bits, size_t from, bool value) {
  return bitmap::next_with(bits, kSpanChunkOsPages, from, value);
}

inline bool span_chunk_empty(const SpanChunk* chunk) { return chunk->free_pages == kSpanChunkOsPages - 1; }

// Adds a chunk's part to its arena's counts (`in`), or takes it out.
void span_count_chunk(const SpanChunk* chunk, bool in);

// Brackets every change to a chunk's free or dirty pages.
class SpanRecount {
 public:
  explicit SpanRecount(const SpanChunk* chunk) : chunk_(chunk) { span_count_chunk(chunk_, false); }
  ~SpanRecount() { span_count_chunk(chunk_, true); }
  SpanRecount(const SpanRecount&) = delete;
  SpanRecount& operator=(const SpanRecount&) = delete;

 private:
  const SpanChunk* chunk_;
};

// Pages [first, first + count), all in one free run, leave it; what is left of the run on
// either side stays free. The index learns of the runs that go and come.
void span_mark_used(SpanChunk* chunk, size_t first, size_t count);
// Pages [first, first + count), all used, become free, one run with the free runs beside them.
void span_mark_free(SpanChunk* chunk, size_t first, size_t count);
// The arena's counts for readers without the lock, and its offer of empty chunks to the pool.
void span_publish(SpanArena& a);
// Gives every block the arena keeps whole (SpanArena::stash) back to its chunk, at `now_ms`.
void span_stash_flush(SpanArena& a, uint64_t now_ms);
// A freed block to its chunk's arena (not locked), which keeps it whole or gives its pages back.
void span_arena_free(LargeHeader* header, uint64_t now_ms);

// A block kept whole, of run `pages`, serves a request of `want` pages (a rounded length) if it
// is at most one rounding step longer: what it holds past the request is what a run of the next
// length would have held anyway.
inline bool span_run_fits(size_t pages, size_t want) { return pages >= want && pages <= want + want / 8; }

// --- span_purge.cpp ---

// A free run that holds resident pages, taken out of its chunk for purging: its pages are
// neither free nor dirty while madvise runs without the lock, so no block takes them, no
// other purge picks them again and the chunk is not unmapped under it.
struct SpanClaim {
  SpanChunk* chunk;
  uint16_t first;
  uint16_t count;
  uint16_t dirty;  // of the run's pages, the resident ones
  bool purged;
};

struct SpanClaims {
  SpanClaim runs[kSpanPurgeClaimsPerRound];
  size_t count = 0;
  bool full() const { return count == kSpanPurgeClaimsPerRound; }
};

// Claims the arena's chunks freed into longest ago until its resident free pages are within
// its limit.
void span_claim_over_limit(SpanArena& a, SpanClaims* claims, uint64_t now_ms);
// The claims' madvise, without the lock (not held on the call), and their return under it.
void span_purge_and_finish(SpanArena& a, SpanClaims* claims);

}  // namespace tray
