// Sparse pages: pages that keep a few live blocks long after their class went out of use
// (blocks of an old phase die at random, so nearly every page keeps one). The page cannot go
// back to the pool, but the OS pages inside it that hold only free blocks can go back to the
// OS. Their blocks leave the free list (an OS page given back reads as zero, links included),
// and the segment header records which OS pages are out, so that the blocks come back when
// the page is needed again. Only the owner heap's thread does either, from its slow paths.
#pragma once

#include "heap/types.hpp"
#include "segment/segment.hpp"

namespace tray {

// Gives back the free OS pages of the heap's sparse pages that nothing allocated from since
// the previous pass; at most one pass per kSparsePassMs unless `force` (trim, which takes
// every page, the one allocated from included). True if anything went back.
bool sparse_pass(Heap* heap, bool force);
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
