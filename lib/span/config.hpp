// Tunables of span blocks: their chunks, arenas, stashes and per-thread caches. A span is a run
// of OS pages; in span/, "page" always means an OS page (a span chunk holds no traymalloc page).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "segment/segment.hpp"

namespace tray {

// Large blocks up to a chunk less an OS page are runs of OS pages cut from shared chunks
// (span.cpp), of this size (spans are off where the OS page differs)...
inline constexpr unsigned kOsPageShift = 12;
inline constexpr size_t kOsPageBytes = size_t{1} << kOsPageShift;
inline constexpr size_t kSpanChunkOsPages = kSegmentBytes / kOsPageBytes;  // OS page 0: the header
inline constexpr size_t kSpanMaxBytes = kSegmentBytes - kOsPageBytes;
// ...whose free OS pages stay resident this long after the last free into their chunk (blocks
// replaced in a loop come back within milliseconds; the segments' delay, for the same reason)...
inline constexpr uint64_t kSpanPurgeDelayMs = kPurgeDelayMs;
// ...and at most the larger of a floor and a share of the bytes of live span blocks, plus what
// was freed since the most live span bytes of the last purge delay; past it the chunks freed
// into longest ago are purged at once.
// The floor is shared by the arenas in use (below).
inline constexpr size_t kSpanDirtyFloorBytes = size_t{16} << 20;
inline constexpr size_t kSpanDirtyLivePercent = 50;
// Span chunks are kept in up to this many arenas, each with its own lock, chunks and index; a
// thread moves to another arena when it finds its own locked (span.cpp), and a block goes back
// to its chunk's arena. With one lock for all, two threads that recycled blocks of hundreds
// of KiB took twice as long as one.
inline constexpr size_t kSpanArenaCount = 4;
// ...while a span was asked for within this long; after it, none are kept. Shorter than the
// large cache's kLargeCacheIdleMs: programs that replace spans ask for one every fraction of a
// millisecond (mstress), while the soak's small phases started with up to 16 MiB kept for the
// mixed phase's spans, dying one by one, for 150 ms.
inline constexpr uint64_t kSpanIdleMs = 50;
// Each arena keeps up to this many freed span blocks whole, and at most this many of their
// bytes touched, for the next request of about their length (span.cpp): taken again with no
// search, no bitmap and, the header's page being resident, no page fault. They go back to
// their chunks when the arena needs the room, and when span requests stop (kSpanIdleMs).
inline constexpr size_t kSpanStashBlocks = 4;
inline constexpr size_t kSpanStashDirtyBytes = size_t{2} << 20;
// Each thread keeps up to this many of the span blocks it freed, of runs up to
// kSpanCacheMaxRunBytes and at most kSpanCacheDirtyBytes of them touched, for its own next
// requests, taken with no lock (span_cache.cpp). Threads that each replace blocks of hundreds
// of KiB otherwise take turns at an arena's lock for every one. Given back when the thread
// stops asking for spans for kSpanIdleMs (the purger), ends, or trims.
inline constexpr size_t kSpanCacheBlocks = 4;
inline constexpr size_t kSpanCacheMaxRunBytes = size_t{1} << 20;
inline constexpr size_t kSpanCacheDirtyBytes = size_t{2} << 20;
// ...and only while it finds arenas' locks held kSpanCacheContentions times within
// kSpanCacheContendedMs (the purger's passes alone do not get there), or while it has been the
// only thread asking for spans for kSpanIdleMs. Where several threads meet no held lock,
// blocks each keeps apart only add to the peak (four Python threads taking turns under the
// interpreter's lock held 8 MiB more for no time); a thread alone skips the arenas' search and
// bitmaps (large_slots: 0.70x the time and the peak RSS, 2026-11-29).
inline constexpr uint64_t kSpanCacheContendedMs = 1000;
inline constexpr uint32_t kSpanCacheContentions = 16;
// Free runs of span chunks that one holder of an arena's lock claims for purging: madvise runs
// after it lets go (as kPoolPurgeClaimsPerRound for the pool).
inline constexpr size_t kSpanPurgeClaimsPerRound = 16;

}  // namespace tray
