// The core's entry points (api.hpp) and the prefixed C API (traymalloc.h).
//
// Debug mode is chosen here and nowhere below: the slow paths and the entry points without a
// fast path test it and hand the call to debug/. A thread in debug mode holds a checked heap
// (HeapUse::kChecked), which leaves tls_heap at &g_empty_heap, so its fast paths always miss
// and come here.
#include "api/api.hpp"

#include <errno.h>

#include <cstdint>
#include <cstring>

#include "debug/debug.hpp"
#include "heap/heap.hpp"
#include "large/large.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "purge/purge.hpp"
#include "report/report.hpp"
#include "sample/sample.hpp"
#include "size_classes/size_classes.hpp"
#include "stats/stats.hpp"
#include "traymalloc.h"

namespace tray {

namespace {

constinit ForeignHandlers g_foreign{};

void* out_of_memory() {
  errno = ENOMEM;
  return nullptr;
}

// A pointer on the calling thread's stack or in the program's image is no allocator's block
// (a fake block, as "house of spirit" builds): the program stops there, where glibc's free would
// take it into its caches. Any other pointer may be another allocator's, and goes to it.
void check_not_fake(const char* call, void* p) {
  const char* place = os::place_of_non_heap_pointer(p);
  if (place == nullptr) return;
  char storage[256];
  TextBuffer text(storage, sizeof storage);
  text.str("traymalloc: ").str(call).str(" of invalid pointer ").ptr(p);
  text.str(": not allocated by traymalloc (it lies in ").str(place).str(")\n");
  fatal_misuse(text);
}

void free_foreign(void* p) {
  check_not_fake("free", p);
  count_add(g_totals.foreign_frees, 1);
  if (g_foreign.free != nullptr) g_foreign.free(p);
}

// Zeroes the first `size` bytes of a block just taken (they may still be poisoned for ASan).
void zero_fill(void* p, size_t size) {
  track_expose(p, size);
  std::memset(p, 0, size);
}

void* aligned_untracked(size_t size, size_t alignment, bool zero) {
  if (TRAY_UNLIKELY(debug_mode())) return debug_alloc(size, alignment, zero);
  if (alignment <= kNaturalAlignment) {
    void* p = alloc_untracked(size < alignment ? alignment : size);
    if (zero && p != nullptr) zero_fill(p, size);
    return p;
  }
  // A class whose block size is a multiple of the alignment has every block aligned, since
  // pages start on a unit boundary.
  // Not a big class, which a heap may serve with a large block (heap/tails.cpp) unaligned.
  if (alignment <= kUnitBytes && size <= kBigClassThresholdBytes) {
    for (unsigned c = size_class_of(size < alignment ? alignment : size); c < kFirstBigClass; ++c) {
      if (class_size(c) % alignment != 0) continue;
      void* p = heap_alloc_class(c, size);
      if (zero && p != nullptr) zero_fill(p, size);
      return p;
    }
  }
  return alloc_slow(size, alignment, zero);
}

// Big zeroed requests are large blocks, which clear only what was written before (a block of
// a big class would be cleared, and faulted in, whole).
void* zeroed_untracked(size_t total) {
  if (total > kBigClassThresholdBytes || TRAY_UNLIKELY(debug_mode())) return alloc_slow(total, 0, true);
  void* p = heap_alloc_small(total);
  if (p != nullptr) zero_fill(p, total);
  return p;
}

TRAY_NOINLINE void* alloc_large_slow(size_t size, size_t alignment, bool zero);

// The block that a moving realloc puts in p's place: a block of a program heap moves within
// it, whichever heap the thread allocates into now. A block that grows past the plain classes
// becomes a large block, which later growth extends in place (a big class's block would be
// copied at every class boundary).
void* alloc_replacing(const void* p, size_t size, bool growing = false) {
  const bool large = growing && size > kBigClassThresholdBytes;
  ProgramHeap* home = program_heap_of_block(p);
  if (TRAY_LIKELY(home == nullptr)) return large ? alloc_large_slow(size, 0, false) : alloc(size);
  TargetScope into(home);
  if (!into.ready()) return out_of_memory();
  return large ? alloc_large_slow(size, 0, false) : alloc(size);
}

// realloc in TRAY_VALGRIND and TRAY_ASAN builds: always a new block, since the tools could not
// be told how far a block resized in place had been written.
void* reallocate_by_copy(void* p, size_t size) {
  const size_t old_usable = usable_size(p);
  if (old_usable == 0) return out_of_memory();  // not a live block: leave it alone
  void* fresh = alloc_replacing(p, size);
  if (fresh == nullptr) return nullptr;
  {
    [[maybe_unused]] TrackScope scope;
    track_expose(p, old_usable);
    std::memcpy(fresh, p, size < old_usable ? size : old_usable);
  }
  dealloc(p);
  return fresh;
}

// Every free the fast path left but one: another heap's block freed by a thread with a heap.
TRAY_NOINLINE void free_unusual(void* p) {
  if (p == nullptr) return;
  if (TRAY_UNLIKELY(debug_mode())) return debug_free(p);
  // A block of a page with an owner, freed by a thread without a heap (see free_slow).
  Page* page = unit_page_of(p);
  if (page->heap != nullptr) return heap_free_remote(page, static_cast<Block*>(p));
  const uint8_t kind = chunk_kind(p);
  if (kind == kChunkSegment) {  // inside a segment but in no page: a stale or made-up pointer
    count_add(g_totals.foreign_frees, 1);
    return;
  }
  if (kind == kChunkForeign) {
    free_foreign(p);
    return;
  }
  if (kind == kChunkGuard) return guard_free(p);
  LargeHeader* header = large_mapping_of(p, kind);
  // Deeper inside a mapping than the chunk map can say is no block's start either.
  if (header == nullptr || header->user != p) large_report_bad_free("free", header, p);
  free_large(header);
  // Under an address-space limit, what the caches keep goes back with each large free: the
  // next mapping the limit refuses may be the program's own (a thread's stack), which no
  // retry of ours would see. Near the memory limit, so does what they keep resident.
  if (TRAY_UNLIKELY(limit_pressed() || os::address_space_limited())) give_back_address_space();
}

}  // namespace

void set_foreign_handlers(const ForeignHandlers& handlers) noexcept { g_foreign = handlers; }

void give_back_address_space() noexcept {
  [[maybe_unused]] TrackScope scope;
  large_trim();
  segment_trim();
}

void free_large(LargeHeader* header) {
  if (TRAY_UNLIKELY(header->prof_sampled != 0)) prof_forget_large(header);
  large_free(header);
}

// Those two cases go on at once, with no frame built and nothing looked up again: a thread
// with a heap is not in debug mode (debug mode leaves tls_heap at &g_empty_heap), and only a
// page with blocks has an owner (the unit map names g_foreign_page for memory outside
// segments, and pages[0] for free units).
void free_slow(void* p, Page* page) noexcept {
  Heap* self = tls_heap;
  if (TRAY_LIKELY(self != &g_empty_heap && page->heap != nullptr)) {
    // A block of the thread's own floating page (the first to come back: a page event), or a
    // free the checks refused, which heap_free_home reports.
    if (page->heap == self) return heap_free_home(self, page, static_cast<Block*>(p));
    return remote_free(static_cast<Block*>(p), page, self);
  }
  free_unusual(p);
}

namespace {

// Large requests, and small ones whose alignment no class gives.
TRAY_NOINLINE void* alloc_large_slow(size_t size, size_t alignment, bool zero) {
  if (alignment < kNaturalAlignment) alignment = kNaturalAlignment;
  // Before the sampling countdown: an impossible size would overflow it.
  if (size > kMaxRequestBytes) return out_of_memory();
  // A thread whose first request is a large one gets its heap here: for the span blocks it
  // keeps for itself (span_cache.hpp), and for the sampler.
  if (TRAY_UNLIKELY(tls_own_heap == nullptr)) heap_attach_thread(HeapUse::kFastPaths);
  if (Heap* heap = tls_own_heap; heap != nullptr) {
    if (void* sampled = sample_large(heap, size, alignment, zero); sampled != nullptr) {
      if (TRAY_LIKELY(program_adopt_large(sampled))) return sampled;
      free_unusual(sampled);
      return out_of_memory();
    }
  }
  heap_exchange_remote();
  void* p = large_alloc(size, alignment, zero);
  // The OS refused a mapping (an address-space limit, strict overcommit): what the caches and
  // the purger's queue of mappings to unmap hold may be just what it lacks.
  if (p == nullptr && trim_all()) p = large_alloc(size, alignment, zero);
  if (p == nullptr) return out_of_memory();
  if (TRAY_UNLIKELY(!program_adopt_large(p))) {
    free_unusual(p);
    return out_of_memory();
  }
  // Its free will leave memory to give back, and frees may not start the purger.
  purger_expect();
  purger_poll();
  return p;
}

}  // namespace

// Small requests of natural alignment come here from a thread with no heap yet, in debug
// mode, and from callers other than alloc (a failed pop of theirs); aligned requests that a
// class serves never do. Both cases leave by tail calls: a page switch, a slow path every few
// allocations where pages hold few free blocks, went through three frames that each saved and
// restored registers.
void* alloc_slow(size_t size, size_t alignment, bool zero) noexcept {
  if (TRAY_UNLIKELY(debug_mode())) return debug_alloc(size, alignment, zero);
  if (size <= kMaxSmallBytes && alignment <= kNaturalAlignment && !zero) {
    return heap_malloc_slow(tls_heap, size_class_of(size), size);
  }
  return alloc_large_slow(size, alignment, zero);
}

void* alloc_large_block(size_t size) noexcept { return alloc_large_slow(size, 0, false); }

void* alloc_aligned(size_t size, size_t alignment, bool zero) noexcept {
  [[maybe_unused]] TrackScope scope;
  return track_allocated(aligned_untracked(size, alignment, zero), size, zero);
}

void* alloc_zeroed(size_t count, size_t size) noexcept {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) return out_of_memory();
  [[maybe_unused]] TrackScope scope;
  return track_allocated(zeroed_untracked(total), total, true);
}

