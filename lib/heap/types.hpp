// The structures of thread heaps, with the rules for who may touch what.
//
//  heap = one per thread: a queue of pages per size class; heaps outlive their threads and
//         are handed to the next thread that starts
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "heap/config.hpp"
#include "large/large.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "span/span.hpp"
#include "stats/stats.hpp"

namespace tray {

struct Quarantine;
class ReclaimTable;
struct ProgramHeap;

// The samplers that pick allocations out of the byte stream (see sample_countdown.hpp), as bits.
enum Sampler : unsigned { kSamplerProf = 1u << 0, kSamplerGuard = 1u << 1 };
inline constexpr unsigned kSamplerCount = 2;

// Each heap counts the bytes allocated down in one countdown per stream: a size class, or
// kSampleStreamLarge for the requests served away from the small pools (sample_countdown.hpp).
inline constexpr unsigned kSampleStreamLarge = kSizeClassCount;
inline constexpr unsigned kSampleStreams = kSizeClassCount + 1;

// A heap's sampling state beside its countdowns. Written and read by the owner thread only.
struct SampleState {
  int64_t armed[kSampleStreams]{};    // the stream's countdown when it was last armed
  int64_t left[kSampleStreams][kSamplerCount]{};  // per sampler: bytes to go when armed; <0: off
  uint64_t rng = 0;                   // xorshift state for the exponential draws
  uint32_t generation = 0;            // sample options generation the heap was armed for
};

// The blocks a class hands out next, where malloc's fast path pops them without reading the
// page: the free list of the class's page (`page`, its queue's head) moved here whole on a slow
// path, with the page's limit and link key beside it. Blocks freed meanwhile by the owner go
// onto the page's own list (Page::free), and come here when this list runs dry, so a pop
// touches one line of the heap and a free one line of the page. `page` is the shared empty page
// while the queue is empty; its limit of 0 fails every pop. 32 bytes, so that the class's
// index times 4, which a byte holds, addresses it with the scale of 8 an instruction has.
struct AllocSlot {
  Block* head = nullptr;  // links encoded with the page's key; ends at list_end()
  uintptr_t limit = 0;    // page->limit
  uint64_t unkey = 1;     // page->link_unkey
  Page* page = nullptr;
};
static_assert(sizeof(AllocSlot) == 32);
inline constexpr unsigned kSlotIndexScale = sizeof(AllocSlot) / 8;  // slot index = class * 4
static_assert(kSizeClassCount * kSlotIndexScale <= 256, "a slot index fits a byte");

// What the slow paths keep for a class's slot, 32 bytes like the slot, so that the slot's
// index addresses it too. Owner thread only.
struct alignas(32) SlotBook {
  // Bytes the thread may still allocate from the class before its next sampled allocation:
  // each block the slot takes in is charged its bytes (heap.cpp, slot_install). INT64_MAX
  // while no sampler is on, which no program allocates.
  int64_t countdown = INT64_MAX;
  // The blocks of the slot's list past a sample point: the first of them goes to the
  // allocation the samplers pick, when the slot runs dry; nullptr when none is pending; or
  // reuse_mark() when none is but the slot must take the slow path when it runs dry all the
  // same: a reuse run of the class waits, or the slot holds one (heap/reuse.hpp). The quick
  // refill (heap_malloc_miss) tests this field already, so that costs it nothing.
  Block* sample_rest = nullptr;
  uint32_t sample_rest_blocks = 0;
  // The blocks the slot took in last (those it holds, those past a sample point, those handed
  // out since), and the size of the request that made it take them in: counted as that many
  // allocations of that size once they are all handed out (slot_count_load) or the rest go
  // back to their page (slot_return).
  uint32_t loaded = 0;
  uint32_t request_bytes = 0;
};
static_assert(sizeof(SlotBook) == sizeof(AllocSlot));
// SlotBook::sample_rest's mark: no block lies at address 1.
TRAY_INLINE Block* reuse_mark() { return reinterpret_cast<Block*>(uintptr_t{1}); }
// Whether blocks past a sample point wait (not nullptr, nor the mark).
TRAY_INLINE bool has_sample_rest(const SlotBook& book) {
  return reinterpret_cast<uintptr_t>(book.sample_rest) > 1;
}

namespace detail {
constexpr auto make_slot_of_coarse() {
  std::array<uint8_t, kClassTables.class_of_coarse.size()> table{};
  for (size_t i = 0; i < table.size(); ++i)
    table[i] = uint8_t(kClassTables.class_of_coarse[i] * kSlotIndexScale);
  return table;
}
}  // namespace detail
// size_class_coarse's table with the classes times kSlotIndexScale, for the fast path.
inline constexpr auto kSlotOfCoarse = detail::make_slot_of_coarse();
TRAY_INLINE size_t slot_of_coarse(size_t size) {
  return kSlotOfCoarse[(size + kCoarseStepBytes - 1) >> kCoarseStepShift];
}

// One queue of pages per size class; its head is the class's slot's page.
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

// Blocks of one page of another heap that this heap's thread freed, kept for its own next
// allocations of the class instead of being sent home (heap/reuse.hpp): the slot takes them
// in as it takes its page's list (refill.cpp), with that page's limit and key. A list of one
// page's blocks, linked with its key and ending at list_end(). Owner thread only.
struct ReuseRun {
  Page* page = nullptr;
  Block* head = nullptr;
  uint32_t count = 0;     // 0: none (page and head mean nothing)
  uint32_t limit = 0;     // the most it may hold: kReuseRunBytes of the page's blocks
};

struct Heap {
  explicit constexpr Heap(Page* empty_page) {
    for (auto& slot : slots) slot.page = empty_page;
    for (unsigned stream = 0; stream < kSampleStreams; ++stream) sampling.armed[stream] = INT64_MAX;
    for (size_t size = 0; size <= kLookupLimitBytes; ++size)
      slot_of_size[size] = uint8_t(kClassTables.class_of_lookup[size] * kSlotIndexScale);
  }

