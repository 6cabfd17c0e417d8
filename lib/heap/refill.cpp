#include "heap/refill.hpp"

#include <errno.h>

#include "events/events.hpp"
#include "heap/hardening.hpp"
#include "heap/page.hpp"
#include "heap/program.hpp"
#include "heap/remote.hpp"
#include "heap/reuse.hpp"
#include "heap/sparse.hpp"
#include "heap/heap.hpp"
#include "heap/queue.hpp"
#include "heap/sample_countdown.hpp"
#include "platform/platform.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

// Whether the page's free list holds less than kSlotRefillBytes of blocks (for a page with OS
// pages given back, that would take a walk: no).
bool few_free_blocks(const Heap* heap, const Page* page) {
  if (page->given_back) return false;
  const uint32_t out = page->used - (class_page(heap, page->size_class) == page ? 1 : 0);
  return size_t(page->capacity - out) * page->block_bytes < kSlotRefillBytes;
}


// The queue's first page with a block to give; it becomes the class's page. A full page it
// passes goes to the back of the queue the first time, and floats (leaves the queue until a
// free lands in it) the next: a class that cycles through a few pages (blocks allocated in a
// batch and freed together) finds them with blocks again, where floating and coming back cost
// a slow path on each side; a page that stays full is passed at most twice.
TRAY_INLINE Page* find_page(Heap* heap, unsigned c) {
  Page* first_sent_back = nullptr;
  for (Page* page = heap->queues[c].head; page != nullptr && page != first_sent_back;) {
    Page* next = page->next;
    if (page_can_extend(page) && (page->free == list_end() || few_free_blocks(heap, page)))
      page_extend(page);
    if (page->free == list_end()) sparse_refill(page);
    if (page->free != list_end()) {
      page->cycled = false;
      if (page != heap->queues[c].head) queue_move_to_front(heap, page);
      return page;
    }
    if (!page->cycled && next != nullptr) {
      page->cycled = true;
      queue_move_to_back(heap, page);
      if (first_sent_back == nullptr) first_sent_back = page;
    } else {
      page_float(heap, page);
    }
    page = next;
  }
  // Before taking a page: blocks held back for their owners may be what another heap needs
  // to avoid taking one too. Not on every slow path: in classes whose pages hold few blocks
  // that would send batches of two or three, one compare-and-swap each. So may whole pages
  // that owners which stopped taking their blocks in would not give back.
  remote_flush_and_reclaim(heap);
  heap_collect_parked_when_due();
  sparse_pass(heap, false);
  // The class grows: a moment when its live count is at a high. Every page of the class in
  // this heap was counted on the way here, and the slot's list was handed out whole.
  slot_count_load(heap, c, 0, 0);
  heap_sample_peak(c);
  if (TRAY_UNLIKELY(heap->kind == OwnerKind::kPart)) program_check_alive(heap);
  Page* page = page_acquire(heap, c);
  if (page != nullptr) queue_push_front(heap, page);
  return page;
}

// Where the sample countdown runs out within the `blocks` blocks from `first` (slot_install):
// the list is cut before the block at which it does, and the rest waits in sample_rest.
TRAY_NOINLINE void slot_install_cut(Heap* heap, unsigned c, Block* first, uint32_t blocks) {
  AllocSlot& slot = heap->slots[c];
  SlotBook& book = heap->books[c];
  const Page* page = slot.page;
  const int64_t block_bytes = page->block_bytes;
  // The blocks handed out before the one to sample.
  const uint32_t before = book.countdown > 0 ? uint32_t(book.countdown / block_bytes) : 0;
  Block* rest = first;
  slot.head = list_end();
  if (before != 0) {
    Block* last = first;
    for (uint32_t i = 1; i < before; ++i) last = link_load(page, last);
    rest = link_load(page, last);
    // Followed in full: a pop checks only what it hands out, and these are not handed out
    // past the cut until the sample point.
    if (!link_in_page(page, rest)) report_corrupted_list(page, rest, last);
    link_store(page, last, list_end());
    slot.head = first;
  }
  book.countdown -= int64_t(before) * block_bytes;
  book.sample_rest = rest;
  book.sample_rest_blocks = blocks - before;
}

