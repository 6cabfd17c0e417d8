#include "heap/queue.hpp"

#include "heap/hardening.hpp"
#include "heap/page.hpp"
#include "heap/reuse.hpp"
#include "heap/sparse.hpp"
#include "platform/platform.hpp"
#include "stats/stats.hpp"

namespace tray {

constinit Page g_empty_page;

namespace {

// The length of a list of page's blocks from `first` to list_end(), and its last block,
// every link checked in full as slow paths check them (hardening.hpp).
uint32_t walk_list(const Page* page, Block* first, Block** last) {
  uint32_t blocks = 0;
  const Block* holder = nullptr;
  for (Block* block = first; block != list_end(); block = link_load(page, block)) {
    if (!link_in_page(page, block) || ++blocks > page->capacity)
      report_corrupted_list(page, block, holder);
    holder = *last = block;
  }
  return blocks;
}

// A list's length as heap_uncounted may read it: the walk ends at the first link that is not
// a block of the page, and after as many steps as the page has blocks. A list of another
// heap's page (a reuse run) is checked with what that page's owner never changes while blocks
// are out: every block on it was freed, and carries its key.
uint32_t peek_length(const Page* page, const Block* first, bool foreign) {
  uint32_t blocks = 0;
  for (const Block* block = first; block != list_end() && blocks < page->reserved;
       block = link_load(page, block)) {
    if (foreign ? !is_free_block(page, const_cast<Block*>(block)) : !link_in_page(page, block)) break;
    ++blocks;
  }
  return blocks;
}

// Puts first..last (`blocks` blocks of page) in front of the page's free list.
void splice_onto_page(Page* page, Block* first, Block* last, uint32_t blocks) {
  link_store(page, last, page->free);
  page->free = first;
  page->used -= blocks;
  page->accounted -= blocks;
}

// Blocks of the page out of its free list: live, on their way back, or in the class's slot
// (a floating page: every block carved).
uint32_t page_out(const Heap* heap, const Page* page) {
  if (page->floating) return page->capacity;
  return page->used - (class_page(heap, page->size_class) == page ? 1 : 0);
}

}  // namespace

void page_account(Heap* heap, Page* page) {
  const uint32_t out = page_out(heap, page);
  if (!heap_counts_at_call(heap)) {
    // The count only falls between two looks: every rise (a slot taking blocks in) and every
    // fall that is not the owner's free (a drain, a sparse pass) moves `accounted` with it.
    TRAY_ASSERT(page->accounted >= out);
    counter_add(heap->counters.frees[page->size_class], page->accounted - out);
  }
  page->accounted = out;
}

Block* slot_take_page_list(Heap* heap, unsigned c, size_t size, uint32_t* blocks) {
  Page* page = class_page(heap, c);
  TRAY_ASSERT(page != &g_empty_page && page->free != list_end() && !page->floating);
  TRAY_ASSERT(heap->slots[c].head == list_end() && !has_sample_rest(heap->books[c]));
  page_account(heap, page);
  // The page's free list holds every carved block not out and not given back; with none given
  // back, that is a count, not a walk. A big class's blocks stay on the list when their tails
  // go back, and come back with it.
  Block* last = nullptr;
  const bool big = is_big_class(c);
  const uint32_t count = page->given_back && !big ? walk_list(page, page->free, &last)
                                                  : page->capacity + 1 - page->used;
  if (big && page->given_back) sparse_list_taken(page);
  Block* list = page->free;
  page->free = list_end();
  page->used += count;
  page->accounted += count;
  slot_count_load(heap, c, count, size);
  *blocks = count;
  return list;
}

namespace {

// slot_return of a list of another heap's page (a reuse run the slot took in): home, as the run
// would have gone (a page change, a sparse pass or settling a heap that parks finds it
// there); the slot points at its page's list again.
TRAY_NOINLINE void slot_return_reused(Heap* heap, unsigned c) {
  AllocSlot& slot = heap->slots[c];
  Page* page = slot_list_page(slot);
  const uint32_t blocks = reuse_send_home(heap, page, slot.head, page->reserved);
  if (blocks != 0) {
    int64_t& countdown = heap->books[c].countdown;
    const int64_t bytes = int64_t(blocks) * page->block_bytes;
    countdown = countdown < INT64_MAX - bytes ? countdown + bytes : INT64_MAX;
    TRAY_ASSERT(blocks <= heap->books[c].loaded);
    heap->books[c].loaded -= blocks;
  }
  slot.head = list_end();
  slot.limit = slot.page->limit;
  slot.unkey = slot.page->link_unkey;
  slot_count_load(heap, c, 0, 0);
}

}  // namespace

void slot_return(Heap* heap, unsigned c) {
  AllocSlot& slot = heap->slots[c];
  Page* page = slot.page;
  if (TRAY_UNLIKELY(slot.limit != page->limit)) return slot_return_reused(heap, c);
  if (page == &g_empty_page) return;
  uint32_t returned = 0;
  if (slot.head != list_end()) {
    Block* last = nullptr;
    const uint32_t blocks = walk_list(page, slot.head, &last);
    splice_onto_page(page, slot.head, last, blocks);
    slot.head = list_end();
    returned += blocks;
    // The sampling countdown was charged for them (slot_load): they were never handed out.
    // Not past INT64_MAX, where re-arming put it meanwhile.
    int64_t& countdown = heap->books[c].countdown;
    const int64_t bytes = int64_t(blocks) * page->block_bytes;
    countdown = countdown < INT64_MAX - bytes ? countdown + bytes : INT64_MAX;
  }
  if (Block* rest = heap->books[c].sample_rest; has_sample_rest(heap->books[c])) {
    Block* last = nullptr;
    const uint32_t blocks = walk_list(page, rest, &last);
    splice_onto_page(page, rest, last, blocks);
    heap->books[c].sample_rest = nullptr;
    heap->books[c].sample_rest_blocks = 0;
    returned += blocks;
  }
  if (heap_counts_at_call(heap)) return;  // its allocations were counted one by one
  TRAY_ASSERT(returned <= heap->books[c].loaded);
  heap->books[c].loaded -= returned;
  slot_count_load(heap, c, 0, 0);
}

void heap_set_owner_thread(Heap* heap, uintptr_t thread) {
  heap->owner_thread = thread;
  for (unsigned c = 0; c < kSizeClassCount; ++c)
    for (Page* page = heap->queues[c].head; page != nullptr; page = page->next)
      page_set_owner_thread(page, thread);
}

void heap_settle(Heap* heap) {
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    slot_return(heap, c);
    for (Page* page = heap->queues[c].head; page != nullptr; page = page->next)
      page_account(heap, page);
  }
}

