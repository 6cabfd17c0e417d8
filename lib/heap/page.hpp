// Pages: a run of units cut into equal blocks of one size class. Blocks are carved lazily,
// a few KiB at a time, so a page that is barely used stays barely resident.
#pragma once

#include "core/core.hpp"
#include "heap/types.hpp"
#include "segment/segment.hpp"

namespace tray {

// Takes a page for class `size_class` from the segment pool and gives it to `heap`.
Page* page_acquire(Heap* heap, unsigned size_class);
// Returns an empty page (no block live, none in a remote list) to the segment pool.
void page_release(Page* page);
// Size of the page's debug state table (one word per block, whole OS pages).
size_t page_debug_states_bytes(const Page* page);
// Carves more blocks onto the free list; the page must have untouched blocks left. False
// (nothing carved) if the memory limit refuses a big class's next block: the page may then
// float before it is carved whole (queue.cpp).
bool page_extend(Page* page);
// An empty page that its heap keeps (every carved block free), which took in blocks from other
// threads: its free list is dropped, and its blocks are carved again, in address order, when
// it is allocated from next.
void page_recarve(Page* page);

TRAY_INLINE bool page_can_extend(const Page* page) { return page->capacity < page->reserved; }

}  // namespace tray
