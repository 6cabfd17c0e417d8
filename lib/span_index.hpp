// The index over the span chunks that finds a free run for a block without opening every
// chunk's header: per chunk, the length bins of its free runs, side by side. Every call is
// made under the spans' lock; span.cpp reports each free run that appears or goes.
#pragma once

#include <cstddef>

#include "span_chunk.hpp"

namespace tray {

// Room for one more chunk; false if the OS refused the memory for it.
bool span_index_reserve();
// A chunk enters (after span_index_reserve; its runs come after) or leaves the index.
void span_index_add(SpanChunk* chunk);
void span_index_remove(const SpanChunk* chunk);
// A free run of `pages` pages appeared in the chunk, or went (taken, split or joined).
void span_index_run_added(SpanChunk* chunk, size_t pages);
void span_index_run_removed(SpanChunk* chunk, size_t pages);
// A free run of at least `count` pages: one in the smallest length bin whose runs all hold it,
// or of that bin, where its runs may be shorter (a length between rounded ones), one that
// holds it; in the first chunk of the index that has one, its first such run. False if no
// chunk has one.
bool span_index_find(size_t count, SpanChunk** out_chunk, size_t* out_first);
// Debug builds: checks the index against a walk over every chunk of the list.
void span_index_check(SpanChunk* chunks);

}  // namespace tray
