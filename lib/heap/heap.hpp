// Thread heaps. Each thread allocates from its own heap without locks or atomic
// read-modify-writes; a block freed by another thread goes home in a batch onto its owner
// heap's remote stack (remote.hpp) and the owner takes the stack back whole on its slow path.
// A heap outlives its thread: at thread exit it is parked, and the next new thread adopts it,
// pages and pending remote frees included, so heap identity never changes under a remote free.
#pragma once

#include <cstddef>

#include "core/core.hpp"
#include "heap/config.hpp"
#include "heap/hardening.hpp"
#include "heap/page.hpp"
#include "heap/program.hpp"
#include "heap/remote.hpp"
#include "heap/sample_countdown.hpp"
#include "heap/sparse.hpp"
#include "heap/types.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "stats/stats.hpp"

namespace tray {

// The heap the fast paths use: the calling thread's heap, or &g_empty_heap until its first
// allocation, and for good when its heap is a checked one (HeapUse::kChecked), so that every
// call there takes a slow path that checks it. Initial-exec TLS by default (-ftls-model, see TRAY_TLS_MODEL): one instruction.
extern __thread Heap* tls_heap;
// The heap the calling thread owns (nullptr before its first allocation), in every mode.
extern __thread Heap* tls_own_heap;
// A heap with no pages: every class points at an empty page, so the fast path of a thread
// that has no heap yet falls into the slow path without a test of its own.
extern constinit Heap g_empty_heap;

// Slow path of a small allocation: remote frees, then the class queue, then a new page; for
// &g_empty_heap, the thread's first allocation (size is what the caller asked for).
// nullptr when out of memory.
void* heap_malloc_slow(Heap* heap, unsigned size_class, size_t size) noexcept;
// The slow path after sampling: remote frees, then the class queue, then a new page. Also how
// a heap that no thread owns (prof.cpp's) allocates, under its user's lock.
void* heap_refill_pop(Heap* heap, unsigned size_class) noexcept;
// A local free left the page empty, or landed in a full (floating) page.
void heap_page_event(Heap* heap, Page* page) noexcept;
// A free of a block of `page` (a page with an owner) that the fast path could not do: a block
// of another heap, or of the calling thread's before it has a heap.
void heap_free_remote(Page* page, Block* block) noexcept;
// Counts a free of a block of `page` by the thread whose heap is `self` (&g_empty_heap for a
// thread without one). Separate from heap_free_block: debug mode counts at the program's
// free, and gives the block back only when it leaves quarantine.
void heap_count_free(Heap* self, const Page* page) noexcept;
// Gives a block of a live page back on behalf of `self` (the calling thread's own heap, or
// &g_empty_heap): locally if self owns the page, else to the owner heap.
void heap_free_block(Heap* self, Page* page, Block* block) noexcept;

// A heap for a part of a program heap (program.hpp), checked in debug mode; nullptr when out
// of memory.
Heap* heap_create_part(bool checked);
// A heap of no thread (in the list of heaps, so the statistics count it), allocated from under
// a lock of its user's (heap_refill_pop); nullptr when out of memory. A free of one of its
// blocks, by any thread, goes to `free_block`, which takes that lock. One per process: the
// heap profile's (sample/prof.cpp).
Heap* heap_create_locked(void (*free_block)(Block*));
// For a thread that is busy with large blocks and may not need a page for a long time: sends
// the blocks it freed into other heaps, and takes in those freed into its own, so that pages
// emptied by other threads go back to the pool.
void heap_exchange_remote() noexcept;
// What a thread's heap is for, chosen by the layer above at the thread's first request:
// kFastPaths makes it tls_heap; kChecked (debug mode) leaves tls_heap at &g_empty_heap, so that
// every request and free takes the slow path to the checks, and makes the heap a checked one
// (Heap::checked). Every thread of a process asks for the same.
enum class HeapUse : uint8_t { kFastPaths, kChecked };
// Gives the calling thread a heap (a parked one if any); nullptr when out of memory.
Heap* heap_attach_thread(HeapUse use);
// Adds the heaps' live-block counts of the class up and raises its recorded peak.
void heap_sample_peak(unsigned size_class);
// Every heap ever created, newest first (never unlinked: safe to walk from a signal handler).
const Heap* heap_list();
// Parks the heap of an exiting thread after returning its empty pages.
void heap_detach_thread(Heap* heap);
// Whether any thread of the program (the purger aside) holds a heap now.
bool heap_threads_attached();
// Returns empty pages: of the calling thread's heap, and of parked heaps. True if any.
bool heap_trim();
// The idle purger's look at parked heaps: gives back their empty pages once due, and says
// when the next ones will be (kNeverMs: none waiting).
uint64_t heap_collect_idle();
// fork() (api/process.cpp): the heaps' locks, and in the child, heaps of threads that do not
// exist there.
void heap_lock_for_fork();
void heap_unlock_after_fork();

// The requested bytes were counted by the class's sampling countdown (heap_pop).
TRAY_INLINE void count_allocation(Heap* heap, size_t size_class) {
#if TRAY_STATS_COUNTERS
  counter_add(heap->counters.allocations[size_class], 1);
#else
  (void)heap, (void)size_class;
#endif
}

TRAY_INLINE void count_free(Heap* heap, const Page* page) {
#if TRAY_STATS_COUNTERS
  counter_add(heap->counters.frees[page->size_class], 1);
#else
  (void)heap, (void)page;
#endif
}

TRAY_INLINE void page_free_local(Heap* heap, Page* page, Block* block) noexcept {
  link_store(page, block, page->free);
  page->free = block;
  // Zero means empty, or the first block back in a full page (see Page::used). The page a
  // class allocates from never gets here for being empty (see queue_changed).
  if (TRAY_UNLIKELY(--page->used == 0)) heap_page_event(heap, page);
}

TRAY_INLINE void* page_pop(Heap* heap, Page* page, size_t size_class) noexcept {
  Block* block = page->free;
  TRAY_IN_REG(block, "a");
  // Checked by the next pop, whose test against the page's limit it must pass.
  page->free = link_load(page, block);
  free_key_clear(block);
  ++page->used;
  count_allocation(heap, size_class);
  return block;
}

// Pops a block of class size_class from the heap's current page; nullptr when that page has
// none ready (or the heap is &g_empty_heap, or the page's list is corrupted), or when this
// request is the one to sample (the sample countdown runs out): the caller's slow path sorts
// them out.
TRAY_INLINE void* heap_pop(Heap* heap, size_t size_class, size_t size) noexcept {
  Page* page = heap->direct[size_class];
  // The page, the countdown and the counter each index from the heap and the class on their
  // own, rather than through one `lea` of a shared base (see TRAY_OPAQUE).
  TRAY_OPAQUE(size_class);
  // The list's end and a link that decoded out of the page both lie at or past its limit
  // (hardening.hpp), and the shared empty page's limit is 0: one test for all three.
  if (TRAY_UNLIKELY(reinterpret_cast<uintptr_t>(page->free) >= page->limit)) return nullptr;
  if (TRAY_UNLIKELY(countdown_sub(heap->sample_countdown[size_class], int64_t(size)) < 0))
    return nullptr;
  TRAY_OPAQUE(size_class);
  return page_pop(heap, page, size_class);
}

// A block of class size_class from `heap`, for a request of `size` bytes; nullptr when out of
// memory.
TRAY_INLINE void* heap_alloc_from(Heap* heap, size_t size_class, size_t size) noexcept {
  void* p = heap_pop(heap, size_class, size);
  if (TRAY_LIKELY(p != nullptr)) return p;
  return heap_malloc_slow(heap, unsigned(size_class), size);
}

TRAY_INLINE void* heap_alloc_class(size_t size_class, size_t size) noexcept {
  return heap_alloc_from(tls_heap, size_class, size);
}

// The class for size <= kMaxSmallBytes, small sizes through the heap's copy of the table.
TRAY_INLINE size_t heap_class_of(const Heap* heap, size_t size) noexcept {
  if (TRAY_LIKELY(size <= kLookupLimitBytes)) return heap->class_of_size[size];
  return size_class_coarse(size);
}

TRAY_INLINE void* heap_alloc_small(size_t size) noexcept {
  Heap* heap = tls_heap;
  return heap_alloc_from(heap, heap_class_of(heap, size), size);
}

// Frees p into `page` if `heap` (tls_heap) owns it; false (nothing done) otherwise, and when
// the checks fail (hardening.hpp): the slow path, which runs them again, reports.
TRAY_INLINE bool heap_free_own(Heap* heap, Page* page, void* p) noexcept {
  if (TRAY_LIKELY(page->heap == heap && free_key_passes(page, static_cast<Block*>(p)))) {
    free_key_set(page, static_cast<Block*>(p));
    count_free(heap, page);
    page_free_local(heap, page, static_cast<Block*>(p));
    return true;
  }
  return false;
}

}  // namespace tray
