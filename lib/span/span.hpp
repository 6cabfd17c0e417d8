// Large blocks that fit in a chunk (above kMaxSmallBytes, up to kSpanMaxBytes) are runs of OS
// pages cut from shared 4 MiB chunks (span chunks), not mappings of their own: a freed run
// stays resident and serves the next block of any size that fits in it, so blocks that come
// and go are not faulted in again, and a 300 KiB block does not hold a 4 MiB chunk. Free pages
// stay dirty for kSpanPurgeDelayMs after the last free into their chunk, and at most the
// larger of kSpanDirtyFloorBytes and a share of the live span bytes. The chunks are kept in
// arenas (kSpanArenaCount), each with its own lock: threads that allocate spans at once move
// apart, and a block goes back to its chunk's arena.
//
// A span chunk starts with its SpanChunk header page, where a large mapping has its
// LargeHeader: the chunk map marks it as a one-chunk large mapping, and large_mapping_of tells
// the two apart by the magic. Each block still has a LargeHeader at its first page.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "span/config.hpp"
#include "span/span_cache.hpp"

namespace tray {

inline constexpr uint32_t kSpanChunkMagic = 0x5350414E;  // "SPAN": a span chunk's header
inline constexpr uint32_t kSpanBlockMagic = 0x5350424B;  // "SPBK": a block inside one

// The pages of the run a block of `pages` pages takes: rounded up to a multiple of an eighth
// of the power of two below (at most 1/8 more, in pages the block does not use), and to no
// more than a chunk holds. Blocks of random sizes then free runs that the next blocks of their
// length take whole, so blocks start where blocks started before, on pages that are resident
// already: with exact lengths every split moved the next block's first page, the one its
// header writes, onto a page never touched (a third of all allocations faulted, on
// `large_slots`). A power of two and one page is not rounded: the block's 64-byte header takes
// that page, and rounding 1 MiB's 257 pages to 288 would leave an eighth of each unused.
constexpr size_t span_run_pages(size_t pages) {
  if (pages <= 9 || is_pow2(pages - 1)) return pages;
  const size_t step = size_t{1} << (floor_log2(pages - 1) - 3);
  return std::min(align_up(pages, step), kSpanChunkOsPages - 1);
}
static_assert(span_run_pages(9) == 9 && span_run_pages(34) == 36 && span_run_pages(257) == 257 &&
              span_run_pages(258) == 288 && span_run_pages(1000) == kSpanChunkOsPages - 1);

// A run of at least used_bytes (whole pages, at most kSpanMaxBytes), span_run_pages long when
// a free run or a new chunk has room for that, with its LargeHeader's magic, reserve_bytes (the
// run) and dirty_bytes (the touched prefix: reused pages) set and counted; nullptr if spans are
// off (OS pages other than kOsPageBytes) or the OS refuses.
LargeHeader* span_alloc(size_t used_bytes);
// The header of the live block that p lies in, inside the span chunk `chunk`; nullptr if p lies
// in the chunk's header page or in free pages.
LargeHeader* span_block_of(const void* chunk, const void* p);
// Gives the block's pages back to its chunk (they stay dirty, see above).
void span_free(LargeHeader* header);
// Grows the block's run in place to hold new_used bytes if the pages after it are free (to
// span_run_pages where they allow); false if not.
bool span_grow(LargeHeader* header, size_t new_used);
// Gives the block's pages past the run that new_used takes back to its chunk.
void span_shrink(LargeHeader* header, size_t new_used);
// Purges every free page and unmaps empty chunks; true if there was any.
bool span_trim();
// Gives the freed blocks every arena keeps whole back to their chunks (span_trim does first).
void span_stash_flush_all();
// Purges the free pages of chunks whose delay ran out and unmaps those left empty: when the
// next will be due, or kNeverMs.
uint64_t span_purge_expired(uint64_t now_ms);
// Chunks with resident free pages and freed blocks kept whole, and the bytes of both (lock-free,
// for dumps).
void span_dirty_usage(size_t* chunks, size_t* bytes);

void span_lock_for_fork();
void span_unlock_after_fork();

}  // namespace tray
