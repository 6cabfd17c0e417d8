#include "heap/remote.hpp"

#include <cstddef>

#include "heap/hardening.hpp"
#include "heap/heap.hpp"
#include "heap/page.hpp"
#include "heap/reuse.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

// The first block of a run says where the run ends and how long it is, in the words after its
// link and its free key (hardening.hpp), so that the owner reads two blocks of a run instead of
// all of them: handing blocks back one by one chased a pointer through lines that the sender
// had just written, one miss after the other. A 16-byte block has no room for it: in that class
// every block is a run of its own, and goes back as before. So is every block of a checked heap
// (debug mode), which fills free blocks and checks the fill when it hands them out again.
//
// Runs are still a chain: the owner learns where a run starts only from the run before it, and
// with random frees most runs are one block, so the drain waited out one miss per block, each
// on a line the sender's core held (a fifth of rptest's time went there). So the block that
// starts a run also names, in blocks of 48 bytes and up, a run started kRemotePrefetchRuns or
// more blocks earlier in its bucket, which lies that far down the chain; the owner prefetches
// it, and keeps up to that many misses under way instead of one. The sender finds it in a ring
// indexed by its block count, so naming costs it a load and two stores per run.
static_assert((kRemotePrefetchRuns & (kRemotePrefetchRuns - 1)) == 0, "a ring indexed by a mask");

// Every link a free block holds (`next`, and `last`) is encoded with the key of the block's own
// page (hardening.hpp), the links that chain runs of different pages included, and so is
// `count`, multiplied by the same key (a run's blocks share a page): a count written after the
// free would otherwise take `used` to zero under live blocks. The owner checks each run before
// it splices it (page_of_linked_block, run_end).
struct RunHeader {
  Block* next;
  uint64_t free_key;
  Block* last;
  uint64_t count;
  Block* ahead;  // a run further down the chain, or nullptr (only in the run's first block)
};

// Nothing names the newest runs of a batch (each `ahead` names an older run), and they are the
// first the owner meets, so it met each with a miss of its own: a batch's newest run lists them
// when its block has room, flagged in its count.
struct BatchHeader {
  RunHeader run;
  Block* newest[kRemotePrefetchRuns];  // the sender's ring as it was sent (nullptr: none)
};
inline constexpr uint64_t kRunListsNewest = uint64_t{1} << 32;

// How much of a RunHeader the blocks of a page hold: none of it, all but `ahead`, or all of it.
enum class Room { kNone, kRun, kAhead };
// A checked heap's free blocks hold debug mode's fill, which a run header would break. The heap
// passed is the sender's or the owner's: every heap of a process is checked or none is. A caller
// whose heap serves the fast paths knows it is not checked, and skips the load.
template <bool kMayBeChecked = true>
TRAY_INLINE Room room_of(const Heap* heap, const Page* page) {
  if (page->block_bytes < offsetof(RunHeader, ahead) ||
      (kMayBeChecked && heap->checked))
    return Room::kNone;
  return page->block_bytes < sizeof(RunHeader) ? Room::kRun : Room::kAhead;
}
TRAY_INLINE RunHeader* header_of(Block* block) { return reinterpret_cast<RunHeader*>(block); }

// A run's count as its header holds it: times its page's link key, so that the sum of an
// encoded count and an encoded 1 is the encoded count plus one.
TRAY_INLINE uint64_t count_encode(const Page* page, uint64_t count) {
  return kHardening ? count * page->link_key : count;
}
TRAY_INLINE uint64_t count_decode(const Page* page, uint64_t stored) {
  return kHardening ? stored * page->link_unkey : stored;
}

// Makes block (of page) a run of one, if it has room for the header.
TRAY_INLINE void start_run(Room room, const Page* page, Block* block, Block* ahead) {
  if (room == Room::kNone) return;
  if (room == Room::kAhead) header_of(block)->ahead = ahead;
  header_of(block)->last = link_encode(page, block);
  header_of(block)->count = count_encode(page, 1);
}

// The links that chain runs, held by a run's last block: encoded with that block's page's key.
void chain_store(Block* holder, Block* target) { link_store(unit_page_of(holder), holder, target); }

