// Tunables of the segment pool: when its empty units go back to the OS.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

// Empty spans stay committed ("dirty") this long before they are given back with madvise...
inline constexpr uint64_t kPurgeDelayMs = 200;
// ...unless more dirty bytes than the larger of a floor and a share of the bytes in pages have
// piled up, then the oldest go at once. The floor is what a program may free and build again
// within the delay without faulting it back in (threads that end and are replaced, a frame or
// a request whose blocks all die together); the share keeps bigger heaps just as fast.
inline constexpr size_t kDirtyFloorBytes = size_t{64} << 20;
inline constexpr size_t kDirtyPercentOfInUse = 25;
// Neither purges the dirty units that would bring what the program's blocks hold (bytes in
// pages and large blocks' resident bytes) back to its most of the last window, while it took or
// returned a page within the quiet time (segment.cpp). Longer than the phases of a program
// whose pages swing (a Python script's size bands came back every 1.6 s); a program that stays
// smaller keeps them that long.
inline constexpr uint64_t kPoolHoldWindowMs = 3000;
inline constexpr uint64_t kPoolQuietMs = kPurgeDelayMs;
// Segments whose dirty units one holder of the pool lock claims for purging: madvise runs
// after it lets go, and a purge of more segments takes the lock again per round.
inline constexpr unsigned kPoolPurgeClaimsPerRound = 8;
// Fully empty segments kept mapped (their units purged) to save a later mmap.
inline constexpr size_t kSegmentCacheCount = 4;

}  // namespace tray
