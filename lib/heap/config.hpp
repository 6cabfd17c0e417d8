// Tunables of thread heaps: carving pages, sparse pages, remote frees, retained pages.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "size_classes/size_classes.hpp"

namespace tray {

// A fresh page hands out its blocks a few at a time so a page that is barely used stays
// mostly untouched (not resident): each extension carves at most this many bytes of blocks...
inline constexpr size_t kPageExtendBytes = 4096;
// ...but at least this many: in classes of a KiB or more, carving one block per extension sent
// every other allocation down the slow path.
inline constexpr uint32_t kPageExtendMinBlocks = 4;
// A class's slot takes in the blocks freed into its page when its list runs dry. Where that
// is fewer bytes than this and the page has blocks left to carve, it carves more too, so that
// a thread that frees what it allocates at once goes to the slow path once per this many
// bytes of blocks, not once per extension: malloc(1024)/free pairs took 74 instructions a pair
// with a refill every 4 blocks (callgrind, 2026-12-07).
inline constexpr size_t kSlotRefillBytes = size_t{16} << 10;

// A page whose live blocks are at most this share of its carved blocks, and that nothing
// allocated from for a pass or two, gives its OS pages that hold only free blocks back to the
// OS (sparse.cpp). Such pages are left over from a phase whose class went out of use.
inline constexpr size_t kSparsePagePercent = 50;
// A heap looks for such pages at most this often, from slow paths that take a page or serve a
// large block. Short, so that a class that went out of use gives its memory back while the
// next phase is still going (sparse.cpp says which pages are worth a look).
inline constexpr uint64_t kSparsePassMs = 5;
// The page a class allocates from is looked at too once nothing allocated from it or freed
// into it for this long: a class used now and then (or by a thread that adopted the heap)
// would fault back in what a shorter wait gave away.
inline constexpr uint64_t kSparseHeadIdleMs = 100;

// Frees into other threads' heaps are gathered in this many buckets per heap, a bucket per
// owner (by hash), and sent in batches of up to kRemoteBatchBlocks blocks (a batch also goes
// when another owner needs its bucket, and before the sender takes a page from the pool).
inline constexpr unsigned kRemoteBucketShift = 3;
inline constexpr unsigned kRemoteBuckets = 1u << kRemoteBucketShift;
inline constexpr uint32_t kRemoteBatchBlocks = 64;
// The first block of each run in a batch names a run started this many blocks or more before
// it (so at least this many runs further down the list), for the owner to prefetch while it
// puts back the runs in between; a power of two (remote.cpp).
inline constexpr unsigned kRemotePrefetchRuns = 8;
// A sender about to take a page from the pool takes the remote stack of an owner it sends to
// once that owner has left blocks there this long without taking any in (a thread blocked, or
// waiting for a core), and gives back to the pool the pages whose every block lies in it.
inline constexpr uint64_t kRemoteReclaimIdleMs = 2;
// What one such look walks at most: runs of blocks, and pages it counts blocks for (a table
// of this many slots that each heap maps, filled to three quarters). The rest of the stack
// waits for the next look.
inline constexpr uint32_t kRemoteReclaimRuns = 8192;
inline constexpr unsigned kRemoteReclaimPages = 256;

// A heap takes a page of a big class once it asked for more than this many of its blocks
// within the purge delay; until then they are large blocks (tails.cpp).
inline constexpr uint32_t kBigPageAfterBlocks = 4;

// The tails of free blocks of big classes (tails.cpp) a heap keeps in memory for its next
// allocations: at most the larger of these; past it, the least recently used go back at once.
inline constexpr size_t kHeapBigFreeFloorBytes = size_t{2} << 20;
inline constexpr size_t kHeapBigFreePercent = 100;

// A thread keeps blocks of other heaps' pages that it frees for its own next allocations of
// the class (heap/reuse.hpp): in up to kReuseWays runs a class, one page each, of up to
// kReuseRunBytes each; the rest go home. With one run a class, `exchange` at 8 threads kept
// 41% of its frees of others' blocks; with 8, 80-86%, and 16 kept hardly more for twice the
// 9 KiB the runs take in a heap (2026-12-07).
inline constexpr unsigned kReuseWays = 8;
inline constexpr size_t kReuseRunBytes = size_t{64} << 10;
// What a heap's runs may hold in all: what a thread that stops allocating keeps out of its
// owners' reach (kHeapRetainedBytes bounds the empty pages it keeps). A stage of `exchange`
// frees about 1 MiB of others' blocks a round before it allocates as much: bounding the runs'
// limits to 1 MiB kept 35-42% at 4 and 8 threads, against ~80% (2026-12-07).
inline constexpr size_t kReuseHeapBytes = size_t{2} << 20;
// A thread looks at whether keeping others' blocks pays every this many frees of others'
// blocks, and while it keeps them, stops after this many looks to count two spans with
// keeping off (heap/reuse.cpp, reuse_look).
inline constexpr uint64_t kReuseEpochFrees = 4096;
inline constexpr unsigned kReuseProbeEvery = 32;

// Empty pages a heap keeps in its queues, so that a working set that swings by a page or two
// does not hand pages to the pool and take them back on every swing.
inline constexpr size_t kHeapRetainedBytes = size_t{1} << 20;

// Metadata (thread heaps) is carved from mappings of this size.
inline constexpr size_t kMetaChunkBytes = size_t{256} << 10;

}  // namespace tray