void heap_uncounted(const Heap* heap, Uncounted* out) {
  const bool counts_at_call = heap_counts_at_call(heap);
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    const AllocSlot& slot = heap->slots[c];
    const Page* head = slot.page;
    const Page* list_page = slot_list_page(slot);
    if (list_page == &g_empty_page || counts_at_call) continue;
    const uint32_t held = peek_length(list_page, slot.head, list_page != head) +
                          heap->books[c].sample_rest_blocks;
    const uint32_t loaded = heap->books[c].loaded;
    const uint64_t handed_out = loaded > held ? loaded - held : 0;
    out->allocations[c] += handed_out;
    out->requested_bytes[c] += handed_out * heap->books[c].request_bytes;
    // Bounded: a queue that the interrupted thread is rebuilding must not lead this walk on
    // for ever.
    uint32_t steps = 0;
    for (const Page* page = heap->queues[c].head; page != nullptr && steps < (1u << 20);
         page = page->next, ++steps) {
      const uint32_t out_now = page->used - (page == head ? 1 : 0);
      if (!page->floating && page->accounted > out_now) out->frees[c] += page->accounted - out_now;
    }
  }
}

// The page a class allocates from carries one extra count in `used` for as long as it is the
// queue's head, so freeing its last block never reaches zero and never leaves the fast path:
// a thread that allocates and frees one block in a loop does not hand its page back and forth.
// The slot of a new head starts dry: the next allocation takes the page's free list in.
void queue_changed(Heap* heap, unsigned c) {
  Page* head = heap->queues[c].head != nullptr ? heap->queues[c].head : &g_empty_page;
  AllocSlot& slot = heap->slots[c];
  Page* old = slot.page;
  if (old == head) return;
  if (old != &g_empty_page) {
    // Nearly always dry by now (a page is changed when its blocks ran out): the list it took in
    // last was handed out whole.
    if (TRAY_LIKELY(slot.head == list_end() && heap->books[c].sample_rest == nullptr))
      slot_count_load(heap, c, 0, 0);
    else
      slot_return(heap, c);
    --old->used;
  }
  if (head != &g_empty_page) {
    ++head->used;
    head->warm = true;
    if (head->retained) {  // back in use
      head->retained = false;
      heap->retained_bytes -= size_t(head->unit_count) * kUnitBytes;
    }
  }
  slot.page = head;
  slot.head = list_end();
  slot.limit = head->limit;
  slot.unkey = head->link_unkey;
}

