// The program heaps' C API (traymalloc.h, "heaps"). An allocation into a heap is an ordinary
// allocation made while the calling thread's target is the heap's part (TargetScope): the
// same fast paths, large blocks, sampling and debug mode, with nothing to pass down.
#include <errno.h>

#include <cstddef>
#include <cstring>

#include "api/api.hpp"
#include "debug/debug.hpp"
#include "heap/heap.hpp"
#include "large/large.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "sample/sample.hpp"
#include "traymalloc.h"

namespace tray {

namespace {

tray_heap_t* handle_of(const ProgramHeap* heap) {
  return reinterpret_cast<tray_heap_t*>(const_cast<ProgramHeap*>(heap));
}

// A handle the program passes must be a live heap: one destroyed, or never made, stops the
// program here rather than corrupting memory later.
ProgramHeap* live_heap(tray_heap_t* handle, const char* call) {
  auto* heap = reinterpret_cast<ProgramHeap*>(handle);
  if (program_heap_live(heap)) return heap;
  char storage[256];
  TextBuffer text(storage, sizeof storage);
  text.str("traymalloc: ").str(call).str(" of ").ptr(handle);
  text.str(": not a live heap (destroyed, or not made by tray_heap_new)\n");
  fatal_misuse(text);
}

void* out_of_memory() {
  errno = ENOMEM;
  return nullptr;
}

}  // namespace

ProgramHeap* program_heap_of_block(const void* p) noexcept {
  const uint8_t kind = chunk_kind(p);
  if (kind == kChunkForeign || p == nullptr) return nullptr;
  if (kind == kChunkSegment) {
    const Page* page = unit_page_of(p);
    if (page->owner_kind == OwnerKind::kLocked) return const_cast<ProgramHeap*>(prof_owner_of(p));
    return program_heap_of_page(page);
  }
  if (kind == kChunkGuard) return const_cast<ProgramHeap*>(guard_owner_of(p));
  const LargeHeader* header = large_mapping_of(p, kind);
  if (header == nullptr || header->user != p) return nullptr;
  return program_heap_of_large(header);
}

namespace {

// Debug mode frees it as the program would: canary checked, mapping kept inaccessible.
void retire_large(LargeHeader* header) { debug_free(header->user); }

// What a reset and a destroy both do before the heap layer empties the parts.
ProgramHeap* release_blocks(tray_heap_t* handle, const char* call) {
  ProgramHeap* heap = live_heap(handle, call);
  if (debug_mode() && heap->allocating.load(std::memory_order_acquire) != 0) {
    char storage[256];
    TextBuffer text(storage, sizeof storage);
    text.str("traymalloc: ").str(call).str(" of heap ").ptr(handle);
    text.str(" while another thread allocates into it\n");
    fatal_misuse(text);
  }
  [[maybe_unused]] TrackScope scope;
  sample_release_owned(heap);
  large_release_owned(&heap->large, debug_mode() ? retire_large : free_large);
  return heap;
}

// tray_heap_malloc's slow path, after a failed pop from the part the thread used last (live,
// and the heap's): malloc's, with the part as the thread's target.
TRAY_NOINLINE void* refill_into(Heap* part, size_t size) {
  Heap* previous = program_target(part);
  void* p = alloc_slow(size, 0, false);
  program_target(previous);
  return p;
}

TRAY_NOINLINE void* malloc_into(tray_heap_t* handle, size_t size) {
  TargetScope into(live_heap(handle, "tray_heap_malloc"));
  if (!into.ready()) return out_of_memory();
  return alloc(size);
}

}  // namespace

}  // namespace tray

using namespace tray;

