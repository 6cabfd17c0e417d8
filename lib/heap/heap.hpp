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
#include "heap/queue.hpp"
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
extern TRAY_HIDDEN constinit Heap g_empty_heap;

// Slow path of a small allocation: remote frees, then the class queue, then a new page; for
// &g_empty_heap, the thread's first allocation (size is what the caller asked for).
// nullptr when out of memory.
void* heap_malloc_slow(Heap* heap, unsigned size_class, size_t size) noexcept;
// malloc's pop from the slot at slot_index of `heap` (the thread's own, not &g_empty_heap)
// failed: the slot is dry, at a sample point, or its list corrupted. Refills it, from the
// class's page where it can, else as heap_malloc_slow does.
void* heap_malloc_miss(Heap* heap, size_t slot_index, size_t size) noexcept;
// Refills the class's slot and pops: a sample point, remote frees, the class queue, a new
// page. Also how a heap that no thread owns (prof.cpp's) allocates, under its user's lock.
void* heap_refill_pop(Heap* heap, unsigned size_class) noexcept;
// A local free left the page empty, or landed in a full (floating) page.
void heap_page_event(Heap* heap, Page* page) noexcept;
// A free of a block of `page` (a page with an owner) that the fast path could not do: a block
// of another heap, or of the calling thread's before it has a heap.
void heap_free_remote(Page* page, Block* block) noexcept;
// free() of a block of `self`'s own page (self is the calling thread's heap) that the fast
// path left: the page floats, or the checks refused the free (reported here).
void heap_free_home(Heap* self, Page* page, Block* block) noexcept;
// Counts an allocation of `size` bytes from class size_class of a heap that counts them at the
// call (heap_counts_at_call: debug mode's, the heap profile's).
TRAY_INLINE void heap_count_allocation(Heap* heap, unsigned size_class, size_t size) {
  counter_add(heap->counters.allocations[size_class], 1);
  counter_add(heap->counters.requested_bytes[size_class], size);
}
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
// In a forked child: heaps of threads other than `keep` have no thread any more (their pages:
// segment_forget_owner_threads).
void heap_forget_threads_after_fork(uintptr_t keep);

// A free by the page's owner thread. Not counted: page_account counts it on a slow path.
TRAY_INLINE void page_free_local(Heap* heap, Page* page, Block* block) noexcept {
  link_store(page, block, page->free);
  page->free = block;
  // Zero means empty, or the first block back in a full page (see Page::used). The page a
  // class allocates from never gets here for being empty (see queue_changed).
  if (TRAY_UNLIKELY(--page->used == 0)) heap_page_event(heap, page);
}

// The slot at `slot_index` (a class times kSlotIndexScale) as one address computation: the
// table holds the index ready, and the heap, the index and the field make one operand.
TRAY_INLINE AllocSlot& slot_at(Heap* heap, size_t slot_index) {
  return *reinterpret_cast<AllocSlot*>(reinterpret_cast<uintptr_t>(heap->slots) + slot_index * 8);
}

// Each field is reached from the heap and the index on its own (TRAY_OPAQUE), rather than
// through one `lea` of the slot's address: one instruction less. The index is the caller's
// own variable, so that a caller that passes it on after a miss holds it in one register.
TRAY_INLINE void* heap_pop_at(Heap* heap, size_t& slot_index) noexcept {
  Block* block = slot_at(heap, slot_index).head;
  TRAY_IN_REG(block, "a");
  TRAY_OPAQUE(slot_index);
  // The list's end and a link that decoded out of the page both lie at or past its limit
  // (hardening.hpp), and the shared empty page's limit is 0: one test for all three.
  if (TRAY_UNLIKELY(reinterpret_cast<uintptr_t>(block) >= slot_at(heap, slot_index).limit))
    return nullptr;
  TRAY_OPAQUE(slot_index);
  // Checked by the next pop, whose test against the limit it must pass.
  Block* next = link_decode_with(slot_at(heap, slot_index).unkey, block->next);
  TRAY_OPAQUE(slot_index);
  slot_at(heap, slot_index).head = next;
  free_key_clear(block);
  return block;
}

// Pops a block from the slot at slot_index; nullptr when it has none ready (its list ran
// dry, or the heap is &g_empty_heap, or the list is corrupted), for the caller's slow path to
// sort out. Counts nothing: the slot counts its list once it is handed out.
TRAY_INLINE void* heap_pop(Heap* heap, size_t slot_index) noexcept {
  return heap_pop_at(heap, slot_index);
}

// The slot index for size <= kMaxSmallBytes, small sizes through the heap's copy of the table.
TRAY_INLINE size_t heap_slot_of(const Heap* heap, size_t size) noexcept {
  if (TRAY_LIKELY(size <= kLookupLimitBytes)) return heap->slot_of_size[size];
  return slot_of_coarse(size);
}

// A block of class size_class from `heap`, for a request of `size` bytes; nullptr when out of
// memory.
TRAY_INLINE void* heap_alloc_from(Heap* heap, size_t size_class, size_t size) noexcept {
  void* p = heap_pop(heap, size_class * kSlotIndexScale);
  if (TRAY_LIKELY(p != nullptr)) return p;
  return heap_malloc_slow(heap, unsigned(size_class), size);
}

TRAY_INLINE void* heap_alloc_class(size_t size_class, size_t size) noexcept {
  return heap_alloc_from(tls_heap, size_class, size);
}

TRAY_INLINE void* heap_alloc_small(size_t size) noexcept {
  Heap* heap = tls_heap;
  const size_t slot_index = heap_slot_of(heap, size);
  void* p = heap_pop(heap, slot_index);
  if (TRAY_LIKELY(p != nullptr)) return p;
  return heap_malloc_slow(heap, unsigned(slot_index / kSlotIndexScale), size);
}

// Frees p into `page` if the calling thread's fast paths may (the page carries its thread
// pointer: a page of its heap, or of a program heap's part bound to it, in a queue); false
// (nothing done) otherwise, and when the checks fail (hardening.hpp): the slow path, which
// runs them again, reports. The page's heap is read only if the free empties the page.
TRAY_INLINE bool heap_free_own(Page* page, void* p) noexcept {
  auto* block = static_cast<Block*>(p);
  if (TRAY_LIKELY(page_owner_thread(page) == os::thread_pointer() && free_key_passes(page, block))) {
    free_key_set(page, block);
    link_store(page, block, page->free);
    page->free = block;
    if (TRAY_UNLIKELY(--page->used == 0)) heap_page_event(page->heap, page);
    return true;
  }
  return false;
}

}  // namespace tray
