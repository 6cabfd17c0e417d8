// The structures of the segment layer, with the rules for who may touch what.
//
//  segment (4 MiB, aligned) = header unit + 63 units of 64 KiB
//  page    = a run of units holding equal blocks of one size class, owned by one heap
//
//  large   = a block above kMaxSmallBytes, a span block or a mapping of its own, with a header
//            in front that the chunk map leads to
//
// Heaps (heap/types.hpp) and span caches (span/span_cache.hpp) are defined by the layers that
// own them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

// A free block: the free-list link lives in the block itself.
struct Block {
  Block* next;
};

struct Heap;

// What kind of heap owns a page, copied from it onto the page's shared line so that a free
// from another thread tells the rare owners apart without reading the owner.
enum class OwnerKind : uint8_t {
  kThread,   // a thread's heap: frees from other threads gather in buckets (heap/remote.hpp)
  kLocked,   // the heap profile's heap, which no thread owns (heap_create_locked)
  kPart,     // one thread's part of a program heap (heap/program.hpp): no bucket gathers for it
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
  // owner: blocks freed into the page, for its class's slot to take in (heap/types.hpp,
  // AllocSlot) when the page is the one the class allocates from, or becomes it.
  Block* free = nullptr;
  // owner: carved blocks neither on `free` nor on an OS page given back (heap/sparse.cpp):
  // live, on their way back from another thread, or in the class's slot. The class's page
  // carries one more (heap/queue.cpp). A floating page (full, in no queue) holds 1 instead of
  // its count, which is then `reserved`: the next free brings it to zero, so the free fast
  // path needs one test for "now empty" and "was full" alike.
  uint32_t used = 0;
  uint32_t capacity = 0;        // owner: blocks carved so far (the rest are untouched memory)
  // owner: full, and in no queue until a block comes back. Set last, with a release store: a
  // sender holding every block of the page reads it to take the page (remote.cpp).
  bool floating = false;
  bool retained = false;        // owner: empty, kept in its queue (counted in retained_bytes)
  bool warm = false;            // owner: allocated from since the last sparse pass (sparse.cpp)
  bool came_home = false;       // owner: took in blocks other threads freed since it was carved
  // owner: full when a scan for blocks (heap/heap.cpp, find_page) last passed it, and sent to
  // the back of its queue instead of floating: the next scan that finds it still full floats it.
  bool cycled = false;
  uint16_t scrubbed_used : 15 = 0;  // owner: `used` when sparse.cpp last looked at it; 0: never
  // owner: some of its OS pages are given back (Segment::sparse_purged says which), so the
  // pages that have none, nearly all, need not read the segment header's line to know.
  uint16_t given_back : 1 = 0;
  Page* next = nullptr;         // owner: the heap's queue for this class
  Page* prev = nullptr;
  // Set when the page gets its owner (heap/hardening.hpp), read by its pops: the end of its
  // last block (0: no page, so that every pop of the shared empty page fails its test), and
  // the inverse of link_key, which decodes the links its free blocks hold.
  uintptr_t limit = 0;
  uint64_t link_unkey = 1;
  // owner: blocks carved before the page was last carved afresh (page_recarve). Their memory
  // was written then, so the next extension carves them all at once.
  uint32_t carved_before = 0;
  // owner: the page's count of blocks out (`used` without the class's extra one) when its
  // heap last counted the frees into it (page_account in heap/queue.cpp): the frees of its
  // owner's fast path since are the difference, counted without a counter of their own.
  uint32_t accounted = 0;
  // --- the shared line: set when the page gets its owner, read by every thread that frees
  // one of its blocks ---
  alignas(kCacheLineBytes) Heap* heap = nullptr;  // owner; stable while any block of the page is live
  uint8_t* blocks = nullptr;    // address of block 0
  uint32_t reserved = 0;        // blocks the page can hold
  uint32_t block_bytes = 0;
  uint8_t size_class = 0;
  uint8_t unit_count = 0;       // units spanned (pool lock); 0 for no page
  uint8_t heap_bucket = 0;      // remote_bucket_of(heap), for senders: set with `heap`
  OwnerKind owner_kind = OwnerKind::kThread;  // the kind of `heap`: set with it
  // Set with `heap` (heap/hardening.hpp), read by every free: the odd key that encodes the
  // links in free blocks, and the divisor that tells a block's start from a pointer into it
  // with the largest product a start gives (start_divisor - 1, kept apart so that the fast
  // path compares with memory instead of computing it in a register).
  uint64_t link_key = 1;
  uint64_t start_divisor = 0;
  uint64_t start_bound = 0;
  // The thread pointer (the address the CPU's thread register holds: %fs base, TPIDR_EL0) of
  // the thread whose free fast path may put blocks back on this page: the thread that owns
  // `heap`, while it does and the page is in one of its queues; 0 otherwise (a floating page,
  // a parked heap's, a checked one's, the heap profile's). A thread pointer is unique among
  // live threads, and free compares it with its own in one instruction where loading the
  // thread's heap takes two. Written by whoever gives the heap or the page its thread, read
  // by every free (heap/queue.cpp, heap_set_owner_thread).
  uintptr_t owner_thread = 0;
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
  // bit u: unit u belongs to a page that has not touched it yet, and read zero when the page
  // took it (counted as decommitted). The pool sets and clears bits under its lock, a page's
  // owner clears its own (segment_page_touch): atomic.
  std::atomic<uint64_t> untouched_units;
  uint64_t dirty_since_ms;   // when the oldest dirty unit became free
  Segment* next;             // pool list (segments with free units, or the cache)
  Segment* prev;
  Segment* all_next;         // every segment of the pool (segment.cpp, g_all_segments)
  Segment* all_prev;
  // pages[i] describes the page that starts at unit i; which page a unit belongs to is the
  // unit map's to say (segment.hpp). pages[0], the header unit's, stays empty and ownerless:
  // free units name it.
  Page pages[kUnitsPerSegment];
  // Debug mode only, indexed like pages: one word per block of the page, written with atomics
  // by whichever thread allocates or frees the block (see debug.cpp); mapped on the page's
  // first debug allocation. Kept out of Page so that Page stays two cache lines.
  uint32_t* debug_states[kUnitsPerSegment];
  // Bit i of unit u: the i-th OS page of the unit was given back while its page kept live
  // blocks elsewhere, and the blocks that overlap it are on no free list (see sparse.cpp).
  // Written by the page's owner; zero while the unit belongs to no page.
  uint16_t sparse_purged[kUnitsPerSegment];
};
static_assert(sizeof(Segment) <= kUnitBytes, "the header must fit in unit 0");