// Blocks of the page that are live, in the heap's remote list, or in its class's slot.
uint32_t live_blocks(const Heap* heap, const Page* page) {
  TRAY_ASSERT(!page->floating);  // queued pages only
  return page->used - (class_page(heap, page->size_class) == page ? 1 : 0);
}

void queue_remove(Heap* heap, Page* page) {
  queue_unlink(heap->queues[page->size_class], page);
  queue_changed(heap, page->size_class);
}

void queue_push_front(Heap* heap, Page* page) {
  queue_link_front(heap->queues[page->size_class], page);
  queue_changed(heap, page->size_class);
}

void queue_push_back(Heap* heap, Page* page) {
  queue_link_back(heap->queues[page->size_class], page);
  queue_changed(heap, page->size_class);
}

void release_page(Heap* heap, Page* page) {
  if (is_big_class(page->size_class) && heap->big_empty[page->size_class - kFirstBigClass] == page)
    heap->big_empty[page->size_class - kFirstBigClass] = nullptr;
  queue_remove(heap, page);
  page_account(heap, page);
  if (page->retained) {
    page->retained = false;
    heap->retained_bytes -= size_t(page->unit_count) * kUnitBytes;
  }
  page_release(page);
}

// A part's full pages are listed through the queue links they no longer use.
void page_float(Heap* heap, Page* page) {
  queue_remove(heap, page);
  page_account(heap, page);
  page->used = 1;
  // The first block back comes through a slow path, which brings the page back (heap_page_event):
  // so no thread's fast path needs it, and a heap's pages that no queue lists carry no thread.
  page_set_owner_thread(page, 0);
  if (heap->kind == OwnerKind::kPart) {
    page->next = heap->full_pages;
    if (page->next != nullptr) page->next->prev = page;
    heap->full_pages = page;
  }
  __atomic_store_n(&page->floating, true, __ATOMIC_RELEASE);
}

void page_unfloat(Heap* heap, Page* page) {
  if (heap->kind == OwnerKind::kPart) {
    if (page->prev != nullptr) page->prev->next = page->next;
    else heap->full_pages = page->next;
    if (page->next != nullptr) page->next->prev = page->prev;
    page->next = page->prev = nullptr;
  }
  // Relaxed, atomic: a taker looking at this heap's stack may read `floating` now
  // (page_all_in_hand); it cannot hold every block, this free's is not in its hand.
  __atomic_store_n(&page->floating, false, __ATOMIC_RELAXED);
  // Every block it carved was out (a big class's page may float before it is carved whole,
  // when the memory limit refused its next block: page_extend).
  page->used = page->capacity - 1;
  page_set_owner_thread(page, heap->owner_thread);
  queue_push_back(heap, page);
}

}  // namespace tray