  // First, so that the fast path reaches them with small offsets from the heap pointer.
  AllocSlot slots[kSizeClassCount];
  // The size -> slot index table up to kLookupLimitBytes (the class times kSlotIndexScale),
  // copied into every heap: the fast path reaches it from the heap pointer it holds, where a
  // global table costs it one more instruction (loading the table's address).
  uint8_t slot_of_size[kLookupLimitBytes + 1];
  // What the slow paths keep for each class's slot, beside it (heap/types.hpp, SlotBook).
  SlotBook books[kSizeClassCount];
  // The countdown of kSampleStreamLarge (a class's is in its SlotBook).
  int64_t large_countdown = INT64_MAX;
  PageQueue queues[kSizeClassCount];
  Heap* next_abandoned = nullptr;    // parked without a thread (g_parked in heap.cpp)
  uint64_t parked_ms = 0;            // when it was parked (written before it is)
  Heap* next_created = nullptr;      // every heap ever made, newest first; never unlinked
  Quarantine* quarantine = nullptr;  // debug mode: blocks freed but not yet reusable
  // Debug mode's heap (HeapUse::kChecked), set when a thread takes the heap: its blocks come and
  // go only through the debug layer, which keeps their contents and states. So the heap keeps
  // every page it empties, in its class and with its free list (no recarve, no release, no
  // sparse pass), sends no run headers in free blocks, reclaims nothing from idle owners, and
  // samples nothing.
  bool checked = false;
  // checked, or the heap profile's: its allocations and frees are counted when they are made
  // (heap/queue.hpp, heap_counts_at_call). Set with `checked` and `kind`.
  bool counts_at_call = false;
  // The thread pointer of the thread whose fast paths use this heap (os::thread_pointer), which
  // its queued pages carry (Page::owner_thread); 0 while none does (parked, checked, the heap
  // profile's). Written by that thread, or by whoever binds or unbinds a part.
  uintptr_t owner_thread = 0;
  size_t retained_bytes = 0;         // empty pages kept for reuse (see kHeapRetainedBytes)
  // Parked with free blocks of big classes whose tails may be in memory: a collection gives
  // them back once the heap has waited kPurgeDelayMs for a thread (heap.cpp).
  bool big_free_held = false;
  // Bytes of big blocks the owner may free before a pass over the big classes (tails.cpp):
  // what the last pass left of the heap's budget for the tails of free blocks.
  int64_t big_free_room = int64_t(kHeapBigFreeFloorBytes);
  // The most bytes live in the big classes' blocks lately, as the passes over them saw it, and
  // when a big class was last allocated from, as far as they can tell.
  RecentPeak<kPoolHoldWindowMs> big_live_peak;
  uint64_t big_busy_ms = 0;
  uint64_t big_pass_ms = 0;  // when that pass was
  // Per big class, the one empty page it keeps beside the page it allocates from (tails.cpp),
  // or nullptr: a page of a few blocks empties often, and the pool would see it come and go.
  Page* big_empty[kSizeClassCount - kFirstBigClass] = {};
  // Per big class, its slot's list and its count of allocations as the last pass over the big
  // classes saw them: either moves when the class is allocated from (tails.cpp).
  Block* big_seen_slot[kSizeClassCount - kFirstBigClass] = {};
  uint64_t big_seen_allocations[kSizeClassCount - kFirstBigClass] = {};
  // Blocks of each big class the heap asked for while it had no page of the class, since
  // big_asked_since_ms (a window of the purge delay): its first page once they are enough.
  uint8_t big_asked[kSizeClassCount - kFirstBigClass] = {};
  uint64_t big_asked_since_ms = 0;
  uint64_t sparse_pass_ms = 0;       // the last pass over sparse pages (sparse.cpp)
  // Per class, the slot's list and the head page's free list as a sparse pass last saw them,
  // and since when the passes have seen them so: a head neither allocated from nor freed into
  // for kSparseHeadIdleMs is looked at like the other pages (sparse.cpp).
  Block* sparse_head_slot[kSizeClassCount] = {};
  Block* sparse_head_free[kSizeClassCount] = {};
  uint64_t sparse_head_since_ms[kSizeClassCount] = {};
  // Per class, when a sparse pass last saw it take a new page (sparse_delay_ms).
  uint64_t sparse_class_busy_ms[kSizeClassCount] = {};
  // Blocks this heap's thread freed into other heaps, gathered per owner so that frees to
  // several owners, interleaved, still cost one compare-and-swap per batch (see RemoteBucket).
  RemoteBucket outgoing[kRemoteBuckets];
  // Per class, blocks of other heaps' pages freed by this heap's thread, for its own next
  // allocations: a run per page, kReuseWays of them, chosen by the page (heap/reuse.hpp).
  ReuseRun reuse[kSizeClassCount][kReuseWays];
  // Whether the thread keeps what it frees of others' blocks at all: decided every
  // kReuseEpochFrees frees of others' blocks from what the counters saw (heap/reuse.cpp,
  // reuse_look); the counters then (`reuse_mark_*`), and when the next look is due.
  bool reuse_on = false;
  // Frees of others' blocks until one takes the slow path that keeps blocks or looks: 1 while
  // keeping is on, else what is left of the span (heap/reuse.cpp, reuse_free).
  uint32_t reuse_left = 1;
  size_t reuse_bytes = 0;  // what the runs hold, at most kReuseHeapBytes
  uint8_t reuse_epochs = 0;  // looks since reuse went on, or off
  uint64_t reuse_next_look = kReuseEpochFrees;
  uint64_t reuse_mark_frees = 0;
  uint64_t reuse_mark_remote = 0;
  uint64_t reuse_mark_allocations = 0;
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