// Pushes the list first..last onto the owner's stack of remote frees.
void push_remote(Heap* owner, Block* first, Block* last) {
  Block* head = owner->remote_free.load(std::memory_order_relaxed);
  const Page* last_page = unit_page_of(last);
  do {
    link_store(last_page, last, head);
  } while (!owner->remote_free.compare_exchange_weak(head, first, std::memory_order_release,
                                                     std::memory_order_relaxed));
}

TRAY_NOINLINE void flush_bucket(RemoteBucket& bucket) {
  if (bucket.count == 0) return;
  // run_page is set while the bucket's newest block heads a run.
  if (bucket.run_page != nullptr && bucket.run_page->block_bytes >= sizeof(BatchHeader)) {
    auto* batch = reinterpret_cast<BatchHeader*>(bucket.head);
    for (unsigned i = 0; i < kRemotePrefetchRuns; ++i) batch->newest[i] = bucket.recent[i];
    batch->run.count += count_encode(bucket.run_page, kRunListsNewest);
  }
  push_remote(bucket.target, bucket.head, bucket.tail);
  const RemoteWatch watch = bucket.watch;
  bucket = RemoteBucket{};
  bucket.watch = watch;
}

// The address as a sum of integers: indexing `outgoing` let the compiler work it out again
// for each access to the bucket, seven more instructions in remote_free.
TRAY_INLINE RemoteBucket& bucket_of(Heap* self, const Page* page) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(self->outgoing);
  return *reinterpret_cast<RemoteBucket*>(base + page->heap_bucket * sizeof(RemoteBucket));
}

// Puts a run of `count` blocks, first..last, back on its page: page_free_local for many.
// The senders counted these frees: the page's count of blocks out falls by the run without
// page_account counting them again.
void page_free_run(Heap* heap, Page* page, Block* first, Block* last, uint64_t count) {
  link_store(page, last, page->free);
  page->free = first;
  page->came_home = true;
  page->accounted -= uint32_t(count);
  if (TRAY_UNLIKELY(page->floating)) {  // the first block back brings it into its queue
    page->used = 0;
    heap_page_event(heap, page);
    if (--count == 0) return;
  }
  page->used -= uint32_t(count);
  if (TRAY_UNLIKELY(page->used == 0)) heap_page_event(heap, page);
}

// Adds block to the bucket, which gathers for its page's owner.
template <bool kMayBeChecked>
TRAY_INLINE void bucket_append(const Heap* self, RemoteBucket& bucket, Page* page, Block* block) {
  // In locals: the stores into the block below could alias the bucket, as far as the compiler
  // knows, and it would load them again.
  Block* head = bucket.head;
  const uint32_t count = bucket.count;
  link_store(page, block, head);
  if (bucket.run_page == page) {  // joins the newest run, and heads it from now on
    const RunHeader& run = *header_of(head);
    header_of(block)->last = run.last;  // encoded with the same page's key
    header_of(block)->count = run.count + count_encode(page, 1);  // one more, still encoded
  } else {
    // A run started kRemotePrefetchRuns or more blocks back (or nullptr), named by the new run
    // and replaced by it.
    Block*& back = bucket.recent[count & (kRemotePrefetchRuns - 1)];
    const Room room = room_of<kMayBeChecked>(self, page);
    start_run(room, page, block, back);
    back = block;
    bucket.run_page = room != Room::kNone ? page : nullptr;
  }
  bucket.head = block;
  bucket.count = count + 1;
  if (count + 1 == kRemoteBatchBlocks) flush_bucket(bucket);
}

// The two sends that leave the common path, as tail calls out of remote_send: with a call
// in its body, remote_send saved and restored six registers on every foreign free.
TRAY_NOINLINE void send_alone(Heap* owner, Page* page, Block* block) {
  start_run(room_of(owner, page), page, block, nullptr);
  push_remote(owner, block, block);
}

TRAY_NOINLINE void send_retargeted(Heap* self, Page* page, Block* block) {
  RemoteBucket& bucket = bucket_of(self, page);
  flush_bucket(bucket);
  bucket.target = page->heap;
  // Every batch starts here (a sent bucket has no target), so the watch follows the owners
  // the thread sends to, without a store on the free that joins a batch.
  if (bucket.watch.owner != page->heap) bucket.watch = {page->heap};
  bucket.tail = block;
  remote_send(self, page, block);
}

