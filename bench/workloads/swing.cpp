// swing: a fixed number of live blocks whose sizes shift between phases, so the bytes in use
// swing by a hundred times every few phases while the program stays busy.
//
// The pattern of a program that holds N objects rather than N bytes: an interpreter whose live
// strings and buffers change with its input (a Python script holding 60k `bytes` objects whose
// lengths move between bands), a cache of a fixed number of entries whose values change shape,
// a game level loading a different kind of asset per stage. One thread keeps 20,000 blocks live
// and replaces a random one per step while the size range moves through five phases, twice:
// tiny (16..64 B), small (100..900 B), tiny again, big (1..9 KiB) and everything up to 20 KiB.
// Each phase replaces every block 2.5 times on average, so 8% of an old phase's blocks are
// still live when the next starts. An allocator that gives the memory of a big phase back to
// the OS as soon as a tiny one frees it faults it all in again a few phases later; one that
// never gives anything back holds the big phases' bytes through the tiny ones.
//
// Check: every block is stamped on every 4 KiB page and verified before it is freed.
// Ops: one replacement step. Default: 10 phases of 50k steps.
#include <cstdlib>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kLiveBlocks = 20'000;

struct SizeRange {
  size_t min_bytes;
  size_t max_bytes;
};
constexpr SizeRange kPhases[] = {
    {16, 64}, {100, 900}, {16, 64}, {1000, 9000}, {16, 20000},
};
constexpr unsigned kRounds = 2;

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"swing", 0});
  const uint64_t steps_per_phase = options.scaled(50'000, 1000);

  workload::CheckCounter checks;
  workload::Rng rng(4100);
  std::vector<workload::StampedBlock> live;
  live.reserve(kLiveBlocks);
  uint64_t serial = 0;
  const workload::Stopwatch stopwatch;
  for (unsigned round = 0; round < kRounds; ++round) {
    for (const SizeRange& phase : kPhases) {
      for (uint64_t step = 0; step < steps_per_phase; ++step) {
        const size_t bytes = rng.between(phase.min_bytes, phase.max_bytes);
        workload::StampedBlock block = workload::allocate_stamped(bytes, ++serial);
        if (live.size() < kLiveBlocks) {
          live.push_back(block);
          continue;
        }
        workload::StampedBlock& victim = live[rng.below(live.size())];
        workload::free_stamped(victim, checks, "swing block stamp");
        victim = block;
      }
    }
  }
  for (workload::StampedBlock& block : live)
    workload::free_stamped(block, checks, "swing block stamp");
  const double seconds = stopwatch.seconds();

  const uint64_t ops = steps_per_phase * std::size(kPhases) * kRounds;
  return workload::report("swing", 1, ops, seconds, checks);
}
