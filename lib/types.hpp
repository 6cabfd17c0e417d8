// Every structure of the allocator, in one place, with the rules for who may touch what.
//
//  segment (4 MiB, aligned) = header unit + 63 units of 64 KiB
//  page    = a run of units holding equal blocks of one size class, owned by one heap
//  heap    = one per thread: a queue of pages per size class; heaps outlive their threads and
//            are handed to the next thread that starts
//  large   = a block above kMaxSmallBytes: a mapping of its own with a header in front
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/config.hpp"
#include "size_classes.hpp"
#include "stats.hpp"

namespace tray {

// A free block: the free-list link lives in the block itself.
struct Block {
  Block* next;
};

struct Heap;
struct Quarantine;
class ReclaimTable;

// The samplers that pick allocations out of the byte stream (see sample.hpp), as bits.
enum Sampler : unsigned { kSamplerProf = 1u << 0, kSamplerGuard = 1u << 1 };
inline constexpr unsigned kSamplerCount = 2;

// Each heap counts the bytes allocated down in one countdown per stream: a size class, or
// kSampleStreamLarge for the requests served away from the small pools (sample.hpp).
inline constexpr unsigned kSampleStreamLarge = kSizeClassCount;
inline constexpr unsigned kSampleStreams = kSizeClassCount + 1;

// A heap's sampling state beside its countdowns. Written by the owner thread only; `armed` and
// `charged` are read by statistics dumps too (sample_requested_bytes).
struct SampleState {
  int64_t armed[kSampleStreams]{};    // the stream's countdown when it was last armed
  int64_t charged[kSampleStreams]{};  // bytes the stream counted down before that
  int64_t left[kSampleStreams][kSamplerCount]{};  // per sampler: bytes to go when armed; <0: off
  uint64_t rng = 0;                   // xorshift state for the exponential draws
  uint32_t generation = 0;            // sample options generation the heap was armed for
};

// A page descriptor. It lives in its segment's header, not in the page, so the blocks are
// all the page holds. Owner-thread fields are plain. `heap` is read by other threads too, but
// only through a block they were handed after the page got its owner, and it changes only once
// every block is back, so each read happens after the write it sees: no atomics needed.
// Two cache lines, aligned: neighbouring descriptors in a segment header often belong to
// different threads, and every malloc and free writes its page's `free` and `used`; a thread
// that frees another's block reads only the second line, which its owner seldom writes.
struct alignas(kCacheLineBytes) Page {
  // --- the owner's line: written by the owner thread; others read only `floating` (remote.cpp) ---
  Block* free = nullptr;        // owner: blocks ready to hand out
  // owner: blocks out of `free` (live or in the heap's remote list). A floating page (full,
  // in no queue) holds 1 instead of its count, which is then `reserved`: the next free brings
  // it to zero, so the free fast path needs one test for "now empty" and "was full" alike.
  uint32_t used = 0;
  uint32_t capacity = 0;        // owner: blocks carved so far (the rest are untouched memory)
  // owner: full, and in no queue until a block comes back. Set last, with a release store: a
  // sender holding every block of the page reads it to take the page (remote.cpp).
  bool floating = false;
  bool retained = false;        // owner: empty, kept in its queue (counted in retained_bytes)
  bool warm = false;            // owner: allocated from since the last sparse pass (sparse.cpp)
  bool came_home = false;       // owner: took in blocks other threads freed since it was carved
  uint16_t scrubbed_used : 15 = 0;  // owner: `used` when sparse.cpp last looked at it; 0: never
  // owner: some of its OS pages are given back (Segment::sparse_purged says which), so the
  // pages that have none, nearly all, need not read the segment header's line to know.
  uint16_t given_back : 1 = 0;
  Page* next = nullptr;         // owner: the heap's queue for this class
  Page* prev = nullptr;
  // --- the shared line: set when the page gets its owner, read by every thread that frees
  // one of its blocks ---
  alignas(kCacheLineBytes) Heap* heap = nullptr;  // owner; stable while any block of the page is live
  uint8_t* blocks = nullptr;    // address of block 0
  uint32_t reserved = 0;        // blocks the page can hold
  uint32_t block_bytes = 0;
  uint8_t size_class = 0;
  uint8_t unit_count = 0;       // units spanned (pool lock); 0 for no page
  uint8_t heap_bucket = 0;      // remote_bucket_of(heap), for senders: set with `heap`
};
static_assert(sizeof(Page) == 2 * kCacheLineBytes && kCacheLineBytes == 64);
static_assert(offsetof(Page, prev) + sizeof(Page*) <= kCacheLineBytes && offsetof(Page, heap) == kCacheLineBytes,
              "what the owner writes fills the first line, what other threads read starts the second");

inline constexpr uint32_t kSegmentMagic = 0x54524159;  // "TRAY"

struct Segment {
  uint32_t magic;
  // Pool state, under the pool lock.
  uint64_t free_units;       // bit u: unit u belongs to no page
  uint64_t dirty_units;      // bit u: free unit u still holds committed memory
  uint64_t dirty_since_ms;   // when the oldest dirty unit became free
  Segment* next;             // pool list (segments with free units, or the cache)
  Segment* prev;
  // pages[i] describes the page that starts at unit i; which page a unit belongs to is the
  // unit map's to say (segment.hpp). pages[0], the header unit's, stays empty and ownerless:
  // free units name it.
  Page pages[kUnitsPerSegment];
  // Debug mode only, indexed like pages: one word per block of the page, written with atomics
  // by whichever thread allocates or frees the block (see debug.cpp); mapped on the page's
  // first debug allocation. Kept out of Page so that Page stays 64 bytes.
  uint32_t* debug_states[kUnitsPerSegment];
  // Bit i of unit u: the i-th OS page of the unit was given back while its page kept live
  // blocks elsewhere, and the blocks that overlap it are on no free list (see sparse.cpp).
  // Written by the page's owner; zero while the unit belongs to no page.
  uint16_t sparse_purged[kUnitsPerSegment];
};
static_assert(sizeof(Segment) <= kUnitBytes, "the header must fit in unit 0");

// One queue of pages per size class; `direct[c]` is the head of queue c, or the shared empty
// page, so that the fast path never tests for "no page".
struct PageQueue {
  Page* head = nullptr;
  Page* tail = nullptr;
};

// What a heap last saw of the owner one of its buckets gathered for: how many times that owner
// had taken its remote stack in, and since when that count stood still while blocks waited
// there (remote_flush_and_reclaim in remote.cpp). It outlives the bucket's batches.
struct RemoteWatch {
  Heap* owner = nullptr;
  Block* left = nullptr;    // what the last look pushed back onto the owner's stack
  uint32_t drains = 0;
  uint32_t since_ms = 0;    // the clock's low bits (differences wrap safely); 0: not looked yet
};

// Blocks on their way to one owner heap: a list built by the freeing thread alone, sent to the
// owner's remote_free stack in one compare-and-swap when it holds kRemoteBatchBlocks blocks,
// when a block for another owner needs the bucket, or before the sender takes a new page.
// The list is a chain of runs, each of blocks of one page, that the owner puts back on their
// page whole (remote.cpp).
// Two cache lines, so that a bucket's address is a shift of its index.
struct alignas(kCacheLineBytes) RemoteBucket {
  Heap* target = nullptr;
  Block* head = nullptr;     // the newest run's first block
  Block* tail = nullptr;     // the last block of the oldest run
  Page* run_page = nullptr;  // the page of the newest run, while more of its blocks may join
  uint32_t count = 0;
  // Runs by the bucket's count at their start, modulo kRemotePrefetchRuns (nullptr: none yet).
  Block* recent[kRemotePrefetchRuns] = {};
  RemoteWatch watch;  // in the bytes the second line had to spare
};
static_assert(sizeof(RemoteBucket) == 2 * kCacheLineBytes);

// Which of a sender's buckets gathers for `owner`. Heaps are cache-line aligned and thousands
// of bytes apart: the bits above the line offset, mixed by a multiplicative hash, spread owners
// over the buckets. Each page keeps its owner's (Page::heap_bucket), so that a foreign free
// reads it next to `heap` instead of computing it.
inline uint8_t remote_bucket_of(const Heap* owner) {
  const uint64_t key = (reinterpret_cast<uintptr_t>(owner) >> 6) * 0x9E3779B97F4A7C15ULL;
  return uint8_t(key >> (64 - kRemoteBucketShift));
}

// The span blocks one thread freed and keeps for its own next requests (span_cache.cpp). Only
// the owner puts a block in; the owner, to use it, and the purger or a trim, to give it back,
// take one out atomically (the owner with a compare-and-swap, the others with an exchange), so
// a block in a slot belongs to whichever took it.
struct alignas(kCacheLineBytes) SpanCache {
  // A kept block: its header's address, with its run's pages in the low 12 bits (the header is
  // page-aligned) and its touched pages from bit 48 (user addresses stay under 2^47); 0: none.
  std::atomic<uint64_t> slots[kSpanCacheBlocks] = {};
  // The owner's last span request (written by it alone): once kSpanIdleMs have passed, the
  // purger gives its blocks back.
  std::atomic<uint64_t> last_request_ms{0};
  // owner: when it last found arenas' locks held often enough to keep blocks (0: never), and
  // how many times it found one held since contention_since_ms (span_cache_contended).
  uint64_t contended_ms = 0;
  uint64_t contention_since_ms = 0;
  uint32_t contentions = 0;
  uint32_t put_serial[kSpanCacheBlocks] = {};  // owner: when each slot was filled, in puts
  uint32_t puts = 0;                     // owner
  SpanCache* next_registered = nullptr;  // every heap's cache, newest first; never unlinked
};

struct Heap {
  explicit constexpr Heap(Page* empty_page) {
    for (auto& page : direct) page = empty_page;
    for (unsigned stream = 0; stream < kSampleStreams; ++stream)
      sample_countdown[stream] = sampling.armed[stream] = INT64_MAX;
    for (size_t size = 0; size <= kLookupLimitBytes; ++size)
      class_of_size[size] = kClassTables.class_of_lookup[size];
  }