// The run that starts at `run` (a block of page): its last block and its length.
TRAY_INLINE Block* run_end(const Page* page, Block* run, Room room, uint32_t* count) {
  if (room == Room::kNone) {
    *count = 1;
    return run;
  }
  const RunHeader& header = *header_of(run);
  *count = uint32_t(count_decode(page, header.count) & (kRunListsNewest - 1));
  Block* last = link_decode(page, header.last);
  if constexpr (kHardening) {
    if (TRAY_UNLIKELY(*count == 0 || *count > page->reserved || !is_free_block(page, last)))
      report_corrupted_list(page, last, run);
  }
  return last;
}

}  // namespace

// The runs of each page met in a taken stack, chained into one run per page: open addressing
// over a few hundred pages (runs of pages past that, and of pages whose blocks have no room for
// a run header, stay as they were). 8 KiB: a heap maps its own (Heap::reclaim_table) rather
// than put it on the stack of a thread that may have 16 KiB in all.
class ReclaimTable {
 public:
  struct Chain {
    const Page* page;
    Block* first;
    Block* last;
    uint64_t blocks;
  };
  // The page's chain, or nullptr when the table is full; `used` counts the pages added (kept
  // by the caller, so that the table is 8 KiB exactly).
  Chain* find_or_add(const Page* page, unsigned& used) {
    unsigned i = hash(page);
    while (chains_[i].page != nullptr && chains_[i].page != page) i = (i + 1) & kMask;
    if (chains_[i].page == page) return &chains_[i];
    if (used == kMaxUsed) return nullptr;
    ++used;
    chains_[i] = {page, nullptr, nullptr, 0};
    return &chains_[i];
  }
  Chain* begin() { return chains_; }
  Chain* end() { return chains_ + kRemoteReclaimPages; }
  // In place: a temporary to copy from would be the 8 KiB on the stack this table avoids.
  void clear() {
    for (Chain& chain : chains_) chain = {};
  }

 private:
  static_assert((kRemoteReclaimPages & (kRemoteReclaimPages - 1)) == 0, "indexed by a mask");
  static constexpr unsigned kMask = kRemoteReclaimPages - 1;
  static constexpr unsigned kMaxUsed = kRemoteReclaimPages * 3 / 4;  // keeps probes short
  // Descriptors are 64 bytes apart: the bits above that, mixed.
  static unsigned hash(const Page* page) {
    const uint64_t key = (reinterpret_cast<uintptr_t>(page) >> 6) * 0x9E3779B97F4A7C15ULL;
    return unsigned(key >> 32) & kMask;
  }

  Chain chains_[kRemoteReclaimPages] = {};
};
static_assert(sizeof(ReclaimTable) == kRemoteReclaimPages * sizeof(ReclaimTable::Chain),
              "the slots and nothing else: 8 KiB, two OS pages");

