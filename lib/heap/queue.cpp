#include "heap/queue.hpp"

#include "heap/page.hpp"
#include "platform/platform.hpp"

namespace tray {

constinit Page g_empty_page;

// The page a class allocates from carries one extra count in `used` for as long as it is the
// queue's head, so freeing its last block never reaches zero and never leaves the fast path:
// a thread that allocates and frees one block in a loop does not hand its page back and forth.
void queue_changed(Heap* heap, unsigned c) {
  Page* head = heap->queues[c].head != nullptr ? heap->queues[c].head : &g_empty_page;
  Page* old = heap->direct[c];
  if (old == head) return;
  if (old != &g_empty_page) --old->used;
  if (head != &g_empty_page) {
    ++head->used;
    head->warm = true;
    if (head->retained) {  // back in use
      head->retained = false;
      heap->retained_bytes -= size_t(head->unit_count) * kUnitBytes;
    }
  }
  heap->direct[c] = head;
}

// Blocks of the page that are live or in the heap's remote list.
uint32_t live_blocks(const Heap* heap, const Page* page) {
  TRAY_ASSERT(!page->floating);  // queued pages only
  return page->used - (heap->direct[page->size_class] == page ? 1 : 0);
}

void queue_remove(Heap* heap, Page* page) {
  const unsigned c = page->size_class;
  PageQueue& q = heap->queues[c];
  if (page->prev != nullptr) page->prev->next = page->next;
  else q.head = page->next;
  if (page->next != nullptr) page->next->prev = page->prev;
  else q.tail = page->prev;
  page->next = page->prev = nullptr;
  queue_changed(heap, c);
}

void queue_push_front(Heap* heap, Page* page) {
  const unsigned c = page->size_class;
  PageQueue& q = heap->queues[c];
  page->prev = nullptr;
  page->next = q.head;
  if (q.head != nullptr) q.head->prev = page;
  else q.tail = page;
  q.head = page;
  queue_changed(heap, c);
}

void queue_push_back(Heap* heap, Page* page) {
  const unsigned c = page->size_class;
  PageQueue& q = heap->queues[c];
  page->next = nullptr;
  page->prev = q.tail;
  if (q.tail != nullptr) q.tail->next = page;
  else q.head = page;
  q.tail = page;
  queue_changed(heap, c);
}

void release_page(Heap* heap, Page* page) {
  queue_remove(heap, page);
  if (page->retained) {
    page->retained = false;
    heap->retained_bytes -= size_t(page->unit_count) * kUnitBytes;
  }
  page_release(page);
}

// A part's full pages are listed through the queue links they no longer use.
void page_float(Heap* heap, Page* page) {
  queue_remove(heap, page);
  page->used = 1;
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
  page->floating = false;
  page->used = page->reserved - 1;
  queue_push_back(heap, page);
}

}  // namespace tray
