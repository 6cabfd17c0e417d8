// Frees across threads. A block freed by a thread whose heap does not own it is gathered in
// the freeing heap's buckets, a bucket per owner, as runs of blocks of one page; a full bucket
// goes onto the owner's remote stack in one compare-and-swap, and the owner, on its slow path,
// puts each run back on its page in one splice, without touching the blocks in between.
// Everything here runs on the sending (or draining) heap's own thread.
#pragma once

#include "heap/types.hpp"
#include "segment/segment.hpp"

namespace tray {

// Sends a block of `page`, owned by another heap, home on behalf of `self` (&g_empty_heap for
// a thread without a heap: the block goes at once, alone).
void remote_send(Heap* self, Page* page, Block* block) noexcept;
// free() of a block of `page`, owned by another heap, by the thread whose heap is `self` (not
// &g_empty_heap): the common case whole, the rest through heap_free_remote. The arguments in
// the registers free_slow holds them in.
void remote_free(Block* block, Page* page, Heap* self) noexcept;
// An owner that stopped allocating (a thread that filled a table for others and now only
// waits on them) would otherwise keep what they freed into its stack until it exits: no
// other thread may take it in, since this one's fast paths write its pages without atomics.
// Freeing a foreign block is a slow path of its own thread, where taking it in is safe; the
// load is of a line that senders write once per batch. &g_empty_heap's stack stays empty (no
// page is its), so a thread without a heap needs no test of its own.
TRAY_INLINE bool has_remote_frees(const Heap* self) {
  return self->remote_free.load(std::memory_order_relaxed) != nullptr;
}

// Sends every bucket of self on its way.
void remote_flush(Heap* self) noexcept;
// remote_flush before self takes a page from the pool; and from each owner it sends to that
// has left blocks on its stack for kRemoteReclaimIdleMs without taking any in, takes the
// stack and gives the pages whose every block lies in it to the pool, the rest back.
void remote_flush_and_reclaim(Heap* self) noexcept;
// Takes in the blocks other threads sent home to `heap`.
void remote_drain(Heap* heap) noexcept;

}  // namespace tray
