// Every tunable of the allocator, in one place, with its unit in its name.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tray {

// Address space comes from the OS in segments of this size, aligned to it, so that masking a
// pointer finds its segment header. A chunk is the same size: the chunk map has one entry per
// segment-sized, segment-aligned piece of the address space.
inline constexpr unsigned kSegmentShift = 22;
inline constexpr size_t kSegmentBytes = size_t{1} << kSegmentShift;  // 4 MiB

// A segment is cut into units; a page (slab) of one size class is a run of whole units.
inline constexpr unsigned kUnitShift = 16;
inline constexpr size_t kUnitBytes = size_t{1} << kUnitShift;        // 64 KiB
inline constexpr size_t kUnitsPerSegment = kSegmentBytes / kUnitBytes; // 64; unit 0 is the header

// Classes up to this size are pooled; larger requests get a mapping of their own.
inline constexpr size_t kMaxSmallBytes = size_t{128} << 10;          // 128 KiB

// A fresh page hands out its blocks a few at a time so a page that is barely used stays
// mostly untouched (not resident): each extension carves at most this many bytes of blocks...
inline constexpr size_t kPageExtendBytes = 4096;
// ...but at least this many: in classes of a KiB or more, carving one block per extension sent
// every other allocation down the slow path.
inline constexpr uint32_t kPageExtendMinBlocks = 4;

// Largest user-visible address the chunk map covers (x86-64 and AArch64 with 48-bit VAs).
inline constexpr unsigned kAddressBits = 47;

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
// The idle purger (purger.cpp) sleeps until the next delay runs out, plus this much: the clock
// it reads is coarse (a few ms), and waking early finds nothing due and sleeps again.
inline constexpr uint64_t kPurgerLateMs = 10;
// While no thread of the program holds a heap, it ends once it has found nothing to do for
// this long (a process lives as long as any of its threads), and starts again when there is
// something to give back: a program whose threads have all ended exits this much later.
inline constexpr uint64_t kPurgerIdleExitMs = 1000;
// A call that needs the process to have one thread (unshare, setns) waits at most this long
// for the purger to end (a pass under way finishes first) before it goes ahead anyway.
inline constexpr uint64_t kPurgerStopWaitMs = 1000;
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
// Segments whose dirty units one holder of the pool lock claims for purging: madvise runs
// after it lets go, and a purge of more segments takes the lock again per round.
inline constexpr unsigned kPoolPurgeClaimsPerRound = 8;
// Fully empty segments kept mapped (their units purged) to save a later mmap.
inline constexpr size_t kSegmentCacheCount = 4;

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

// Empty pages a heap keeps in its queues, so that a working set that swings by a page or two
// does not hand pages to the pool and take them back on every swing.
inline constexpr size_t kHeapRetainedBytes = size_t{1} << 20;

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

// Large blocks up to a chunk less a page are runs of pages cut from shared chunks (span.cpp):
// pages of this size (the OS page; spans are off where it differs)...
inline constexpr unsigned kSpanPageShift = 12;
inline constexpr size_t kSpanPageBytes = size_t{1} << kSpanPageShift;
inline constexpr size_t kSpanChunkPages = kSegmentBytes / kSpanPageBytes;  // page 0: the header
inline constexpr size_t kSpanMaxBytes = kSegmentBytes - kSpanPageBytes;
// ...whose free pages stay resident this long after the last free into their chunk (blocks
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
// kSpanCacheContendedMs (the purger's passes alone do not get there): where the arenas serve
// a thread without a wait, blocks kept apart only add to the peak (four Python threads taking
// turns under the interpreter's lock held 8 MiB more for no time).
inline constexpr uint64_t kSpanCacheContendedMs = 1000;
inline constexpr uint32_t kSpanCacheContentions = 16;
// Free runs of span chunks that one holder of an arena's lock claims for purging: madvise runs
// after it lets go (as kPoolPurgeClaimsPerRound for the pool).
inline constexpr size_t kSpanPurgeClaimsPerRound = 16;

// Every block is aligned to this (the smallest class is 16 bytes); larger
// alignments need a class whose size is a multiple of them, or a large block.
inline constexpr size_t kNaturalAlignment = 16;

