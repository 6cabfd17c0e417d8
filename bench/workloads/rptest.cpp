// rptest: threads that malloc, free and realloc blocks of 16..8000 B at random, and every other
// iteration pass a fresh batch of blocks to another thread, which frees or reallocs them.
//
// Models rpmalloc's benchmark (Mattias Jansson) as mimalloc-bench runs it ("rptest N 0 1 2 500
// 1000 100 8 16000": random sizes falling off linearly, a cross-thread batch every 2nd loop).
// Each thread owns 1000 slots. Every loop it frees 20..80 random slots, takes the batches other
// threads sent it, then fills 30..100 random slots (freeing what was there, or, one time in
// eight, reallocating it to the new size); every second loop it also allocates as many blocks
// again into a batch (itself two heap blocks: the batch and its array) and pushes it onto the
// inbox of the next thread, a lock-free stack. The receiver frees three of every four blocks it
// gets and reallocs the fourth into one of its own slots, so blocks are freed and resized far
// from where they were allocated, in mid-sized classes (up to 8000 B) where per-size-class
// pages hold fewer blocks. rptest itself does not realloc; the reallocs are ours.
//
// Check: every block is stamped when allocated; the stamp is verified before every free and
// realloc, and what a realloc kept of it after; every block sent is received.
// Ops: one malloc, free or realloc. Default: 2 threads, 40000 loops in all (split between the
// threads).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kSlotsPerThread = 1000;
constexpr size_t kMinBytes = 16;
constexpr size_t kMaxBytes = 8000;
constexpr uint64_t kFreeOpsMin = 20;
constexpr uint64_t kFreeOpsMax = 80;
constexpr uint64_t kAllocOpsMin = 30;
constexpr uint64_t kAllocOpsMax = 100;
constexpr unsigned kCrossEvery = 2;       // loops between batches sent to another thread
constexpr unsigned kReallocOneIn = 8;     // own slots: realloc instead of free + malloc
constexpr unsigned kForeignReallocOneIn = 4;  // received blocks: realloc instead of free
constexpr uint64_t kTotalLoops = 40'000;

using Block = workload::StampedBlock;

struct Batch {
  Batch* next;
  size_t count;
  Block* blocks;  // a heap block of its own, as in rptest
};

struct alignas(64) Inbox {
  std::atomic<Batch*> top{nullptr};
};

struct Shared {
  std::vector<Inbox> inboxes;
  uint64_t loops_per_thread = 0;
  std::atomic<unsigned> senders_done{0};
  std::atomic<uint64_t> ops{0};
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> received{0};
  workload::CheckCounter checks;
};

// Linear fall-off: size density decreasing from kMinBytes to kMaxBytes.
size_t random_size(workload::Rng& rng) {
  const uint64_t span = kMaxBytes - kMinBytes;
  return kMinBytes + std::min(rng.below(span + 1), rng.below(span + 1));
}

// After a realloc from old_bytes to new_bytes: what the block kept must be the old stamp.
bool kept_intact(const void* block, size_t old_bytes, size_t new_bytes, uint64_t tag) {
  if (new_bytes >= old_bytes) return workload::stamp_intact(block, old_bytes, tag);
  const auto* base = static_cast<const unsigned char*>(block);
  uint64_t word = 0;
  std::memcpy(&word, base, sizeof word);
  if (word != tag) return false;
  for (size_t offset = workload::kStampStrideBytes;
       offset + 16 <= old_bytes && offset + sizeof word <= new_bytes;
       offset += workload::kStampStrideBytes) {
    std::memcpy(&word, base + offset, sizeof word);
    if (word != workload::page_stamp(tag, offset)) return false;
  }
  return true;
}

class Worker {
 public:
  Worker(Shared& shared, unsigned index)
      : shared_(shared), index_(index), rng_(7000 + index), slots_(kSlotsPerThread) {}

