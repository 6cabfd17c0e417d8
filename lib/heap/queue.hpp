// A heap's page queues and slots: which page each class allocates from, the blocks its slot
// holds ready, and the pages it keeps; and the counting of frees into them. Only the heap's
// owner touches them (its thread; a parked heap's collector; a program heap's resetter, while
// no thread allocates into it).
#pragma once

#include "heap/types.hpp"
#include "segment/segment.hpp"
#include "stats/stats.hpp"

namespace tray {

// Shared by every empty queue; never written: it has no free block, so a fast-path
// allocation that reaches it falls through to the slow path.
extern TRAY_HIDDEN constinit Page g_empty_page;

// The page class c allocates from (its queue's head), or &g_empty_page.
TRAY_INLINE Page* class_page(const Heap* heap, unsigned c) { return heap->slots[c].page; }

// The page whose blocks the slot's list holds: the class's page, or the page of another heap
// whose blocks the thread freed and took in for itself (a reuse run, remote.cpp), which the
// slot's limit names: a page's limit is the end of its last block.
TRAY_INLINE Page* slot_list_page(const AllocSlot& slot) {
  if (TRAY_LIKELY(slot.limit == slot.page->limit)) return slot.page;
  return unit_page_of(reinterpret_cast<void*>(slot.limit - 1));
}

// Points class c's slot at the queue's head, moving the head's extra count (see queue.cpp);
// the blocks the slot held go back to the page they came from.
void queue_changed(Heap* heap, unsigned c);
// Blocks of a queued page that are live, in the heap's remote list or in its class's slot.
uint32_t live_blocks(const Heap* heap, const Page* page);
void queue_remove(Heap* heap, Page* page);
void queue_push_front(Heap* heap, Page* page);
void queue_push_back(Heap* heap, Page* page);

TRAY_INLINE void queue_unlink(PageQueue& q, Page* page) {
  if (page->prev != nullptr) page->prev->next = page->next;
  else q.head = page->next;
  if (page->next != nullptr) page->next->prev = page->prev;
  else q.tail = page->prev;
  page->next = page->prev = nullptr;
}
TRAY_INLINE void queue_link_front(PageQueue& q, Page* page) {
  page->prev = nullptr;
  page->next = q.head;
  if (q.head != nullptr) q.head->prev = page;
  else q.tail = page;
  q.head = page;
}
TRAY_INLINE void queue_link_back(PageQueue& q, Page* page) {
  page->next = nullptr;
  page->prev = q.tail;
  if (q.tail != nullptr) q.tail->next = page;
  else q.head = page;
  q.tail = page;
}
// A queued page moves to its queue's front (it becomes the class's page) or back: inline, as
// they run on every page change.
TRAY_INLINE void queue_move_to_front(Heap* heap, Page* page) {
  PageQueue& q = heap->queues[page->size_class];
  queue_unlink(q, page);
  queue_link_front(q, page);
  queue_changed(heap, page->size_class);
}
TRAY_INLINE void queue_move_to_back(Heap* heap, Page* page) {
  PageQueue& q = heap->queues[page->size_class];
  queue_unlink(q, page);
  queue_link_back(q, page);
  queue_changed(heap, page->size_class);
}
// Takes an empty page out of its queue and gives it to the pool.
void release_page(Heap* heap, Page* page);
// A full page leaves its queue (floating, with a count of 1: the next free brings it back);
// a part also lists it, for a reset to find.
void page_float(Heap* heap, Page* page);
// The first free into a floating page: back at the end of its queue, with its true count.
void page_unfloat(Heap* heap, Page* page);

// The thread whose fast paths may free into the page (Page::owner_thread). Read by every free
// while the owner's slow paths or a binding write it: relaxed atomics where ThreadSanitizer
// must see them as such, plain loads and stores otherwise (the same instructions).
TRAY_INLINE uintptr_t page_owner_thread(const Page* page) {
#if defined(TRAY_TSAN)
  return __atomic_load_n(&page->owner_thread, __ATOMIC_RELAXED);
#else
  return page->owner_thread;
#endif
}
// A big class's page carries none: its owner's frees take the slow path, where they count
// against what the heap keeps of free big blocks (heap/tails.cpp).
TRAY_INLINE void page_set_owner_thread(Page* page, uintptr_t thread) {
  if (is_big_class(page->size_class)) thread = 0;
  __atomic_store_n(&page->owner_thread, thread, __ATOMIC_RELAXED);
}
// The heap gets the thread whose fast paths use it from now on (0: none), and so does every
// page in its queues (floating ones carry 0 until a block comes back).
void heap_set_owner_thread(Heap* heap, uintptr_t thread);

// Counts the frees the page's owner made into it since the page was last counted: its count
// of blocks out fell by that many (Page::accounted). A heap whose frees are counted when they
// are made (heap_counts_at_call) only keeps the count up to date.
void page_account(Heap* heap, Page* page);
// Takes the free list of class c's page, which must hold blocks, for the class's slot, which
// must be dry: counted as allocations, with a request of `size` bytes standing for them in
// the requested bytes. Returns the list and its length (the caller installs it).
Block* slot_take_page_list(Heap* heap, unsigned c, size_t size, uint32_t* blocks);
// The blocks class c's slot holds (and those past a sample point) go back onto the free list
// of its page, which stays the class's page; those of the list it handed out are counted.
void slot_return(Heap* heap, unsigned c);
// The heaps whose allocations and frees are counted when they are made, not a slot's list or a
// page at a time: debug mode's checked heaps (a free is counted at the program's call, the
// block given back later from quarantine) and the heap profile's, whose blocks come and go
// under the profile's lock (no thread owns it, so a dump could not look at its slots).
TRAY_INLINE bool heap_counts_at_call(const Heap* heap) { return heap->counts_at_call; }
TRAY_INLINE void heap_set_checked(Heap* heap, bool checked) {
  heap->checked = checked;
  heap->counts_at_call = checked || heap->kind == OwnerKind::kLocked;
}

// The slot of class c takes in a list of `blocks` for a request of `size` bytes: the list
// before it was handed out whole, and is counted now, as allocations and requested bytes.
TRAY_INLINE void slot_count_load(Heap* heap, unsigned c, uint32_t blocks, size_t size) {
  if (TRAY_UNLIKELY(heap_counts_at_call(heap))) return;
  const uint32_t handed_out = heap->books[c].loaded;
  counter_add(heap->counters.allocations[c], handed_out);
  counter_add(heap->counters.requested_bytes[c], uint64_t(handed_out) * heap->books[c].request_bytes);
  heap->books[c].loaded = blocks;
  heap->books[c].request_bytes = uint32_t(size);
}
// slot_return for every class, and page_account for every queued page: what a heap does
// before it is parked, so that its counts are exact while no thread owns it.
void heap_settle(Heap* heap);

// What the counters of a heap that the calling thread owns (its own, or a part bound to it)
// do not hold yet, per class: the blocks its slot handed out of the list it holds, with their
// requested bytes, and the frees into its pages not counted yet.
struct Uncounted {
  uint64_t allocations[kSizeClassCount] = {};
  uint64_t requested_bytes[kSizeClassCount] = {};
  uint64_t frees[kSizeClassCount] = {};
};
// Adds the heap's to `out`, read without writing anything: safe in a signal handler that
// interrupted the heap's own slow path (the walks are bounded and checked).
void heap_uncounted(const Heap* heap, Uncounted* out);


}  // namespace tray
