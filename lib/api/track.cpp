// Built only with -DTRAY_VALGRIND=ON or -DTRAY_ASAN=ON (see api/track.hpp).
#include "api/track.hpp"

#include "api/api.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"

#if TRAY_VALGRIND
#include <valgrind/memcheck.h>
#endif
#if TRAY_ASAN
#include <sanitizer/asan_interface.h>
// Weak: the library also links into programs built without -fsanitize=address (and the tests'
// own binaries), where these do nothing.
#pragma weak __asan_poison_memory_region
#pragma weak __asan_unpoison_memory_region
#endif

namespace tray {

namespace {

#if TRAY_ASAN
bool asan_present() { return track_asan_present(); }

// The small block p is the start of, or nullptr (an interior or foreign pointer, whose
// neighbours must not be poisoned by mistake). ASan only poisons small blocks: large and
// guarded ones go back to the OS or fault by themselves, and their shadow would outlive them.
const Page* small_block_page(const void* p) {
  if (chunk_kind(p) != kChunkSegment) return nullptr;
  const Page* page = unit_page_of(p);
  if (page->block_bytes == 0) return nullptr;
  const size_t offset = size_t(static_cast<const uint8_t*>(p) - page->blocks);
  return offset % page->block_bytes == 0 ? page : nullptr;
}
#endif

}  // namespace

void* track_allocated(void* p, size_t size, bool zero) noexcept {
  if (p == nullptr || chunk_kind(p) == kChunkForeign) return p;
  const size_t usable = usable_size_untracked(p);
#if TRAY_VALGRIND
  VALGRIND_MALLOCLIKE_BLOCK(p, size, 0, zero ? 1 : 0);
  if (usable > size) VALGRIND_MAKE_MEM_NOACCESS(static_cast<char*>(p) + size, usable - size);
#endif
#if TRAY_ASAN
  if (asan_present() && small_block_page(p) != nullptr) {
    __asan_unpoison_memory_region(p, size);
    if (usable > size) __asan_poison_memory_region(static_cast<char*>(p) + size, usable - size);
  }
#endif
  (void)size, (void)zero, (void)usable;
  return p;
}

void track_freeing(void* p) noexcept {
  if (p == nullptr || chunk_kind(p) == kChunkForeign) return;
#if TRAY_VALGRIND
  VALGRIND_FREELIKE_BLOCK(p, 0);
#endif
#if TRAY_ASAN
  if (!asan_present()) return;
  if (const Page* page = small_block_page(p); page != nullptr)
    __asan_poison_memory_region(p, page->block_bytes);
#endif
}

void track_expose(const void* p, size_t bytes) noexcept {
#if TRAY_ASAN
  if (asan_present() && small_block_page(p) != nullptr) __asan_unpoison_memory_region(p, bytes);
#endif
  (void)p, (void)bytes;  // memcheck: the TrackScope around the access keeps it quiet
}

void track_usable(const void* p, size_t bytes) noexcept {
#if TRAY_VALGRIND
  // The bytes past the request are the ones memcheck knows as inaccessible; the first of them is
  // what this check returns (its own report is silenced by the scope).
  TrackScope scope;
  const auto first = uintptr_t(VALGRIND_CHECK_MEM_IS_ADDRESSABLE(p, bytes));
  const auto end = reinterpret_cast<uintptr_t>(p) + bytes;
  if (first != 0 && first < end) VALGRIND_MAKE_MEM_UNDEFINED(first, end - first);
#endif
  track_expose(p, bytes);
}

}  // namespace tray
