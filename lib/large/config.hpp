// Tunables of large blocks: the cache of freed mappings and the tails reused blocks keep.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

// Freed large blocks kept mapped for reuse: at most this many mappings, holding at most the
// largest of a floor, a share of the bytes of live large blocks (a program that replaces big
// buffers all the time then reuses their pages instead of faulting in new ones) and a share of
// the most live large bytes within the last kLargeCacheDelayMs (a program that frees its big
// buffers together, at the end of a round or of its run, does not unmap them while it frees;
// all of them would let a buffer that grows by realloc beside the cache take resident memory
// past glibc's)...
inline constexpr size_t kLargeCacheCount = 64;
inline constexpr size_t kLargeCacheFloorBytes = size_t{64} << 20;
inline constexpr size_t kLargeCacheLivePercent = 100;
inline constexpr size_t kLargeCachePeakPercent = 50;
// ...each for at most this long: reuse in a loop comes within milliseconds, while a program
// whose large blocks went out of use should not keep them for a phase of other sizes.
inline constexpr uint64_t kLargeCacheDelayMs = 500;
// ...or only this long once no large block was asked for within it: a program whose large
// blocks went out of use frees them at a high rate (its new, smaller blocks take their place)
// and would keep every one of the last kLargeCacheDelayMs for nobody.
inline constexpr uint64_t kLargeCacheIdleMs = 150;
// A reused mapping keeps touched pages past the block's end only up to 1/kLargeCacheFitRatio
// of the block; the rest goes back to the OS.
inline constexpr size_t kLargeCacheFitRatio = 2;
// ...and the tails that live blocks keep so, together, only up to 1/kLargeTailLiveRatio of the
// live large bytes: at a program's peak they are resident beside its blocks for nothing.
inline constexpr size_t kLargeTailLiveRatio = 5;
// Mappings evicted from the cache are unmapped by the purger thread while it runs, so that
// the program's free does not pay for the kernel freeing their pages; at most this many bytes
// of them wait for it at once (they stay resident until it gets to them), the rest are
// unmapped by the thread that evicts them.
inline constexpr size_t kLargeUnmapDeferBytes = size_t{256} << 20;

}  // namespace tray