extern "C" {

TRAY_EXPORT tray_heap_t* tray_heap_new(void) {
  ProgramHeap* heap = program_heap_new();
  if (heap == nullptr) return static_cast<tray_heap_t*>(out_of_memory());
  return handle_of(heap);
}

TRAY_EXPORT void tray_heap_destroy(tray_heap_t* handle) {
  if (handle == nullptr) return;
  ProgramHeap* heap = release_blocks(handle, "tray_heap_destroy");
  [[maybe_unused]] TrackScope scope;
  program_heap_destroy(heap, debug_mode() ? debug_retire_block : nullptr);
  // The program says it is done with that memory: what the destroy freed goes back to the OS
  // now, not after the purge delay, with or without a purger thread (the caller's own pages,
  // kept for its next heap, stay). With it goes what the pool and the large caches kept
  // before: a destroy is rare next to the requests that fill a heap (request_heap's destroy
  // runs were no slower, 2026-12-07).
  give_back_address_space();
}

TRAY_EXPORT void tray_heap_reset(tray_heap_t* handle) {
  if (handle == nullptr) return;
  ProgramHeap* heap = release_blocks(handle, "tray_heap_reset");
  [[maybe_unused]] TrackScope scope;
  program_heap_reset(heap, debug_mode() ? debug_retire_block : nullptr);
}

TRAY_EXPORT void* tray_heap_malloc(tray_heap_t* handle, size_t size) {
  // The part this thread used last, if it is the heap's: a block from its page, as malloc's
  // fast path would pop it. Not for a checked part (debug mode), nor where a tool is told of
  // each block.
  Heap* part = tls_last_part;
  if (!kTrackBlocks && part != nullptr && size <= kMaxSmallBytes &&
      part->program.load(std::memory_order_relaxed) == reinterpret_cast<ProgramHeap*>(handle) &&
      !part->checked) {
    if (void* p = heap_pop(part, heap_slot_of(part, size)); TRAY_LIKELY(p != nullptr)) return p;
    return refill_into(part, size);
  }
  return malloc_into(handle, size);
}

TRAY_EXPORT void* tray_heap_calloc(tray_heap_t* handle, size_t count, size_t size) {
  TargetScope into(live_heap(handle, "tray_heap_calloc"));
  if (!into.ready()) return out_of_memory();
  return alloc_zeroed(count, size);
}

TRAY_EXPORT void* tray_heap_aligned_alloc(tray_heap_t* handle, size_t alignment, size_t size) {
  TargetScope into(live_heap(handle, "tray_heap_aligned_alloc"));
  if (!into.ready()) return out_of_memory();
  return tray_aligned_alloc(alignment, size);
}

TRAY_EXPORT void* tray_heap_realloc(tray_heap_t* handle, void* p, size_t size) {
  ProgramHeap* heap = live_heap(handle, "tray_heap_realloc");
  TargetScope into(heap);
  if (!into.ready()) return out_of_memory();
  if (p == nullptr || size == 0 || program_heap_of_block(p) == heap) return reallocate(p, size);
  // A block of another heap (or a thread's) moves into this one, even where it would fit.
  const size_t old_usable = usable_size(p);
  if (old_usable == 0) return reallocate(p, size);  // not a live block: reallocate answers
  void* fresh = alloc(size);
  if (fresh == nullptr) return nullptr;
  std::memcpy(fresh, p, size < old_usable ? size : old_usable);
  dealloc(p);
  return fresh;
}

TRAY_EXPORT tray_heap_t* tray_heap_set_default(tray_heap_t* handle) {
  Heap* part = nullptr;
  if (handle != nullptr) {
    ProgramHeap* heap = live_heap(handle, "tray_heap_set_default");
    if (program_thread_heap() != nullptr) part = program_part(heap);
    if (part == nullptr) {  // no memory for the thread's part: nothing changes
      errno = ENOMEM;
      return tls_part != nullptr ? handle_of(tls_part->program.load(std::memory_order_relaxed)) : nullptr;
    }
  }
  Heap* previous = program_target(part);
  return previous != nullptr ? handle_of(previous->program.load(std::memory_order_relaxed)) : nullptr;
}

TRAY_EXPORT tray_heap_t* tray_heap_of(const void* p) { return handle_of(program_heap_of_block(p)); }

}  // extern "C"
