// The allocation entry points every front end (the tray_* API, the malloc and operator new
// overrides) is built from: the fast paths inline here, everything else out of line.
#pragma once

#include <cstddef>
#include <cstdint>

#include "api/track.hpp"
#include "core/core.hpp"
#include "heap/heap.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"

namespace tray {

// What to do with pointers traymalloc does not own. The override layer points these at the
// C library's own functions, so memory that libc handed out (a program mixing allocators,
// an RTLD_DEEPBIND library) goes back to libc; otherwise such frees are counted and dropped.
struct ForeignHandlers {
  void (*free)(void*);
  void* (*realloc)(void*, size_t);
  size_t (*usable_size)(void*);
};
void set_foreign_handlers(const ForeignHandlers& handlers) noexcept;

// Out of line: small requests the fast path could not serve, large and aligned requests,
// debug mode, errors (errno = ENOMEM), frees of null, foreign and other threads' blocks.
// All noexcept: the override layer is built with exceptions, and a call from a noexcept
// function to one that might throw could not be a tail call.
void* alloc_slow(size_t size, size_t alignment, bool zero) noexcept;
// free_slow takes what the fast path already holds, in the register it holds it in: p's page.
void free_slow(void* p, Page* page) noexcept;
// A live large block goes back (the heap profile forgets it if it holds it).
void free_large(LargeHeader* header);
// A large block of `size` bytes, as a request above the classes gets one: for a big class that
// the thread's heap uses too seldom for a page (g_events.big_block_alloc).
void* alloc_large_block(size_t size) noexcept;

void* alloc_aligned(size_t size, size_t alignment, bool zero) noexcept;
void* alloc_zeroed(size_t count, size_t size) noexcept;
void* reallocate(void* p, size_t size) noexcept;
size_t usable_size(const void* p) noexcept;
// The program heap p's live block belongs to (api/heaps.cpp); nullptr for any other pointer.
ProgramHeap* program_heap_of_block(const void* p) noexcept;
size_t usable_size_untracked(const void* p) noexcept;  // without telling memcheck or ASan
bool trim_all() noexcept;
// What the pool and the large caches keep for reuse goes back to the OS (the heaps' pages stay).
void give_back_address_space() noexcept;

// Sizes past the fine class table test one more bound, in the branch small sizes skip.
// In debug mode tls_heap is &g_empty_heap, with no block to pop and no page to own, so both
// fast paths fall through to the checked slow paths at no cost when debug mode is off.
TRAY_INLINE void* alloc_untracked(size_t size) noexcept {
  Heap* heap = tls_heap;
  size_t slot_index;
  if (TRAY_LIKELY(size <= kLookupLimitBytes)) slot_index = heap->slot_of_size[size];
  else if (size <= kMaxSmallBytes) slot_index = slot_of_coarse(size);
  else return alloc_slow(size, 0, false);
  if (void* p = heap_pop_at(heap, slot_index); TRAY_LIKELY(p != nullptr)) return p;
  // &g_empty_heap: the thread's first request, or debug mode.
  if (TRAY_UNLIKELY(heap == &g_empty_heap)) return alloc_slow(size, 0, false);
  return heap_malloc_miss(heap, slot_index, size);
}

TRAY_INLINE void dealloc_untracked(void* p) noexcept {
  Page* page = unit_page_of(p);
  if (TRAY_LIKELY(heap_free_own(page, p))) return;
  free_slow(p, page);
}

// malloc and free. The same fast paths, unless a TRAY_VALGRIND or TRAY_ASAN build tells a tool
// about each block (api/track.hpp).
TRAY_INLINE void* alloc(size_t size) noexcept {
  [[maybe_unused]] TrackScope scope;
  return track_allocated(alloc_untracked(size), size, false);
}

TRAY_INLINE void dealloc(void* p) noexcept {
  track_freeing(p);
  [[maybe_unused]] TrackScope scope;
  dealloc_untracked(p);
}

}  // namespace tray