  // Per stream (a size class, or kSampleStreamLarge), bytes the thread may still allocate
  // before its next sampled allocation there: every allocation subtracts its size, and the one
  // that takes it below zero goes to the slow path (sample.hpp). INT64_MAX while no sampler is
  // on, which no program allocates. What a class counted down is its requested bytes.
  int64_t sample_countdown[kSampleStreams];
  Page* direct[kSizeClassCount];
  // The size -> class table up to kLookupLimitBytes (size_classes.hpp), copied into every heap:
  // the fast path reaches it from the heap pointer it holds, where the global table costs it
  // one more instruction (loading the table's address).
  uint8_t class_of_size[kLookupLimitBytes + 1];
  PageQueue queues[kSizeClassCount];
  Heap* next_abandoned = nullptr;    // parked without a thread (g_parked in heap.cpp)
  uint64_t parked_ms = 0;            // when it was parked (written before it is)
  Heap* next_created = nullptr;      // every heap ever made, newest first; never unlinked
  Quarantine* quarantine = nullptr;  // debug mode: blocks freed but not yet reusable
  size_t retained_bytes = 0;         // empty pages kept for reuse (see kHeapRetainedBytes)
  uint64_t sparse_pass_ms = 0;       // the last pass over sparse pages (sparse.cpp)
  // Per class, the head page's free list as a sparse pass last saw it, and since when the
  // passes have seen it so: a head neither allocated from nor freed into for
  // kSparseHeadIdleMs is looked at like the other pages (sparse.cpp).
  Block* sparse_head_free[kSizeClassCount] = {};
  uint64_t sparse_head_since_ms[kSizeClassCount] = {};
  // Per class, when a sparse pass last saw it take a new page (sparse_delay_ms).
  uint64_t sparse_class_busy_ms[kSizeClassCount] = {};
  // Blocks this heap's thread freed into other heaps, gathered per owner so that frees to
  // several owners, interleaved, still cost one compare-and-swap per batch (see RemoteBucket).
  RemoteBucket outgoing[kRemoteBuckets];
  HeapCounters counters;
  SampleState sampling;
  // Blocks of this heap's pages freed by other threads: a lock-free stack that the owner
  // takes whole. On its own cache line so remote frees do not slow the owner's fields.
  alignas(kCacheLineBytes) std::atomic<Block*> remote_free{nullptr};
  // How many times remote_free was taken in: written by whoever does that (the owner, or the
  // collector of a parked heap, one at a time) with a load and a store; read by senders, to
  // tell an owner that stopped taking its blocks in.
  std::atomic<uint32_t> drains{0};
  // Where this heap's thread counts pages when it looks at an idle owner's stack (remote.cpp):
  // mapped at its first look; too big for a thread's stack inside malloc.
  ReclaimTable* reclaim_table = nullptr;
  SpanCache span_cache;
};

inline constexpr uint32_t kLargeMagic = 0x4C415247;  // "LARG"
inline constexpr size_t kLargeHeaderBytes = 64;      // keeps large blocks 64-byte aligned

// In front of every large block, at the start of its mapping. The mapping spans whole chunks
// (segment-aligned, segment-sized pieces of address space) so that no memory but ours shares a
// chunk with it: what the chunk map says about a chunk is true of every byte in it.
struct LargeHeader {
  uint32_t magic;
  uint32_t prof_sampled;  // 1: the heap profile holds the block (see prof.hpp)
  void* user;           // the block handed out; nullptr while the mapping sits in the cache
  size_t used_bytes;    // from the header to the end of the usable block (whole OS pages)
  size_t reserve_bytes; // length of the mapping: used_bytes rounded up to whole chunks
  size_t dirty_bytes;   // from the header to the end of what was ever touched and not purged
  size_t alignment;     // alignment the block was asked with (kept across realloc)
  uint64_t cached_ms;   // when it entered the cache
  size_t requested;     // debug mode: bytes asked for (the rest up to the end is a canary)
};
static_assert(sizeof(LargeHeader) <= kLargeHeaderBytes);

}  // namespace tray