namespace {

// The heap's table, empty; nullptr if it cannot be mapped.
ReclaimTable* reclaim_table_of(Heap* self) {
  if (self->reclaim_table == nullptr) return self->reclaim_table = new_metadata<ReclaimTable>();
  self->reclaim_table->clear();
  return self->reclaim_table;
}

// A list built by appending runs (first..last), in the order they come.
struct RunList {
  Block* first = nullptr;
  Block* last = nullptr;
  void append(Block* run_first, Block* run_last) {
    if (last != nullptr) chain_store(last, run_first);
    else first = run_first;
    last = run_last;
  }
};

// A page can leave its owner without the owner's knowledge when every one of its blocks lies
// in a stack that the taker holds, and the owner floated it (full, in no queue): the program
// holds none of its blocks, so no local free reaches it; none is in a bucket or on the stack,
// so no drain does; and the owner reaches a floating page no other way. The owner's last
// write to it was the release store of `floating`, which the acquire load here pairs with.
// Every later write to `floating` (a block coming back) happens before the taker can hold
// that block again, so a page read as floating was not taken back in since.
bool page_all_in_hand(const Page* page, uint64_t blocks_in_hand) {
  // `capacity` after `floating`: the owner wrote it before, and never while the page floats.
  return __atomic_load_n(&page->floating, __ATOMIC_ACQUIRE) && blocks_in_hand == page->capacity;
}

// Puts first.. (a list ending in nullptr, whose last block is not known) back on the owner's
// stack. What others pushed since the stack was taken goes in front: walked run by run to
// its end, and that is a few batches at most.
void push_remote_unbounded(Heap* owner, Block* first) {
  Block* expected = nullptr;
  while (!owner->remote_free.compare_exchange_weak(expected, first, std::memory_order_release,
                                                   std::memory_order_relaxed)) {
    if (expected == nullptr) continue;
    Block* theirs = owner->remote_free.exchange(nullptr, std::memory_order_acquire);
    if (theirs != nullptr) {
      Block* last = theirs;
      for (uint32_t count;;) {
        const Page* page = page_of_linked_block(owner, last, nullptr);
        last = run_end(page, last, room_of(owner, page), &count);
        Block* next = link_load(page, last);
        if (next == nullptr) break;
        page_of_linked_block(owner, next, last);
        last = next;
      }
      chain_store(last, first);
      first = theirs;
    }
    expected = nullptr;
  }
}

// Takes owner's stack; gives the pages whose every block is in it to the pool, and pushes the
// rest back for the owner, one run per page: a stack that is looked at again (its owner still
// idle) costs a step per page, not per block, and the owner's drain one splice per page.
// A look walks at most kRemoteReclaimRuns runs and kRemoteReclaimPages pages: the rest of the
// stack goes back as it was, for later looks to reach once the runs before it are chained.
// Returns the list pushed back if the look walked all of it (else nullptr), for the caller to
// tell whether a later look would find anything new.
Block* reclaim_pages(Heap* owner, ReclaimTable& pages) {
  Block* run = owner->remote_free.exchange(nullptr, std::memory_order_acquire);
  if (run == nullptr) return nullptr;
  RunList unchained;
  unsigned used = 0;
  const Block* holder = nullptr;
  for (uint32_t walked = 0; run != nullptr && walked < kRemoteReclaimRuns; ++walked) {
    Page* page = page_of_linked_block(owner, run, holder);
    const Room room = room_of(owner, page);
    ReclaimTable::Chain* chain = nullptr;
    if (room != Room::kNone && (chain = pages.find_or_add(page, used)) == nullptr) break;
    uint32_t count;
    Block* last = run_end(page, run, room, &count);
    Block* next = link_load(page, last);
    if (chain != nullptr) {
      if (chain->last != nullptr) link_store(page, chain->last, run);
      else chain->first = run;
      chain->last = last;
      chain->blocks += count;
    } else {
      unchained.append(run, last);
    }
    holder = last;
    run = next;
  }
  RunList kept;
  for (ReclaimTable::Chain& chain : pages) {
    if (chain.page == nullptr) continue;
    if (page_all_in_hand(chain.page, chain.blocks)) {
      chain.first = nullptr;  // taken: given to the pool below
      continue;
    }
    // The chain's first block heads it now (without a list of the newest runs to prefetch).
    header_of(chain.first)->last = link_encode(chain.page, chain.last);
    header_of(chain.first)->count = count_encode(chain.page, chain.blocks);
    kept.append(chain.first, chain.last);
  }
  if (unchained.first != nullptr) kept.append(unchained.first, unchained.last);
  // The owner's blocks first: giving pages to the pool takes its lock, once a page.
  if (run != nullptr) {  // the part not walked
    if (kept.first != nullptr) chain_store(kept.last, run);
    else kept.first = run;
    push_remote_unbounded(owner, kept.first);
  } else if (kept.first != nullptr) {
    push_remote(owner, kept.first, kept.last);
  }
  for (ReclaimTable::Chain& chain : pages) {
    if (chain.page == nullptr || chain.first != nullptr) continue;
    auto* page = const_cast<Page*>(chain.page);
    __atomic_store_n(&page->floating, false, __ATOMIC_RELAXED);  // takers read it atomically
    page->used = 0;
    page->free = list_end();
    page_release(page);
  }
  return run == nullptr ? kept.first : nullptr;
}

}  // namespace