  void run() {
    const unsigned threads = static_cast<unsigned>(shared_.inboxes.size());
    unsigned next_receiver = index_;
    for (uint64_t loop = 0; loop < shared_.loops_per_thread; ++loop) {
      const uint64_t frees = rng_.between(kFreeOpsMin, kFreeOpsMax);
      for (uint64_t i = 0; i < frees; ++i) release(slots_[rng_.below(kSlotsPerThread)]);
      take_inbox();
      const uint64_t allocs = rng_.between(kAllocOpsMin, kAllocOpsMax);
      for (uint64_t i = 0; i < allocs; ++i) refill(slots_[rng_.below(kSlotsPerThread)]);
      if (threads > 1 && loop % kCrossEvery == 0) {
        next_receiver = (next_receiver + 1) % threads;
        if (next_receiver == index_) next_receiver = (next_receiver + 1) % threads;
        send(next_receiver, allocs);
      }
    }
    // Done sending; keep taking what others send until every thread is done sending.
    shared_.senders_done.fetch_add(1, std::memory_order_acq_rel);
    while (shared_.senders_done.load(std::memory_order_acquire) < threads) {
      take_inbox();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    take_inbox();
    for (Block& slot : slots_) release(slot);
    shared_.ops.fetch_add(ops_, std::memory_order_relaxed);
  }

 private:
  Block allocate() {
    Block block;
    block.bytes = random_size(rng_);
    block.ptr = std::malloc(block.bytes);
    block.tag = workload::block_tag(index_, ++serial_);
    workload::stamp(block.ptr, block.bytes, block.tag);
    ++ops_;
    return block;
  }

  void release(Block& slot) {
    if (slot.ptr == nullptr) return;
    shared_.checks.expect(workload::stamp_intact(slot.ptr, slot.bytes, slot.tag), "rptest stamp");
    std::free(slot.ptr);
    slot.ptr = nullptr;
    ++ops_;
  }

  // Resizes `block` in place of a malloc, then stamps it afresh.
  void resize(Block& block) {
    shared_.checks.expect(workload::stamp_intact(block.ptr, block.bytes, block.tag),
                          "rptest stamp before realloc");
    const size_t bytes = random_size(rng_);
    void* moved = std::realloc(block.ptr, bytes);
    shared_.checks.expect(kept_intact(moved, block.bytes, bytes, block.tag),
                          "rptest: realloc kept the old contents");
    block.ptr = moved;
    block.bytes = bytes;
    block.tag = workload::block_tag(index_, ++serial_);
    workload::stamp(block.ptr, block.bytes, block.tag);
    ++ops_;
  }

  void refill(Block& slot) {
    if (slot.ptr != nullptr && rng_.below(kReallocOneIn) == 0) {
      resize(slot);
      return;
    }
    release(slot);
    slot = allocate();
  }

  void send(unsigned receiver, uint64_t count) {
    auto* batch = static_cast<Batch*>(std::malloc(sizeof(Batch)));
    batch->count = count;
    batch->blocks = static_cast<Block*>(std::malloc(count * sizeof(Block)));
    for (uint64_t i = 0; i < count; ++i) batch->blocks[i] = allocate();
    ops_ += 2;
    std::atomic<Batch*>& top = shared_.inboxes[receiver].top;
    batch->next = top.load(std::memory_order_relaxed);
    while (!top.compare_exchange_weak(batch->next, batch, std::memory_order_release,
                                      std::memory_order_relaxed)) {
    }
    shared_.sent.fetch_add(count, std::memory_order_relaxed);
  }

  void take_inbox() {
    Batch* batch = shared_.inboxes[index_].top.exchange(nullptr, std::memory_order_acquire);
    while (batch != nullptr) {
      for (size_t i = 0; i < batch->count; ++i) {
        Block& block = batch->blocks[i];
        if (rng_.below(kForeignReallocOneIn) == 0) {
          resize(block);
          Block& slot = slots_[rng_.below(kSlotsPerThread)];
          release(slot);
          slot = block;
        } else {
          release(block);
        }
      }
      shared_.received.fetch_add(batch->count, std::memory_order_relaxed);
      Batch* next = batch->next;
      std::free(batch->blocks);
      std::free(batch);
      ops_ += 2;
      batch = next;
    }
  }

  Shared& shared_;
  unsigned index_;
  workload::Rng rng_;
  std::vector<Block> slots_;
  uint64_t serial_ = 0;
  uint64_t ops_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"rptest", 2});
  const unsigned threads = options.threads;

  Shared shared;
  shared.inboxes = std::vector<Inbox>(threads);
  shared.loops_per_thread = std::max<uint64_t>(20, options.scaled(kTotalLoops) / threads);
  const workload::Stopwatch stopwatch;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back([&shared, t] { Worker(shared, t).run(); });
  for (std::thread& worker : workers) worker.join();
  const double seconds = stopwatch.seconds();

  shared.checks.expect(shared.sent.load() == shared.received.load(),
                       "rptest: every block sent was received");
  return workload::report("rptest", threads, shared.ops.load(), seconds, shared.checks,
                          " sent=" + std::to_string(shared.sent.load()));
}
