// Frees across threads. A block freed by a thread whose heap does not own it is gathered in
// the freeing heap's buckets, a bucket per owner, as runs of blocks of one page; a full bucket
// goes onto the owner's remote stack in one compare-and-swap, and the owner, on its slow path,
// puts each run back on its page in one splice, without touching the blocks in between.
// Everything here runs on the sending (or draining) heap's own thread.
#pragma once

#include "types.hpp"

namespace tray {

// Sends a block of `page`, owned by another heap, home on behalf of `self` (&g_empty_heap for
// a thread without a heap: the block goes at once, alone).
void remote_send(Heap* self, Page* page, Block* block) noexcept;
// Sends every bucket of self on its way.
void remote_flush(Heap* self) noexcept;
// Takes in the blocks other threads sent home to `heap`.
void remote_drain(Heap* heap) noexcept;

}  // namespace tray
