// Telling memcheck (-DTRAY_VALGRIND=ON) and AddressSanitizer (-DTRAY_ASAN=ON) about the blocks
// traymalloc hands out and takes back, so that a program linked with libtraymalloc.a gets their
// reports on our blocks: memcheck's leaks, uses after free, overflows and reads of
// uninitialised bytes; ASan's uses of freed small blocks and overflows into a small block's
// slack. Neither tool can see our blocks otherwise: memcheck replaces only a shared library's
// malloc, and ASan's shadow knows nothing of memory it did not hand out.
//
// The entry points (api.hpp, api.cpp) wrap the allocator: track_freeing before a free,
// track_allocated after an allocation, and a TrackScope (platform/track.hpp) around the
// allocator's own work. With both options off (the default) all of this is empty inline code.
#pragma once

#include <cstddef>

#include "core/core.hpp"
#include "platform/platform.hpp"

namespace tray {

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
#else
TRAY_INLINE void* track_allocated(void* p, size_t, bool) noexcept { return p; }
TRAY_INLINE void track_freeing(void*) noexcept {}
TRAY_INLINE void track_expose(const void*, size_t) noexcept {}
TRAY_INLINE void track_usable(const void*, size_t) noexcept {}
#endif

}  // namespace tray
