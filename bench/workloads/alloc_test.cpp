// alloc_test: threads that each keep a large random working set of mostly tiny blocks, with a
// thin tail of larger ones, and toggle random slots of it: an empty slot gets a new block, a
// full one is freed.
//
// Models the node-dot-cpp alloc-test benchmark (the allocator test of the node.cpp project, run
// by mimalloc-bench as alloc-test1 and alloc-testN). Each thread owns 64Ki slots and, step
// after step, picks one at random: if it is empty it allocates a block, if it holds one it
// frees it, so about half the slots are in use once the run has settled. Block sizes follow the
// test's skewed distribution: a size class k is picked with probability 2^-(k-1) (k = 2, 3, ...,
// the number of trailing zero bits of a random number), and the size is 2^k plus random low
// bits, 5..2^(k+1) B; so half the blocks are 5..8 B, a quarter 9..16 B, and one in 8k is
// 32..64 KiB. No block leaves its thread. Random slots over a working set of a few MiB per
// thread make every malloc and free touch cold memory: an allocator's per-block metadata and
// the locality of its size classes decide the time.
//
// Check: every block is stamped when allocated and verified before it is freed.
// Ops: one step (a malloc or a free). Default: 2 threads, 16M steps each.
#include <bit>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kSlots = size_t{1} << 16;  // per thread; a power of two
constexpr unsigned kMinClass = 2;           // smallest blocks: 2^2 + 1 = 5 B
constexpr unsigned kMaxClass = 15;          // largest blocks: 2^16 = 64 KiB
constexpr uint64_t kStepsPerThread = 16'000'000;

using Slot = workload::StampedBlock;

struct Shared {
  uint64_t steps = 0;
  workload::CheckCounter checks;
  std::atomic<uint64_t> allocations{0};
  std::atomic<uint64_t> large_allocations{0};  // 4 KiB and up
};

// A size class from the trailing zeros of a random number (class k with chance 2^-(k-1),
// capped at kMaxClass), then a uniform size in (2^k, 2^(k+1)].
size_t skewed_size(workload::Rng& rng) {
  const uint64_t random = rng.next();
  const unsigned zeros = static_cast<unsigned>(std::countr_zero(random | (uint64_t{1} << 40)));
  const unsigned size_class = std::min(kMinClass + zeros, kMaxClass);
  const uint64_t low_bits = (random >> 41) & ((uint64_t{1} << size_class) - 1);
  return (size_t{1} << size_class) + 1 + low_bits;
}

void toggle_slots(Shared& shared, unsigned thread) {
  workload::Rng rng(7100 + thread);
  std::vector<Slot> slots(kSlots, Slot{nullptr, 0, 0});
  uint64_t serial = 0;
  uint64_t large = 0;
  for (uint64_t step = 0; step < shared.steps; ++step) {
    Slot& slot = slots[rng.next() & (kSlots - 1)];
    if (slot.ptr != nullptr) {
      workload::free_stamped(slot, shared.checks, "alloc_test block stamp");
      continue;
    }
    const size_t bytes = skewed_size(rng);
    large += bytes >= 4096;
    slot = workload::allocate_stamped(bytes, workload::block_tag(thread, ++serial));
  }
  for (Slot& slot : slots) workload::free_stamped(slot, shared.checks, "alloc_test block stamp");
  shared.allocations.fetch_add(serial, std::memory_order_relaxed);
  shared.large_allocations.fetch_add(large, std::memory_order_relaxed);
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"alloc_test", 2});
  const unsigned threads = options.threads;
  Shared shared;
  // Several times the slot count, so even a tiny run reaches the settled half-full state.
  shared.steps = options.scaled(kStepsPerThread, 4 * kSlots);

  const workload::Stopwatch stopwatch;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) workers.emplace_back(toggle_slots, std::ref(shared), t);
  for (std::thread& worker : workers) worker.join();
  const double seconds = stopwatch.seconds();

  return workload::report("alloc_test", threads, uint64_t{threads} * shared.steps, seconds,
                          shared.checks,
                          " mallocs=" + std::to_string(shared.allocations.load()) +
                              " large_blocks=" + std::to_string(shared.large_allocations.load()));
}
