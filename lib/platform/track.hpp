// Telling memcheck (-DTRAY_VALGRIND=ON) and AddressSanitizer (-DTRAY_ASAN=ON) about memory:
// the primitives every layer may need. The blocks themselves are told about at the entry
// points (api/track.hpp), which know what a block is.
//
// A TrackScope around the allocator's own work keeps memcheck quiet about the allocator
// touching free blocks (free-list links, the free key, remote batches, fills) rather than a
// hook at each of those places. With both options off (the default) all of this is empty
// inline code and the fast paths are unchanged.
#pragma once

#include <cstddef>

#include "core/core.hpp"

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
// The range is given back to the OS: ASan's shadow must not keep it poisoned for whoever maps
// it next.
void track_unmapped(const void* p, size_t bytes) noexcept;
// Whether the program runs under ASan's runtime, whose poisoning starts with the program's
// constructors (its runtime calls malloc while it starts, before its shadow memory exists).
bool track_asan_present() noexcept;

class TrackScope {
 public:
  TrackScope() noexcept;
  ~TrackScope();
  TrackScope(const TrackScope&) = delete;
  TrackScope& operator=(const TrackScope&) = delete;
};
#else
TRAY_INLINE void track_unmapped(const void*, size_t) noexcept {}
struct TrackScope {};
#endif

}  // namespace tray