// The blocks from `first` on (`blocks` of them, of class c's page) become its slot's list,
// charged to the class's sampling countdown a block's bytes each. Where the countdown runs
// out within them, the list is cut before the block at which it does: the rest waits in
// sample_rest, and the allocation that finds the slot dry then is the one sampled. With no
// sampler on, the countdown never runs out (INT64_MAX).
TRAY_INLINE void slot_install(Heap* heap, unsigned c, Block* first, uint32_t blocks) {
  SlotBook& book = heap->books[c];
  const int64_t bytes = int64_t(blocks) * heap->slots[c].page->block_bytes;
  if (TRAY_UNLIKELY(book.countdown < bytes)) return slot_install_cut(heap, c, first, blocks);
  book.countdown -= bytes;
  heap->slots[c].head = first;
}

// The free list of class c's page (which must hold blocks) into its dry slot: slot_take_page_list,
// inline where no OS page of the page was given back, and slot_install.
TRAY_INLINE void slot_load(Heap* heap, unsigned c, Page* page, size_t size) {
  uint32_t blocks;
  Block* list;
  if (TRAY_LIKELY(!page->given_back)) {
    // page_account, for the page that is the class's: its count out is `used` less one.
    if (!heap_counts_at_call(heap))
      counter_add(heap->counters.frees[c], page->accounted - (page->used - 1));
    page->accounted = page->used - 1;
    blocks = page->capacity + 1 - page->used;
    list = page->free;
    page->free = list_end();
    page->used += blocks;
    page->accounted += blocks;
    slot_count_load(heap, c, blocks, size);
  } else {
    list = slot_take_page_list(heap, c, size, &blocks);
  }
  slot_install(heap, c, list, blocks);
}

// The allocation at a sample point: the slot ran dry with blocks past the point waiting. The
// first of them is this allocation's block, unless a sampler whose interval ended places it;
// the rest go on into the slot (charged, and cut again where the next point falls) before the
// samplers run, which may allocate from this very slot.
TRAY_NOINLINE void* sample_point(Heap* heap, unsigned c, size_t size) {
  SlotBook& book = heap->books[c];
  Page* page = class_page(heap, c);
  Block* block = book.sample_rest;
  const uint32_t blocks = book.sample_rest_blocks;
  // A reuse run that waited behind the sample point is taken in at the next refill.
  book.sample_rest = reuse_waits(heap, c) ? reuse_mark() : nullptr;
  book.sample_rest_blocks = 0;
  Block* rest = link_load(page, block);
  if (blocks > 1 && !link_in_page(page, rest)) report_corrupted_list(page, rest, block);
  if (blocks > 1) slot_install(heap, c, rest, blocks - 1);
  // The request takes a block's bytes of the countdown, which the cut left under a block's.
  // Not below zero only when the options changed since the cut (the countdown was re-armed).
  book.countdown -= int64_t(page->block_bytes);
  const unsigned fired = book.countdown < 0 ? sample_take(heap, c) : 0;
  void* sampled = fired != 0 ? g_events.sampled_alloc(fired, size, page->block_bytes,
                                                      sample_class_alignment(c), false)
                             : nullptr;
  if (sampled == nullptr) {
    free_key_clear(block);
    return block;
  }
  // The block goes back unused, to be handed out next, charged like any block the slot takes
  // in: to the front of the slot's list, or where the countdown has no room for it, to the
  // front of the blocks past the next sample point. If an allocation the samplers made moved
  // the class to another page meanwhile, to its page like any free of its owner.
  if (class_page(heap, c) != page) {
    page_free_local(heap, page, block);
  } else if (!has_sample_rest(book) && book.countdown >= int64_t(page->block_bytes) &&
             heap->slots[c].limit == page->limit) {
    book.countdown -= int64_t(page->block_bytes);
    link_store(page, block, heap->slots[c].head);
    heap->slots[c].head = block;
  } else if (has_sample_rest(book) || heap->slots[c].limit == page->limit) {
    link_store(page, block, has_sample_rest(book) ? book.sample_rest : list_end());
    book.sample_rest = block;
    ++book.sample_rest_blocks;
  } else {  // the slot holds a reuse run, whose mark stays: the block goes back to its page
    page_free_local(heap, page, block);
  }
  return sampled;
}

// The slot's test failed on a head that is not the list's end: a link that decoded out of the
// page. The list is cut first: what the report allocates must not meet the broken link again.
TRAY_INLINE void check_slot(Heap* heap, unsigned c) {
  AllocSlot& slot = heap->slots[c];
  Block* head = slot.head;
  if (TRAY_UNLIKELY(head != list_end() && slot_list_page(slot) != &g_empty_page &&
                    reinterpret_cast<uintptr_t>(head) >= slot.limit)) {
    slot.head = list_end();
    report_corrupted_list(slot_list_page(slot), head, nullptr);
  }
}