void* reallocate(void* p, size_t size) noexcept {
  if (kTrackBlocks && p != nullptr && size != 0 && chunk_kind(p) != kChunkForeign)
    return reallocate_by_copy(p, size);
  if (TRAY_UNLIKELY(debug_mode())) return debug_realloc(p, size);
  if (p == nullptr) return alloc(size);
  if (size == 0) {  // glibc's answer: free, and return NULL
    dealloc(p);
    return nullptr;
  }
  const uint8_t kind = chunk_kind(p);
  size_t old_usable;
  if (kind == kChunkSegment) {
    Page* page = unit_page_of(p);
    old_usable = page->block_bytes;
    if (old_usable == 0) return out_of_memory();  // not a block: leave it alone
    free_key_check_live(page, static_cast<Block*>(p));
    if (size <= old_usable && size >= old_usable / 2) return p;
  } else if (kind == kChunkForeign) {
    check_not_fake("realloc", p);
    return g_foreign.realloc != nullptr ? g_foreign.realloc(p, size) : out_of_memory();
  } else if (kind == kChunkGuard) {
    // Always moved: a block that grew or shrank in place would lose its guard page.
    old_usable = guard_usable_size(p);
    if (old_usable == 0) return out_of_memory();  // not a live block: leave it alone
  } else {
    LargeHeader* header = large_mapping_of(p, kind);
    if (header == nullptr || header->user != p) large_report_bad_free("realloc", header, p);
    old_usable = large_usable_size(header);
    // Large stays large (resized in place or moved by the kernel) unless it shrinks below the
    // big classes, or to less than half. The kernel cannot move a range that spans two of its
    // mappings (the large cache joins neighbours): then the block is copied like a small one.
    // Either way the new size is a new allocation to the samplers.
    if (size > kBigClassThresholdBytes || size >= old_usable / 2) {
      if (void* moved = large_resize(header, size); moved != nullptr) {
        LargeHeader* resized = large_mapping_of(moved, chunk_kind(moved));
        Heap* heap = tls_own_heap;
        const bool sampled = heap != nullptr && sample_resized(heap, size);
        if (TRAY_UNLIKELY(sampled || resized->prof_sampled != 0)) prof_large_resized(p, resized, sampled);
        return moved;
      }
    }
  }
  void* fresh = alloc_replacing(p, size, size > old_usable);
  if (fresh == nullptr) return nullptr;
  std::memcpy(fresh, p, size < old_usable ? size : old_usable);
  dealloc(p);
  return fresh;
}

