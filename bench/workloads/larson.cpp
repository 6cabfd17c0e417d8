// larson: a long-running server whose connections keep a working set of blocks that is
// constantly replaced, and whose blocks outlive the thread that allocated them.
//
// Models the Larson & Krishnan server benchmark ("Memory allocation for long-running server
// applications", ISMM 1998), as run by Hoard and mimalloc-bench. Each thread owns an array of
// slots and, step after step, frees a random slot and refills it with a block of random size
// (16..1024 B). At the end of each round the arrays move on to the next thread, so the next
// round mostly frees blocks that another thread allocated: an allocator must take remote frees
// all the time without its heaps drifting apart or growing.
//
// Check: every block is stamped when allocated and verified before it is freed.
// Ops: one step (a free and a malloc). Default: 4 threads, 20 rounds of 100k steps per thread.
#include <barrier>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kSlotsPerThread = 1000;
constexpr size_t kMinBytes = 16;
constexpr size_t kMaxBytes = 1024;
constexpr unsigned kRounds = 20;

using Slot = workload::StampedBlock;

struct Shared {
  std::vector<std::vector<Slot>> arrays;
  uint64_t steps_per_round = 0;
  workload::CheckCounter checks;
};

void fill_slot(Slot& slot, workload::Rng& rng, uint64_t tag) {
  slot = workload::allocate_stamped(rng.between(kMinBytes, kMaxBytes), tag);
}

void release_slot(Slot& slot, workload::CheckCounter& checks) {
  workload::free_stamped(slot, checks, "larson block stamp");
}

void serve(Shared& shared, std::barrier<>& round_end, unsigned thread) {
  workload::Rng rng(1000 + thread);
  uint64_t serial = 0;
  const size_t thread_count = shared.arrays.size();
  for (Slot& slot : shared.arrays[thread]) fill_slot(slot, rng, workload::block_tag(thread, ++serial));
  round_end.arrive_and_wait();
  for (unsigned round = 0; round < kRounds; ++round) {
    std::vector<Slot>& slots = shared.arrays[(thread + round) % thread_count];
    for (uint64_t step = 0; step < shared.steps_per_round; ++step) {
      Slot& slot = slots[rng.below(slots.size())];
      release_slot(slot, shared.checks);
      fill_slot(slot, rng, workload::block_tag(thread, ++serial));
    }
    round_end.arrive_and_wait();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"larson", 4});
  const unsigned threads = options.threads;
  Shared shared;
  shared.arrays.assign(threads, std::vector<Slot>(kSlotsPerThread));
  shared.steps_per_round = options.scaled(100'000, 100);

  const workload::Stopwatch stopwatch;
  std::barrier<> round_end(threads);
  std::vector<std::thread> servers;
  for (unsigned t = 0; t < threads; ++t)
    servers.emplace_back(serve, std::ref(shared), std::ref(round_end), t);
  for (std::thread& server : servers) server.join();
  for (std::vector<Slot>& slots : shared.arrays)
    for (Slot& slot : slots) release_slot(slot, shared.checks);
  const double seconds = stopwatch.seconds();

  const uint64_t ops = uint64_t{threads} * kRounds * shared.steps_per_round;
  return workload::report("larson", threads, ops, seconds, shared.checks);
}
