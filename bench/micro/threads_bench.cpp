// The pair and batch patterns on 1..4 threads at once, in two flavours:
//  - same-thread: every block is freed by the thread that allocated it, so a per-thread heap
//    never needs a lock; what remains is contention on anything shared;
//  - producer/consumer: each thread allocates a handoff of blocks and posts it to the next
//    thread's mailbox, then frees whatever its own mailbox holds, so every free is of a block
//    another thread allocated (the remote-free path). On one thread it posts to itself.
// Times are wall-clock (UseRealTime): CPU time says nothing about threads waiting on each other.
#include <benchmark/benchmark.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "mixed_batch.h"

namespace {

constexpr int kMaxThreads = 4;

void BM_pair_threads(benchmark::State& state) {
  for (auto _ : state) {
    void* block = std::malloc(64);
    benchmark::DoNotOptimize(block);
    std::free(block);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_pair_threads)->DenseThreadRange(1, kMaxThreads)->UseRealTime();

void BM_mixed_batch_threads(benchmark::State& state) {
  std::array<size_t, MIXED_BATCH_COUNT> sizes{};
  std::array<size_t, MIXED_BATCH_COUNT> free_order{};
  mixed_batch_sizes(sizes.data());
  mixed_batch_shuffled_order(free_order.data());
  std::array<void*, MIXED_BATCH_COUNT> blocks{};
  for (auto _ : state) {
    for (size_t i = 0; i < MIXED_BATCH_COUNT; ++i) blocks[i] = std::malloc(sizes[i]);
    benchmark::DoNotOptimize(blocks.data());
    for (size_t i = 0; i < MIXED_BATCH_COUNT; ++i) std::free(blocks[free_order[i]]);
  }
  state.SetItemsProcessed(state.iterations() * MIXED_BATCH_COUNT);
}
BENCHMARK(BM_mixed_batch_threads)->DenseThreadRange(1, kMaxThreads)->UseRealTime();

// Blocks travel in handoffs of 64, chained through their first word and pushed onto the next
// thread's lock-free stack, the way allocators pass remote frees. No lock means no thread
// sleeps on a futex, which on an oversubscribed machine would dwarf the allocator's cost.
constexpr size_t kHandoffBlocks = 64;

struct alignas(64) Mailbox {
  std::atomic<void*> chain{nullptr};
};
std::array<Mailbox, kMaxThreads> mailboxes;

void* next_in_chain(void* block) {
  void* next = nullptr;
  std::memcpy(&next, block, sizeof next);
  return next;
}

void link(void* block, void* next) { std::memcpy(block, &next, sizeof next); }

void post(Mailbox& mailbox, void* first, void* last) {
  void* head = mailbox.chain.load(std::memory_order_relaxed);
  do {
    link(last, head);
  } while (!mailbox.chain.compare_exchange_weak(head, first, std::memory_order_release,
                                                std::memory_order_relaxed));
}

void free_chain(void* block) {
  while (block != nullptr) {
    void* next = next_in_chain(block);
    std::free(block);
    block = next;
  }
}

void BM_cross_thread_free(benchmark::State& state) {
  std::array<size_t, MIXED_BATCH_COUNT> sizes{};
  mixed_batch_sizes(sizes.data());  // all at least 8 bytes: room for the chain link
  Mailbox& own = mailboxes[static_cast<size_t>(state.thread_index())];
  Mailbox& next = mailboxes[static_cast<size_t>((state.thread_index() + 1) % state.threads())];
  size_t cursor = static_cast<size_t>(state.thread_index()) * 97;
  for (auto _ : state) {
    void* first = std::malloc(sizes[cursor]);
    void* last = first;
    for (size_t i = 1; i < kHandoffBlocks; ++i) {
      cursor = (cursor + 1) % MIXED_BATCH_COUNT;
      void* block = std::malloc(sizes[cursor]);
      link(last, block);
      last = block;
    }
    cursor = (cursor + 1) % MIXED_BATCH_COUNT;
    post(next, first, last);
    free_chain(own.chain.exchange(nullptr, std::memory_order_acquire));
  }
  // The loop ends at a barrier shared by all threads, so nobody posts to `own` any more.
  free_chain(own.chain.exchange(nullptr, std::memory_order_acquire));
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(kHandoffBlocks));
}
BENCHMARK(BM_cross_thread_free)->DenseThreadRange(1, kMaxThreads)->UseRealTime();

}  // namespace
