// Sparse pages: pages that keep a few live blocks long after their class went out of use
// (blocks of an old phase die at random, so nearly every page keeps one). The page cannot go
// back to the pool, but the OS pages inside it that hold only free blocks can go back to the
// OS. Their blocks leave the free list (an OS page given back reads as zero, links included),
// and the segment header records which OS pages are out, so that the blocks come back when
// the page is needed again. Only the owner heap's thread does either, from its slow paths.
// The big classes' pages keep their free blocks on the list and give back each one's OS pages
// past the first instead (tails.cpp), in the same passes.
#pragma once

#include "heap/types.hpp"
#include "segment/segment.hpp"

namespace tray {

// Gives back the free OS pages of the heap's sparse pages that nothing allocated from since
// the previous pass; at most one pass per kSparsePassMs unless `force` (trim, which takes
// every page, the one allocated from included). True if anything went back.
bool sparse_pass(Heap* heap, bool force);
// The big classes' free blocks give back their OS pages past the first, their tails, while
// they stay on their page's free list (tails.cpp); sparse_pass looks at them too.
//
// Gives back the tails of every free block of the heap's big classes: for a heap its thread
// left, whose blocks may wait for a long time.
bool sparse_give_back_big(Heap* heap);
// The owner freed more big blocks than the heap keeps the tails of (Heap::big_free_room): a pass
// over the big classes now, which gives back what is due and the oldest past the budget.
bool sparse_big_over_budget(Heap* heap);
// Whether the heap, which has no page of big class c, takes one (true) or serves the request
// with a large block: a page once the class asked for kBigPageAfterBlocks blocks within the
// purge delay.
bool sparse_big_wants_page(Heap* heap, unsigned c);
// A page of a big class emptied (heap_page_event): kept as the class's empty page, if it has
// none, else given to the pool.
void sparse_big_page_emptied(Heap* heap, Page* page);
// A free of a block of a big class by the heap's own thread: it counts against the room.
TRAY_INLINE void sparse_big_freed(Heap* heap, const Page* page) {
  heap->big_free_room -= int64_t(page->block_bytes);
  // Near the memory limit, what is freed goes back at once (stats/limit.hpp).
  if (TRAY_UNLIKELY(heap->big_free_room < 0 || limit_pressed())) sparse_big_over_budget(heap);
}
// Whether a page of the heap's big classes holds free blocks (whose tails may be in memory).
bool sparse_big_free_held(const Heap* heap);
// The free list of a page of a big class goes to its class's slot, whose blocks the program
// may write whole: their tails count as in memory again (nothing is recorded as given back).
void sparse_list_taken(Page* page);
// Puts the blocks of the page's given-back OS pages back on its free list; false if it had
// none. The page's owner, when the page has no other block to give. Nearly every page never
// gave an OS page back, and says so without a call.
bool sparse_refill_given_back(Page* page);
TRAY_INLINE bool sparse_refill(Page* page) {
  return page->given_back && sparse_refill_given_back(page);
}
// The page goes back to the pool: nothing of it is recorded as given back any more. Stops the
// program first if a given-back OS page was written since: a block on it was freed twice (its
// key, which free checks, went with the OS page), and made the page look empty with a block
// live.
void sparse_forget(Page* page);

}  // namespace tray