void remote_send(Heap* self, Page* page, Block* block) noexcept {
  Heap* owner = page->heap;
  // A thread that never allocated has nowhere to gather: the block goes at once, alone.
  if (TRAY_UNLIKELY(self == &g_empty_heap)) return send_alone(owner, page, block);
  RemoteBucket& bucket = bucket_of(self, page);
  if (TRAY_UNLIKELY(bucket.target != owner)) return send_retargeted(self, page, block);
  bucket_append<true>(self, bucket, page, block);
}

// One test covers every unusual case: no bucket gathers for the profile's heap or a program
// heap's part (heap_free_remote hands their blocks on before any send: OwnerKind on the page),
// nor holds a null target where a page has an owner, and a bucket that must change owner goes
// through remote_send as before. So the common free of another heap's block is one function
// with no call in it.
void remote_free(Block* block, Page* page, Heap* self) noexcept {
  Heap* owner = page->heap;
  RemoteBucket& bucket = bucket_of(self, page);
  if (TRAY_UNLIKELY(bucket.target != owner || has_remote_frees(self)))
    return heap_free_remote(page, block);
  free_key_check_and_set(page, block);
  counter_add(self->counters.frees[page->size_class], 1);
  counter_add(self->counters.remote_frees, 1);
  // Kept for this thread's own next allocations where it may be (heap/reuse.hpp), a tail call:
  // with the keeping in its body, this function saved and restored two more registers on
  // every free of another heap's block.
  if (TRAY_UNLIKELY(reuse_wanted(self))) return reuse_free(self, page, block);
  bucket_append<false>(self, bucket, page, block);
}

void remote_flush(Heap* self) noexcept {
  for (RemoteBucket& bucket : self->outgoing)
    if (bucket.count != 0) flush_bucket(bucket);  // out of line: skip the call for an empty one
}

void remote_flush_and_reclaim(Heap* self) noexcept {
  remote_flush(self);
  if (self->checked) return;  // its free blocks are filled and checked one by one
  uint32_t now = 0;
  for (RemoteBucket& bucket : self->outgoing) {
    RemoteWatch& watch = bucket.watch;
    Heap* owner = watch.owner;
    if (owner == nullptr) continue;
    // Nothing waiting, or only what was put back last time: nothing to look at.
    Block* waiting = owner->remote_free.load(std::memory_order_relaxed);
    if (waiting == nullptr || waiting == watch.left) continue;
    const uint32_t drains = owner->drains.load(std::memory_order_relaxed);
    if (now == 0) now = uint32_t(os::now_ms()) | 1;  // never 0, which means "not yet"
    if (drains != watch.drains || watch.since_ms == 0) {
      watch.drains = drains;
      watch.since_ms = now;
      continue;
    }
    if (now - watch.since_ms < kRemoteReclaimIdleMs) continue;
    ReclaimTable* table = reclaim_table_of(self);
    if (table == nullptr) return;
    watch.left = reclaim_pages(owner, *table);
    watch.since_ms = now;
  }
}

void remote_drain(Heap* heap) noexcept {
  Block* run = heap->remote_free.exchange(nullptr, std::memory_order_acquire);
  heap->drains.store(heap->drains.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  const Block* holder = nullptr;
  while (run != nullptr) {
    Page* page = page_of_linked_block(heap, run, holder);
    const Room room = room_of(heap, page);
    if (room == Room::kNone) {
      Block* next = link_load(page, run);
      page->came_home = true;
      --page->accounted;  // counted by its sender (page_free_run)
      page_free_local(heap, page, run);
      holder = run;
      run = next;
      continue;
    }
    uint32_t count;
    Block* last = run_end(page, run, room, &count);
    if (room == Room::kAhead) {
      if (count_decode(page, header_of(run)->count) & kRunListsNewest) {
        for (Block* newest : reinterpret_cast<const BatchHeader*>(run)->newest)
          if (newest != nullptr) __builtin_prefetch(newest);
      }
      // The block that started the run holds `ahead`; blocks that joined later did not copy it.
      if (Block* ahead = header_of(last)->ahead; ahead != nullptr) __builtin_prefetch(ahead);
    }
    Block* next = link_load(page, last);
    // The next run's header lies in a line the sender wrote: start that miss now.
    __builtin_prefetch(next);
    page_free_run(heap, page, run, last, count);
    holder = last;
    run = next;
  }
}

}  // namespace tray
