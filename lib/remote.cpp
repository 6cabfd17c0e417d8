#include "remote.hpp"

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
struct RunHeader {
  Block* next;
  uint64_t free_key;
  Block* last;
  uint64_t count;
};

TRAY_INLINE bool has_header(const Page* page) {
  return page->block_bytes >= sizeof(RunHeader) && !debug_mode();
}
TRAY_INLINE RunHeader* header_of(Block* block) { return reinterpret_cast<RunHeader*>(block); }

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
  if (self == &g_empty_heap) {  // a thread that never allocated has nowhere to gather
    if (has_header(page)) *header_of(block) = {nullptr, header_of(block)->free_key, block, 1};
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
  if (bucket.run_page == page) {  // joins the newest run, and heads it from now on
    const RunHeader& run = *header_of(bucket.head);
    header_of(block)->last = run.last;
    header_of(block)->count = run.count + 1;
  } else if (has_header(page)) {
    header_of(block)->last = block;
    header_of(block)->count = 1;
    bucket.run_page = page;
  } else {
    bucket.run_page = nullptr;
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
    if (!has_header(page)) {
      Block* next = run->next;
      page_free_local(heap, page, run);
      run = next;
      continue;
    }
    const RunHeader& header = *header_of(run);
    Block* last = header.last;
    Block* next = last->next;
    // The next run's header lies in a line the sender wrote: start that miss now.
    __builtin_prefetch(next);
    page_free_run(heap, page, run, last, header.count);
    run = next;
  }
}

}  // namespace tray
