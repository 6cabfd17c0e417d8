// Telling memcheck (-DTRAY_VALGRIND=ON) and AddressSanitizer (-DTRAY_ASAN=ON) about the blocks
// traymalloc hands out and takes back, so that a program linked with libtraymalloc.a gets their
// reports on our blocks: memcheck's leaks, uses after free, overflows and reads of
// uninitialised bytes; ASan's uses of freed small blocks and overflows into a small block's
// slack. Neither tool can see our blocks otherwise: memcheck replaces only a shared library's
// malloc, and ASan's shadow knows nothing of memory it did not hand out.
//
// The entry points (alloc.hpp, api.cpp) wrap the allocator: track_freeing before a free,
// track_allocated after an allocation, a TrackScope around the allocator's own work, during
// which memcheck stays quiet about the allocator touching free blocks (free-list links, the
// free key, remote batches, fills) rather than a hook at each of those places. With both
// options off (the default) all of this is empty inline code and the fast paths are unchanged.
#pragma once

#include <cstddef>

#include "core/bits.hpp"

#if !defined(TRAY_VALGRIND)
#define TRAY_VALGRIND 0
#endif
#if !defined(TRAY_ASAN)
#define TRAY_ASAN 0
#endif
#define TRAY_TRACK (TRAY_VALGRIND || TRAY_ASAN)

namespace tray {

inline constexpr bool kTrackBlocks = TRAY_TRACK;

#if TRAY_TRACK
// p (a block of `size` requested bytes, zeroed if `zero`, or nullptr) has just been handed out.
void* track_allocated(void* p, size_t size, bool zero) noexcept;
// p is about to be freed (memcheck reports a bad free here, before the allocator looks).
void track_freeing(void* p) noexcept;
// The allocator is about to read or write `bytes` of a block the program may not touch now
// (the slack behind the request, a block being copied before it is freed).
void track_expose(const void* p, size_t bytes) noexcept;
// malloc_usable_size promised the program `bytes` at p: they all become usable.
void track_usable(const void* p, size_t bytes) noexcept;
// The range is given back to the OS: ASan's shadow must not keep it poisoned for whoever maps
// it next.
void track_unmapped(const void* p, size_t bytes) noexcept;

class TrackScope {
 public:
  TrackScope() noexcept;
  ~TrackScope();
  TrackScope(const TrackScope&) = delete;
  TrackScope& operator=(const TrackScope&) = delete;
};
#else
TRAY_INLINE void* track_allocated(void* p, size_t, bool) noexcept { return p; }
TRAY_INLINE void track_freeing(void*) noexcept {}
TRAY_INLINE void track_expose(const void*, size_t) noexcept {}
TRAY_INLINE void track_usable(const void*, size_t) noexcept {}
TRAY_INLINE void track_unmapped(const void*, size_t) noexcept {}
struct TrackScope {};
#endif

}  // namespace tray