  // --- parts of program heaps (program.hpp); a thread's heap uses only bound_parts ---
  OwnerKind kind = OwnerKind::kThread;  // fixed when the heap is made
  // The program heap this part serves: set (release) when a thread takes it for the heap, and
  // cleared (release) by the heap's destroyer, both under the heap's lock.
  // nullptr: spare, or its heap destroyed and its thread not yet told.
  std::atomic<ProgramHeap*> program{nullptr};
  // The thread heap of the thread this part serves (nullptr: none): written under the program
  // heap's lock, or by that thread alone once `program` is cleared; read by frees, which
  // compare it with their own.
  std::atomic<Heap*> bound{nullptr};
  Heap* next_part = nullptr;     // the program heap's parts (its lock); the spare parts
  Heap* next_bound = nullptr;    // the parts its thread is bound to (that thread only)
  Heap* bound_parts = nullptr;   // a thread's heap: the first of the parts it is bound to
  // A thread's heap: the part of the last heap it destroyed, with that heap's warm pages,
  // which its next heap takes first (that thread only).
  Heap* spare_part = nullptr;
  // A part's full pages (floating), linked through Page::next/prev: a reset must find every
  // page, and no queue holds these.
  Page* full_pages = nullptr;
  // A part's units in pages (its owner, or a reset); dumps add them up per program heap.
  uint64_t page_units = 0;
  // The part's counters when it joined its program heap or the heap was last reset: what
  // was allocated into and freed from the heap since is the difference.
  HeapCounters base;
};

// A heap the program creates (tray_heap_t, traymalloc.h). Each thread that allocates into it
// does so through a part of its own, a Heap that no other thread allocates from, so the fast
// paths are a thread heap's; frees from other threads go straight onto the part's remote
// stack (no bucket gathers for a part), so that a reset finds every block freed before it
// there. Its large blocks are in `large`. Never unmapped: destroyed ones are reused.
struct ProgramHeap {
  static constexpr uint32_t kLive = 0x48454150;  // "HEAP"
  std::atomic<uint32_t> magic{0};     // kLive while the program may use it
  os::Mutex lock;                     // parts, binding, reset and destroy
  Heap* parts = nullptr;
  LargeOwner large;
  // Per class, its blocks freed on slow paths (by other threads, or by a part's thread while
  // another heap is its default): its parts' own counters see only their fast-path frees.
  std::atomic<uint64_t> freed[kSizeClassCount] = {};
  // Debug mode: threads inside an allocation into it, for reset and destroy to report.
  std::atomic<uint32_t> allocating{0};
  uint64_t serial = 0;                // numbers heaps in dumps: the n-th tray_heap_new
  ProgramHeap* next_created = nullptr;  // every program heap ever made, never unlinked
  ProgramHeap* next_spare = nullptr;    // destroyed, waiting to be reused
};

}  // namespace tray
