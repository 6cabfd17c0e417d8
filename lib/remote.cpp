#include "remote.hpp"

#include <cstddef>

#include "heap.hpp"
#include "options.hpp"
#include "segment.hpp"

namespace tray {

namespace {

// The first block of a run says where the run ends and how long it is, in the words after its
// link and its free key (free_key.hpp), so that the owner reads two blocks of a run instead of
// all of them: handing blocks back one by one chased a pointer through lines that the sender
// had just written, one miss after the other. A 16-byte block has no room for it: in that class
// every block is a run of its own, and goes back as before. So is every block in debug mode,
// which fills free blocks and checks the fill when it hands them out again (the mode is fixed
// at the allocator's first use, so sender and owner agree).
//
// Runs are still a chain: the owner learns where a run starts only from the run before it, and
// with random frees most runs are one block, so the drain waited out one miss per block, each
// on a line the sender's core held (a fifth of rptest's time went there). So a run's first
// block also names, in blocks of 48 bytes and up, the run kRemotePrefetchRuns further down the
// chain, which the sender knows from a ring of its newest runs; the owner prefetches it, and
// keeps that many misses under way instead of one.
static_assert((kRemotePrefetchRuns & (kRemotePrefetchRuns - 1)) == 0, "a ring indexed by a mask");

struct RunHeader {
  Block* next;
  uint64_t free_key;
  Block* last;
  uint64_t count;
  Block* ahead;  // a run further down the chain, or nullptr (blocks of 48 bytes and up)
};

// How much of a RunHeader the blocks of a page hold: none of it, all but `ahead`, or all of it.
enum class Room { kNone, kRun, kAhead };
TRAY_INLINE Room room_of(const Page* page) {
  if (page->block_bytes < offsetof(RunHeader, ahead) || debug_mode()) return Room::kNone;
  return page->block_bytes < sizeof(RunHeader) ? Room::kRun : Room::kAhead;
}
TRAY_INLINE RunHeader* header_of(Block* block) { return reinterpret_cast<RunHeader*>(block); }

// Makes block a run of one, if it has room for the header.
TRAY_INLINE void start_run(Room room, Block* block, Block* ahead) {
  if (room == Room::kNone) return;
  header_of(block)->last = block;
  header_of(block)->count = 1;
  if (room == Room::kAhead) header_of(block)->ahead = ahead;
}

// Pushes the list first..last onto the owner's stack of remote frees.
void push_remote(Heap* owner, Block* first, Block* last) {
  Block* head = owner->remote_free.load(std::memory_order_relaxed);
  do {
    last->next = head;
  } while (!owner->remote_free.compare_exchange_weak(head, first, std::memory_order_release,
                                                     std::memory_order_relaxed));
}

void flush_bucket(RemoteBucket& bucket) {
  if (bucket.count == 0) return;
  push_remote(bucket.target, bucket.head, bucket.tail);
  bucket = RemoteBucket{};
}

// Heaps are cache-line aligned and thousands of bytes apart: the bits above the line offset,
// mixed by a multiplicative hash, spread owners over the buckets.
RemoteBucket& bucket_for(Heap* self, const Heap* owner) {
  const uint64_t key = (reinterpret_cast<uintptr_t>(owner) >> 6) * 0x9E3779B97F4A7C15ULL;
  return self->outgoing[key >> (64 - kRemoteBucketShift)];
}

// Puts a run of `count` blocks, first..last, back on its page: page_free_local for many.
void page_free_run(Heap* heap, Page* page, Block* first, Block* last, uint64_t count) {
  last->next = page->free;
  page->free = first;
  if (TRAY_UNLIKELY(page->floating)) {  // the first block back brings it into its queue
    page->used = 0;
    heap_page_event(heap, page);
    if (--count == 0) return;
  }
  page->used -= uint32_t(count);
  if (TRAY_UNLIKELY(page->used == 0)) heap_page_event(heap, page);
}

}  // namespace

void remote_send(Heap* self, Page* page, Block* block) noexcept {
  const Room room = room_of(page);
  if (self == &g_empty_heap) {  // a thread that never allocated has nowhere to gather
    start_run(room, block, nullptr);
    push_remote(page->heap, block, block);
    return;
  }
  RemoteBucket& bucket = bucket_for(self, page->heap);
  if (bucket.target != page->heap) {
    flush_bucket(bucket);
    bucket.target = page->heap;
    bucket.tail = block;
  }
  block->next = bucket.head;
  constexpr uint32_t kRingMask = kRemotePrefetchRuns - 1;
  if (bucket.run_page == page) {  // joins the newest run, and heads it from now on
    const RunHeader& run = *header_of(bucket.head);
    RunHeader& header = *header_of(block);
    header.last = run.last;
    header.count = run.count + 1;
    if (room == Room::kAhead) header.ahead = run.ahead;
    bucket.recent[(bucket.recent_slot - 1) & kRingMask] = block;
  } else {
    // The slot holds the run kRemotePrefetchRuns back, which the new one names and replaces.
    Block*& back = bucket.recent[bucket.recent_slot];
    start_run(room, block, back);
    back = block;
    bucket.run_page = room != Room::kNone ? page : nullptr;
    bucket.recent_slot = (bucket.recent_slot + 1) & kRingMask;
  }
  bucket.head = block;
  if (++bucket.count == kRemoteBatchBlocks) flush_bucket(bucket);
}

void remote_flush(Heap* self) noexcept {
  for (RemoteBucket& bucket : self->outgoing) flush_bucket(bucket);
}

void remote_drain(Heap* heap) noexcept {
  Block* run = heap->remote_free.exchange(nullptr, std::memory_order_acquire);
  while (run != nullptr) {
    Page* page = page_of(segment_of(run), run);
    const Room room = room_of(page);
    if (room == Room::kNone) {
      Block* next = run->next;
      page_free_local(heap, page, run);
      run = next;
      continue;
    }
    const RunHeader& header = *header_of(run);
    if (room == Room::kAhead && header.ahead != nullptr) __builtin_prefetch(header.ahead);
    Block* last = header.last;
    Block* next = last->next;
    // The next run's header lies in a line the sender wrote: start that miss now.
    __builtin_prefetch(next);
    page_free_run(heap, page, run, last, header.count);
    run = next;
  }
}

}  // namespace tray
