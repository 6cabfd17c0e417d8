// Thread heaps. Each thread allocates from its own heap without locks or atomic
// read-modify-writes; a block freed by another thread goes onto its owner heap's remote
// stack (one compare-and-swap) and the owner takes the stack back whole on its slow path.
// A heap outlives its thread: at thread exit it is parked, and the next new thread adopts it,
// pages and pending remote frees included, so heap identity never changes under a remote free.
#pragma once

#include <cstddef>

#include "core/bits.hpp"
#include "size_classes.hpp"
#include "types.hpp"

namespace tray {

// The calling thread's heap; &g_empty_heap until its first allocation. Initial-exec TLS by
// default (-ftls-model, see TRAY_TLS_MODEL): one instruction to reach.
extern __thread Heap* tls_heap;
// A heap with no pages: every class points at an empty page, so the fast path of a thread
// that has no heap yet falls into the slow path without a test of its own.
extern constinit Heap g_empty_heap;

// Slow path of a small allocation for an attached heap: remote frees, then the class queue,
// then a new page. nullptr when out of memory.
void* heap_malloc_slow(Heap* heap, unsigned size_class) noexcept;
// A local free left the page empty, or landed in a full (floating) page.
void heap_page_event(Heap* heap, Page* page) noexcept;
// A free whose unit descriptor is not owned by this thread's heap: a block of another heap,
// a block beyond the first unit of a multi-unit page, or an invalid pointer.
// Takes only the block (finding its page again) so the fast path keeps no page pointer alive.
void heap_free_remote(Block* block) noexcept;

// Gives the calling thread a heap (a parked one if any); nullptr when out of memory.
Heap* heap_attach_thread();
// Parks the heap of an exiting thread after returning its empty pages.
void heap_detach_thread(Heap* heap);
// Returns empty pages: of the calling thread's heap, and of parked heaps. True if any.
bool heap_trim();
// fork(): the heaps lock, and in the child, heaps of threads that do not exist there.
void heap_lock_for_fork();
void heap_unlock_after_fork();

TRAY_INLINE void page_free_local(Heap* heap, Page* page, Block* block) noexcept {
  block->next = page->free;
  page->free = block;
  // Zero means empty, or the first block back in a full page (see Page::used). The page a
  // class allocates from never gets here for being empty (see queue_changed).
  if (TRAY_UNLIKELY(--page->used == 0)) heap_page_event(heap, page);
}

TRAY_INLINE void* heap_alloc_class(size_t size_class) noexcept {
  Heap* heap = tls_heap;
  Page* page = heap->direct[size_class];
  Block* block = page->free;
  if (TRAY_LIKELY(block != nullptr)) {
    page->free = block->next;
    ++page->used;
    return block;
  }
  return heap_malloc_slow(heap, unsigned(size_class));
}

TRAY_INLINE void* heap_alloc_small(size_t size) noexcept { return heap_alloc_class(size_class_of(size)); }

TRAY_INLINE void heap_free_small(Page* page, void* p) noexcept {
  auto* block = static_cast<Block*>(p);
  Heap* heap = tls_heap;
  if (TRAY_LIKELY(page->heap == heap)) {
    page_free_local(heap, page, block);
    return;
  }
  heap_free_remote(block);
}

}  // namespace tray
