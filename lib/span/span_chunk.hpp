// The header of a span chunk, shared by the spans (span.cpp) and their index of free runs
// (span_index.cpp); both change it under its arena's lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "span/config.hpp"

namespace tray {

inline constexpr size_t kSpanBitWords = kSpanChunkOsPages / 64;

// The first page of a span chunk. `magic` lies where a LargeHeader has its own. Lock held for
// every change; frees read `block_bits` without it (a block's own bit changes only while the
// block is not live, and each word is stored whole).
struct SpanChunk {
  uint32_t magic;
  uint32_t free_pages;
  uint32_t dirty_pages;  // free and resident
  SpanChunk* next;
  uint64_t freed_ms;  // the last free into it
  uint32_t slot;      // its entry in its arena's index
  uint32_t arena;     // the arena it belongs to (span.cpp) while it is a span chunk
  // Of its used pages, those of free runs a purge has claimed (span_purge.cpp): they hold no
  // live block.
  uint32_t claimed_pages;
  uint16_t bin_runs[64];  // its free runs in each of the index's length bins
  uint64_t free_bits[kSpanBitWords];
  uint64_t dirty_bits[kSpanBitWords];  // a subset of free_bits
  // Pages where a block started (its header, always written) since they were last purged:
  // resident for certain, where a free page's dirty bit says only that it may be.
  uint64_t started_bits[kSpanBitWords];
  // The first page of each block: a used page's block starts at the nearest bit at or below
  // it. One bit set and one cleared per block, where an entry per page naming its block's
  // first cost a store per page on each allocation and free (callgrind: 15% of large_threads'
  // instructions).
  uint64_t block_bits[kSpanBitWords];
};
static_assert(sizeof(SpanChunk) <= kOsPageBytes);

}  // namespace tray
