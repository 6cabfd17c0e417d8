// Blocks handed between threads, reused by the thread that frees them. A block of another
// thread's page that this thread frees stays with it, in a run of that page's blocks, for
// its own next allocation of the class: the slot takes the run in as it takes its own page's
// list, so the blocks a thread just read are the next it hands out, and they never travel
// back to their owner's core. Everything here runs on the freeing heap's own thread.
#pragma once

#include "core/core.hpp"
#include "heap/config.hpp"
#include "heap/hardening.hpp"
#include "heap/queue.hpp"
#include "heap/types.hpp"
#include "segment/segment.hpp"

namespace tray {

// Which of its class's runs gathers a page's blocks: descriptors lie 128 bytes apart.
TRAY_INLINE unsigned reuse_way(const Page* page) {
  return unsigned(reinterpret_cast<uintptr_t>(page) >> 7) & (kReuseWays - 1);
}

// The run of self that gathers `page`'s blocks.
TRAY_INLINE ReuseRun& reuse_run_of(Heap* self, const Page* page) {
  return self->reuse[page->size_class][reuse_way(page)];
}

// Adds a block to `run`, which gathers its page's blocks and has room.
TRAY_INLINE void reuse_push(Heap* self, ReuseRun& run, Page* page, Block* block) {
  link_store(page, block, run.head);
  run.head = block;
  ++run.count;
  self->reuse_bytes += page->block_bytes;
}

// Whether a block of `page` joins self's run of its page: one that holds blocks of it already
// and has room, while self's runs hold less than kReuseHeapBytes in all.
TRAY_INLINE bool reuse_joins(const Heap* self, const ReuseRun& run, const Page* page) {
  return run.page == page && run.count - 1 < run.limit - 1 &&  // 0 < count < limit
         self->reuse_bytes < kReuseHeapBytes;
}

// Whether a block of `page` (of a thread's heap) may start the run that reuse_joins refused:
// it has no blocks, self allocates from the class (a thread that only frees keeps nothing),
// and the class is not big: a big block's memory is its owner's to give back (heap/tails.cpp),
// and one block is a whole run's worth.
TRAY_INLINE bool reuse_may_start(Heap* self, const ReuseRun& run, const Page* page) {
  return run.count == 0 && !is_big_class(page->size_class) &&
         class_page(self, page->size_class) != &g_empty_page;
}

// Starts `run` with a block of `page`.
void reuse_start(Heap* self, ReuseRun& run, Page* page, Block* block) noexcept;

// Keeps a freed (and counted) block of another heap's page for self's own next allocations,
// in the run of its page; false where it goes home instead: self does not allocate from the
// class, the page is no thread's (a program heap's, the heap profile's), the run gathers
// another page's blocks, or it or all of self's runs are full.
TRAY_INLINE bool reuse_take(Heap* self, Page* page, Block* block) {
  if (!self->reuse_on) return false;
  ReuseRun& run = reuse_run_of(self, page);
  if (TRAY_LIKELY(reuse_joins(self, run, page))) {
    reuse_push(self, run, page, block);
    return true;
  }
  if (page->owner_kind != OwnerKind::kThread || !reuse_may_start(self, run, page)) return false;
  reuse_start(self, run, page, block);
  return true;
}

// A free of `page`'s block, owned by another heap, by self's thread (a thread's heap), counted:
// kept where reuse_take may, else sent home.
void reuse_keep_or_send(Heap* self, Page* page, Block* block) noexcept;
// Whether a free of another heap's block, counted, goes to reuse_free: keeping is on, or the
// look at whether it should be is due. One decrement on the path of every such free.
TRAY_INLINE bool reuse_wanted(Heap* self) { return --self->reuse_left == 0; }
// The free of another heap's block that reuse_wanted sends here: looks at keeping when due,
// then keeps the block or sends it home (reuse_keep_or_send).
void reuse_free(Heap* self, Page* page, Block* block) noexcept;
// Takes the fullest run of class c out (count 0 if none), for the slot.
ReuseRun reuse_pick(Heap* self, unsigned c) noexcept;
// Sends home a list of `page`'s blocks that this thread kept (a run, or the slot's list taken
// from one): at most `most`, each link checked; returns how many.
uint32_t reuse_send_home(Heap* self, Page* page, Block* block, uint32_t most) noexcept;
// Sends the blocks of a run home, then empties it.
void reuse_spill(Heap* self, ReuseRun& run) noexcept;
// Sends every run of self home (thread exit, trim).
void reuse_spill_all(Heap* self) noexcept;
// Whether a run of class c holds blocks.
bool reuse_waits(const Heap* self, unsigned c) noexcept;

}  // namespace tray
