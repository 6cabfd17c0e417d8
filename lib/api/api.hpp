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
// free_slow takes what the fast path already holds, in the registers it holds them in: p's
// page and the calling thread's heap.
void free_slow(void* p, Page* page, Heap* self) noexcept;
// A live large block goes back (the heap profile forgets it if it holds it).
void free_large(LargeHeader* header);

void* alloc_aligned(size_t size, size_t alignment, bool zero) noexcept;
void* alloc_zeroed(size_t count, size_t size) noexcept;
void* reallocate(void* p, size_t size) noexcept;
size_t usable_size(const void* p) noexcept;
// The program heap p's live block belongs to (api/heaps.cpp); nullptr for any other pointer.
ProgramHeap* program_heap_of_block(const void* p) noexcept;
size_t usable_size_untracked(const void* p) noexcept;  // without telling memcheck or ASan
bool trim_all() noexcept;

// Sizes past the fine class table test one more bound, in the branch small sizes skip.
// In debug mode tls_heap is &g_empty_heap, with no block to pop and no page to own, so both
// fast paths fall through to the checked slow paths at no cost when debug mode is off.
TRAY_INLINE void* alloc_untracked(size_t size) noexcept {
  void* p = nullptr;
  Heap* heap = tls_heap;
  if (TRAY_LIKELY(size <= kLookupLimitBytes)) p = heap_pop(heap, heap->class_of_size[size], size);
  else if (size <= kMaxSmallBytes) p = heap_pop(heap, size_class_coarse(size), size);
  if (TRAY_LIKELY(p != nullptr)) return p;
  return alloc_slow(size, 0, false);
}

TRAY_INLINE void dealloc_untracked(void* p) noexcept {
  Page* page = unit_page_of(p);
  Heap* heap = tls_heap;
  if (TRAY_LIKELY(heap_free_own(heap, page, p))) return;
  free_slow(p, page, heap);
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