inline constexpr uint32_t kLargeMagic = 0x4C415247;  // "LARG"
inline constexpr size_t kLargeHeaderBytes = 64;      // keeps large blocks 64-byte aligned

// In front of every large block, at the start of its mapping. The mapping spans whole chunks
// (segment-aligned, segment-sized pieces of address space) so that no memory but ours shares a
// chunk with it: what the chunk map says about a chunk is true of every byte in it.
struct LargeOwner;

struct LargeHeader {
  uint32_t magic;
  uint8_t prof_sampled;     // 1: the heap profile holds the block (see prof.hpp)
  uint8_t alignment_shift;  // log2 of the alignment the block was asked with (kept across realloc)
  void* user;           // the block handed out; nullptr while the mapping sits in the cache
  size_t used_bytes;    // from the header to the end of the usable block (whole OS pages)
  size_t reserve_bytes; // length of the mapping: used_bytes rounded up to whole chunks
  size_t dirty_bytes;   // from the header to the end of what was ever touched and not purged
  uint32_t owner_slot;  // the block's index in owner->headers (under the owner's lock)
  // The last freed block's offset from the mapping's start, so that a second free of it is
  // named as one (0: none, or beyond 4 GiB).
  uint32_t freed_offset;
  // A live block can belong to an owner (a program heap's large blocks, large/large_owner.cpp);
  // a cached mapping has none, and keeps the time it entered the cache in the same word.
  union {
    LargeOwner* owner;  // live: nullptr, or the owner that frees it with the rest
    uint64_t cached_ms; // cached: when it entered the cache
  };
  size_t requested;     // debug mode: bytes asked for (the rest up to the end is a canary)
};
static_assert(sizeof(LargeHeader) <= kLargeHeaderBytes);

}  // namespace tray