// Requests above this are refused with ENOMEM before any arithmetic can overflow.
inline constexpr size_t kMaxRequestBytes = size_t{1} << 46;
// Largest alignment accepted by the aligned entry points (mirrors TRAY_MAX_ALIGNMENT).
inline constexpr size_t kMaxAlignmentBytes = size_t{1} << 29;

// Metadata (thread heaps) is carved from mappings of this size.
inline constexpr size_t kMetaChunkBytes = size_t{256} << 10;

inline constexpr size_t kCacheLineBytes = 64;

// Debug mode: a freed block waits in its freeing thread's quarantine (at most this many blocks
// and bytes) before it can be handed out again, so a write through a stale pointer has time to
// land in the fill and be caught, and a double free finds the block still marked free.
inline constexpr size_t kDebugQuarantineBlocks = 4096;
inline constexpr size_t kDebugQuarantineBytes = size_t{4} << 20;
// Debug mode: freed large blocks stay mapped but inaccessible, the newest this many.
inline constexpr size_t kDebugRetiredLargeCount = 256;
// Debug mode's realloc: to at most this many bytes it always moves the block, so that code that
// keeps the old address reads the freed fill. Past it, a move costs enough that a buffer grown
// a few bytes per call would be copied quadratically (tmux reflowing its history ran 14 times
// slower): the block changes size in place while it has room, and a move leaves room for this
// much more, so a growing buffer moves, and meets the stale pointers to it, at every 1.5x.
inline constexpr size_t kDebugReallocMoveBytes = 4096;
inline constexpr size_t kDebugReallocRoomPercent = 50;

// Heap profiling (prof=1, see prof.hpp). A sampled allocation keeps this many frames of its
// stack (the innermost: enough to name the site and its callers a few levels up)...
inline constexpr int kProfMaxFrames = 24;
// ...in a table of distinct stacks that never shrinks (a sample whose stack finds no room is
// dropped and counted)...
inline constexpr size_t kProfStackSlots = 16384;
// ...and is remembered until its free in a table of at most this many slots (a power of two),
// kept at most three quarters full: 49152 live samples, some 24 GiB of live heap at the default
// rate. The table starts at the smaller size and doubles as it fills: its slots are picked by
// hash, so a table mapped at its full 2 MiB is faulted in page by page by the first few hundred
// samples (about 300 of larson's 1,400 page faults).
inline constexpr size_t kProfLiveSlots = 65536;
inline constexpr size_t kProfLiveFirstSlots = 1024;
// prof_peak=1 copies the live counts of every stack when the estimated live bytes pass the
// last copy's by this share: the peak profile is within that share of the true peak, and a
// heap growing from nothing to N bytes costs O(log N) copies.
inline constexpr size_t kProfPeakStepPercent = 2;
// The cache of frame rules by return address that makes a profile's stacks cheap
// (platform/unwind.cpp): this many one-word slots (a power of two, 128 KiB of zero pages until
// a stack is taken), a return address looked for in this many slots from its hash's.
inline constexpr size_t kUnwindCacheSlots = 16384;
inline constexpr size_t kUnwindCacheProbes = 4;
// Guarded sampling (guard.cpp): a sampled block of at most this many bytes gets a slot of its
// own (rounded up to whole OS pages) between two inaccessible pages; larger ones are not guarded.
inline constexpr size_t kGuardMaxBlockBytes = size_t{16} << 10;
// Slots at most (guard_slots is clamped to it): the slot table is a static array, and each slot
// takes kGuardMaxBlockBytes + a page of address space (resident only while a block is live).
inline constexpr size_t kGuardMaxSlots = 1024;
// Return addresses kept of each guarded block's allocation and of its free.
inline constexpr unsigned kGuardStackFrames = 16;

// Times a thread that finds one of the allocator's locks held checks it again, with a pause
// between checks, before it sleeps (os::Mutex): about as long as a holder takes (a few hundred
// instructions), much less than a futex sleep and wake-up.
inline constexpr int kMutexSpins = 100;

}  // namespace tray