size_t usable_size_untracked(const void* p) noexcept {
  if (TRAY_UNLIKELY(debug_mode())) return debug_usable_size(p);
  const uint8_t kind = chunk_kind(p);
  if (kind == kChunkSegment) return unit_page_of(p)->block_bytes;
  if (p == nullptr) return 0;
  if (kind == kChunkForeign) {
    return g_foreign.usable_size != nullptr ? g_foreign.usable_size(const_cast<void*>(p)) : 0;
  }
  if (kind == kChunkGuard) return guard_usable_size(p);
  const LargeHeader* header = large_mapping_of(p, kind);
  return header != nullptr && header->user == p ? large_usable_size(header) : 0;
}

size_t usable_size(const void* p) noexcept {
  const size_t usable = usable_size_untracked(p);
  if (kTrackBlocks && usable != 0 && chunk_kind(p) != kChunkForeign) track_usable(p, usable);
  return usable;
}

bool trim_all() noexcept {
  [[maybe_unused]] TrackScope scope;  // purging reads the remote frees' links
  bool released = heap_trim();
  released |= segment_trim();
  released |= large_trim();
  return released;
}

}  // namespace tray

// --- the prefixed C API ------------------------------------------------------------------
using namespace tray;

namespace {
// A power of two above what we serve is a valid request we cannot meet: ENOMEM, as POSIX and
// glibc answer it; EINVAL is for alignments that are not powers of two.
int alignment_error(size_t alignment) {
  if (!is_pow2(alignment)) return EINVAL;
  return alignment > kMaxAlignmentBytes ? ENOMEM : 0;
}
}  // namespace