// The slow path of a slot whose book holds reuse_mark(): the slot goes back to its page's list,
// and takes in the class's fullest reuse run if one waits (blocks of another heap's page that
// this thread freed, heap/reuse.hpp): the blocks the thread touched last, rather than its
// page's. The mark stays while the slot holds the run, so that its running dry comes back
// here. A run within which a sample point falls goes home instead. nullptr: no run taken, or
// a corrupted link in the slot (left for check_slot to report).
TRAY_NOINLINE void* reuse_refill(Heap* heap, unsigned c, size_t size) {
  AllocSlot& slot = heap->slots[c];
  SlotBook& book = heap->books[c];
  TRAY_ASSERT(slot.head == list_end());  // check_slot saw to that
  book.sample_rest = nullptr;
  slot.limit = slot.page->limit;
  slot.unkey = slot.page->link_unkey;
  // A class without a page: its queue ran empty since the runs were started (their blocks go
  // home), and a slot whose page is the shared empty one never holds a list.
  if (TRAY_UNLIKELY(slot.page == &g_empty_page)) {
    for (ReuseRun& run : heap->reuse[c])
      if (run.count != 0) reuse_spill(heap, run);
    return nullptr;
  }
  for (;;) {
    ReuseRun run = reuse_pick(heap, c);
    if (run.count == 0) return nullptr;
    Page* page = run.page;
    const int64_t bytes = int64_t(run.count) * page->block_bytes;
    if (TRAY_UNLIKELY(book.countdown < bytes)) {
      heap->reuse_bytes += size_t(bytes);  // reuse_pick took them off; the spill does again
      reuse_spill(heap, run);
      continue;
    }
    book.countdown -= bytes;
    slot_count_load(heap, c, run.count, size);
    counter_add(heap->counters.reused_blocks, run.count);
    slot.head = run.head;
    slot.limit = page->limit;
    slot.unkey = page->link_unkey;
    book.sample_rest = reuse_mark();
    return heap_pop(heap, c * kSlotIndexScale);
  }
}

// Fills class c's dry slot and pops from it: at a sample point, from blocks freed into the
// class's page, from another page of the queue, or from a new one.
TRAY_INLINE void* refill_loop(Heap* heap, unsigned c, size_t size) {
  for (;;) {
    check_slot(heap, c);
    if (Block* rest = heap->books[c].sample_rest; rest != nullptr) {
      if (rest != reuse_mark()) return sample_point(heap, c, size);
      if (void* p = reuse_refill(heap, c, size); p != nullptr) return p;
    }
    if (heap->remote_free.load(std::memory_order_relaxed) != nullptr) remote_drain(heap);
    Page* page = find_page(heap, c);
    if (page == nullptr) {
      errno = ENOMEM;
      return nullptr;
    }
    slot_load(heap, c, page, size);
    // Dry again only where the load's first block is a sample point.
    if (void* p = heap_pop(heap, c * kSlotIndexScale); TRAY_LIKELY(p != nullptr)) return p;
  }
}

// A big class's slot ran dry: a block every few allocations, each of hundreds of KiB. The
// heap serves a class it uses too seldom with large blocks (tails.cpp), and looks at the tails
// of its free blocks (at most every kSparsePassMs), as taking a page does for the others.
TRAY_NOINLINE void* refill_big(Heap* heap, unsigned c, size_t size) {
  if (heap->queues[c].head == nullptr && !sparse_big_wants_page(heap, c))
    return g_events.big_block_alloc(class_size(c));
  sparse_pass(heap, false);
  return refill_loop(heap, c, size);
}

TRAY_INLINE void* refill_pop(Heap* heap, unsigned c, size_t size) {
  if (TRAY_UNLIKELY(is_big_class(c))) return refill_big(heap, c, size);
  return refill_loop(heap, c, size);
}

