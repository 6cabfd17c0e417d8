// The index over a span arena's chunks that finds a free run for a block without opening
// every chunk's header: per chunk, the length bins of its free runs, side by side. Every call
// is made under the arena's lock; span.cpp reports each free run that appears or goes.
#pragma once

#include <cstddef>

#include "span/span_chunk.hpp"

namespace tray {

// One index: a span arena's (span.cpp), under its lock.
struct SpanIndex {
  SpanChunk** chunks = nullptr;   // per slot, its chunk
  uint64_t* bin_slots = nullptr;  // per bin, a bitmap of the slots whose chunk has a run there
  size_t count = 0;
  size_t capacity = 0;            // slots, a multiple of 64
  uint32_t bin_chunks[64] = {};   // per bin, the chunks with a free run in it
  uint64_t bins = 0;              // the bins where that is not zero
};

// Room for one more chunk; false if the OS refused the memory for it.
bool span_index_reserve(SpanIndex& index);
// A chunk enters (after span_index_reserve; its runs come after) or leaves the index.
void span_index_add(SpanIndex& index, SpanChunk* chunk);
void span_index_remove(SpanIndex& index, const SpanChunk* chunk);
// A free run of `pages` pages appeared in the chunk, or went (taken, split or joined).
void span_index_run_added(SpanIndex& index, SpanChunk* chunk, size_t pages);
void span_index_run_removed(SpanIndex& index, SpanChunk* chunk, size_t pages);
// A free run of at least `count` pages: one in the smallest length bin whose runs all hold it,
// or of that bin, where its runs may be shorter (a length between rounded ones), one that
// holds it; in the chunk of the lowest slot that has one, its first such run. False if no
// chunk has one.
bool span_index_find(const SpanIndex& index, size_t count, SpanChunk** out_chunk, size_t* out_first);
// Debug builds: checks the index against a walk over every chunk of the list.
void span_index_check(const SpanIndex& index, SpanChunk* chunks);

}  // namespace tray