extern "C" {

TRAY_EXPORT void* tray_malloc(size_t size) { return alloc(size); }
TRAY_EXPORT void* tray_calloc(size_t count, size_t size) { return alloc_zeroed(count, size); }
TRAY_EXPORT void* tray_realloc(void* ptr, size_t size) { return reallocate(ptr, size); }
TRAY_EXPORT void tray_free(void* ptr) { dealloc(ptr); }
TRAY_EXPORT void tray_free_sized(void* ptr, size_t) { dealloc(ptr); }
TRAY_EXPORT void tray_free_aligned_sized(void* ptr, size_t, size_t) { dealloc(ptr); }

TRAY_EXPORT void* tray_reallocarray(void* ptr, size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return nullptr;
  }
  return reallocate(ptr, total);
}

TRAY_EXPORT void* tray_aligned_alloc(size_t alignment, size_t size) {
  if (const int error = alignment_error(alignment); error != 0) {
    errno = error;
    return nullptr;
  }
  return alloc_aligned(size, alignment, false);
}

TRAY_EXPORT int tray_posix_memalign(void** out, size_t alignment, size_t size) {
  if (alignment < sizeof(void*)) return EINVAL;
  if (const int error = alignment_error(alignment); error != 0) return error;
  const int saved = errno;
  void* p = alloc_aligned(size, alignment, false);
  // It reports through its result. errno is left as glibc leaves it: ENOMEM when out of
  // memory (callers such as glibc's own tests read it), untouched otherwise.
  if (p == nullptr) {
    errno = ENOMEM;
    return ENOMEM;
  }
  errno = saved;
  *out = p;
  return 0;
}

TRAY_EXPORT void* tray_memalign(size_t alignment, size_t size) {
  // glibc's: no power of two to round up to is EINVAL, one too big to serve ENOMEM.
  if (alignment > SIZE_MAX / 2 + 1) {
    errno = EINVAL;
    return nullptr;
  }
  if (!is_pow2(alignment)) alignment = alignment == 0 ? 1 : std::bit_ceil(alignment);
  if (alignment > kMaxAlignmentBytes) {
    errno = ENOMEM;
    return nullptr;
  }
  return alloc_aligned(size, alignment, false);
}

TRAY_EXPORT size_t tray_usable_size(const void* ptr) { return usable_size(ptr); }

// Every chunk the map marks is ours to its last byte (segments, and large mappings that span
// whole chunks).
TRAY_EXPORT int tray_owns(const void* ptr) { return chunk_kind(ptr) != kChunkForeign; }

TRAY_EXPORT int tray_trim(void) { return trim_all() ? 1 : 0; }

TRAY_EXPORT int tray_option_set(const char* name, const char* value) {
  const int result = option_set(name, value);
  if (result == 0 && option(Option::kDebug) != 0) debug_prepare();
  if (result == 0 && option(Option::kGuardSample) != 0) guard_prepare();
  if (result == 0) {
    limit_options_changed();
    limit_admit(0);  // a limit below what is held now gives back at once
    report_options_changed();
    sample_options_changed();
    prof_options_changed();
  }
  return result;
}

}  // extern "C"
