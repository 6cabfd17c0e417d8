// mstress: rounds of short-lived threads doing random small allocations with a few large ones,
// swapping blocks with each other through a shared array of slots.
//
// Models mimalloc's stress test as mimalloc-bench runs it ("mstress N 50 25"). Each of 25 rounds
// starts the worker threads afresh and joins them all at its end. A worker allocates blocks of
// 1, 2, 4, 8 or 16 words (8..128 B) and keeps them, plus half as many "retained" blocks of 1..64
// words that live until the thread ends; one block in fifty is 100 times larger, one in five
// hundred 1000 times and one in five thousand 10000 times (up to 5 MiB). After each allocation it
// frees a random earlier block two times in three, and one time in four swaps one of its blocks
// with a random slot of a shared array of 1000 (an atomic exchange), taking home a block that
// another thread, often of an earlier round, allocated. At the end of a round the thread frees
// everything it still holds; the main thread then frees half the shared slots (all of them after
// the last round). Some threads do up to eight times more work than others. An allocator has to
// take blocks of exited threads back, serve a sprinkle of large blocks between the small ones,
// and give memory back between rounds: peak RSS matters here as much as time.
//
// Check: every block is stamped (its tag, which also encodes its size, in the first word, one
// word per 4 KiB page, the tag's complement at the end) and verified before it is freed.
// Ops: one malloc. Default: 2 threads, 25 rounds of 100k blocks (split between the threads
// 1:2:3:..:8:1:2..).
#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kTransferSlots = 1000;
constexpr unsigned kRounds = 25;
constexpr uint64_t kAllocsPerRound = 100'000;
constexpr unsigned kSmallShift = 5;     // data blocks: 1 << (0..4) words
constexpr unsigned kRetainedShift = 7;  // retained blocks: 1 << (0..6) words
constexpr size_t kWordBytes = sizeof(uint64_t);
constexpr size_t kMaxBytes = (size_t{1} << (kRetainedShift - 1)) * 10'000 * kWordBytes;
constexpr unsigned kSizeShift = 40;  // the tag's bits above this hold the block's size

std::atomic<void*> g_transfer[kTransferSlots];

struct Shared {
  workload::CheckCounter checks;
  std::atomic<uint64_t> allocations{0};
  std::atomic<uint64_t> large_allocations{0};
};

bool chance(workload::Rng& rng, unsigned percent) { return rng.below(100) < percent; }

// A block records its own size in its tag, so it can travel through the shared slots as a bare
// pointer and still be checked by whichever thread frees it.
uint64_t sized_tag(size_t bytes, uint64_t thread, uint64_t serial) {
  const uint64_t low = workload::block_tag(thread, serial) & ((uint64_t{1} << kSizeShift) - 1);
  return (uint64_t{bytes} << kSizeShift) | low | 1;
}

void* allocate_words(size_t words, workload::Rng& rng, uint64_t thread, uint64_t serial,
                     Shared& shared) {
  if (chance(rng, 2)) {
    if (chance(rng, 1)) {
      words *= 10'000;
    } else if (chance(rng, 10)) {
      words *= 1'000;
    } else {
      words *= 100;
    }
    shared.large_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  const size_t bytes = words * kWordBytes;
  void* block = std::malloc(bytes);
  workload::stamp(block, bytes, sized_tag(bytes, thread, serial));
  return block;
}

void free_checked(void* block, Shared& shared) {
  if (block == nullptr) return;
  uint64_t tag = 0;
  std::memcpy(&tag, block, sizeof tag);
  const size_t bytes = tag >> kSizeShift;
  const bool plausible = bytes >= kWordBytes && bytes <= kMaxBytes && bytes % kWordBytes == 0;
  shared.checks.expect(plausible, "mstress: block tag names a size it cannot have");
  if (!plausible) return;  // leaked: freeing what may not be a block could crash the run
  shared.checks.expect(workload::stamp_intact(block, bytes, tag), "mstress block stamp");
  std::free(block);
}

// One worker's life within a round.
void stress(Shared& shared, uint64_t thread, uint64_t allocs) {
  workload::Rng rng(9000 + thread);
  uint64_t retain = allocs / 2;
  uint64_t serial = 0;
  void** data = nullptr;
  size_t data_size = 0;
  size_t data_top = 0;
  auto** retained = static_cast<void**>(std::malloc(std::max<uint64_t>(1, retain) * sizeof(void*)));
  size_t retained_top = 0;
  uint64_t allocations = 0;

  while (allocs > 0 || retain > 0) {
    if (retain == 0 || (allocs > 0 && chance(rng, 50))) {
      --allocs;
      if (data_top == data_size) {  // grown the way the original grows it: realloc, 100k at a time
        data_size += 100'000;
        data = static_cast<void**>(std::realloc(data, data_size * sizeof(void*)));
      }
      data[data_top++] = allocate_words(size_t{1} << rng.below(kSmallShift), rng, thread,
                                        ++serial, shared);
    } else {
      --retain;
      retained[retained_top++] = allocate_words(size_t{1} << rng.below(kRetainedShift), rng,
                                                thread, ++serial, shared);
    }
    ++allocations;
    if (data_top > 0 && chance(rng, 66)) {
      void*& victim = data[rng.below(data_top)];
      free_checked(victim, shared);
      victim = nullptr;
    }
    if (data_top > 0 && chance(rng, 25)) {
      void*& mine = data[rng.below(data_top)];
      mine = g_transfer[rng.below(kTransferSlots)].exchange(mine, std::memory_order_acq_rel);
    }
  }
  for (size_t i = 0; i < retained_top; ++i) free_checked(retained[i], shared);
  for (size_t i = 0; i < data_top; ++i) free_checked(data[i], shared);
  std::free(retained);
  std::free(data);
  shared.allocations.fetch_add(allocations, std::memory_order_relaxed);
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"mstress", 2});
  const unsigned threads = options.threads;
  const uint64_t allocs_per_round = options.scaled(kAllocsPerRound, 100 * threads);
  // Thread t does a share proportional to t % 8 + 1, as in the original.
  uint64_t weights = 0;
  for (unsigned t = 0; t < threads; ++t) weights += t % 8 + 1;

  Shared shared;
  workload::Rng main_rng(9000);
  const workload::Stopwatch stopwatch;
  for (unsigned round = 0; round < kRounds; ++round) {
    std::vector<std::thread> workers;
    for (unsigned t = 0; t < threads; ++t) {
      const uint64_t allocs = std::max<uint64_t>(1, allocs_per_round * (t % 8 + 1) / weights);
      workers.emplace_back(stress, std::ref(shared), uint64_t{round} * threads + t, allocs);
    }
    for (std::thread& worker : workers) worker.join();
    const bool last = round + 1 == kRounds;
    for (std::atomic<void*>& slot : g_transfer)
      if (last || chance(main_rng, 50))
        free_checked(slot.exchange(nullptr, std::memory_order_acq_rel), shared);
  }
  const double seconds = stopwatch.seconds();

  return workload::report("mstress", threads, shared.allocations.load(), seconds, shared.checks,
                          " rounds=" + std::to_string(kRounds) +
                              " large_blocks=" + std::to_string(shared.large_allocations.load()));
}