// A malloc whose class's slot is dry, on a heap a thread owns: options changed since the heap
// last looked are picked up, and the purger started if it is wanted, before the refill.
TRAY_NOINLINE void* malloc_refill(Heap* heap, unsigned c, size_t size) {
  if (TRAY_UNLIKELY(heap->sampling.generation != g_sample_generation.load(std::memory_order_relaxed)))
    sample_refresh(heap);
  if (TRAY_UNLIKELY(purger_poll())) {
    // Starting it allocated, through this heap: the slot may hold blocks now.
    if (void* p = heap_pop(heap, c * kSlotIndexScale); p != nullptr) return p;
  }
  return refill_pop(heap, c, size);
}

// The thread's first allocation: a heap first.
TRAY_NOINLINE void* first_malloc_slow(unsigned size_class, size_t size) {
  Heap* heap = heap_attach_thread(HeapUse::kFastPaths);
  if (heap == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  return heap_malloc_slow(heap, size_class, size);
}

}  // namespace

// The common refill, in one frame and no call: the class's page has blocks freed into it
// since its slot took its list in, enough of them (kSlotRefillBytes, or the page carved to
// its end), and nothing else asks for a look (no sample point near, no options changed, no
// OS page given back). Where pages hold few blocks, or a thread frees what it allocated at
// once, this runs every few allocations. The heap is a thread's or a part's: such a heap
// counts its frees with its pages (page_account, here inline for the class's page, whose
// count out is `used` less the extra one).
void* heap_malloc_miss(Heap* heap, size_t slot_index, size_t size) noexcept {
  TRAY_ASSERT(!heap_counts_at_call(heap));
  AllocSlot& slot = slot_at(heap, slot_index);
  SlotBook& book = *reinterpret_cast<SlotBook*>(reinterpret_cast<uintptr_t>(heap->books) + slot_index * 8);
  Page* page = slot.page;
  // A free list's head lies below the page's limit unless the list is empty (list_end()); the
  // shared empty page has no list (nullptr) and a limit of 0.
  Block* block = page->free;
  if (TRAY_LIKELY(slot.head == list_end() && reinterpret_cast<uintptr_t>(block) < slot.limit &&
                  !page->given_back && book.sample_rest == nullptr &&
                  heap->sampling.generation == g_sample_generation.load(std::memory_order_relaxed))) {
    // Every carved block is out once the list moves: `used` becomes capacity + 1 (the extra
    // count), and the count out (what `accounted` holds) the capacity.
    const uint32_t capacity = page->capacity;
    const uint32_t blocks = capacity + 1 - page->used;
    const int64_t bytes = int64_t(blocks) * page->block_bytes;
    if (TRAY_LIKELY(book.countdown >= bytes &&
                    (bytes >= int64_t(kSlotRefillBytes) || capacity == page->reserved))) {
      book.countdown -= bytes;
      // Counters indexed by class, from the slot index (the class times kSlotIndexScale).
      auto counter = [&](uint64_t* first) -> uint64_t& {
        return *reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(first) +
                                            slot_index * (sizeof(uint64_t) / kSlotIndexScale));
      };
      counter_add(counter(heap->counters.frees), page->accounted - (capacity - blocks));
      counter_add(counter(heap->counters.allocations), book.loaded);
      counter_add(counter(heap->counters.requested_bytes), uint64_t(book.loaded) * book.request_bytes);
      book.loaded = blocks;
      book.request_bytes = uint32_t(size);
      page->free = list_end();
      page->used = capacity + 1;
      page->accounted = capacity;
      // The pop, of the head just tested against the limit.
      slot.head = link_decode_with(slot.unkey, block->next);
      free_key_clear(block);
      return block;
    }
  }
  return malloc_refill(heap, unsigned(slot_index / kSlotIndexScale), size);
}

// The purger starts here, where the heap is consistent and no lock is held, not in
// heap_refill_pop, which prof calls under its lock: the purger's start allocates.
void* heap_malloc_slow(Heap* heap, unsigned size_class, size_t size) noexcept {
  if (TRAY_UNLIKELY(heap == &g_empty_heap)) return first_malloc_slow(size_class, size);
  return malloc_refill(heap, size_class, size);
}

// The heap of no thread samples nothing: its countdowns are never armed. Its slot may hold
// blocks already (it allocates through here alone).
void* heap_refill_pop(Heap* heap, unsigned size_class) noexcept {
  void* p = heap_pop(heap, size_class * kSlotIndexScale);
  if (p == nullptr) p = refill_pop(heap, size_class, class_size(size_class));
  if (p != nullptr) heap_count_allocation(heap, size_class, class_size(size_class));
  return p;
}

}  // namespace tray
