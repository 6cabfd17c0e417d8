// swing: a fixed number of live blocks whose sizes shift between phases, so the bytes in use
// swing by a hundred times every few phases while the program stays busy.
//
// The pattern of a program that holds N objects rather than N bytes: an interpreter whose live
// strings and buffers change with its input (a Python script holding 60k `bytes` objects whose
// lengths move between bands, bench/scripts/size_bands.py), a cache of a fixed number of
// entries whose values change shape, a game level loading a different kind of asset per stage.
// One thread replaces a random live block per step while the size range moves through bands,
// twice over. Each band replaces every block 2.5 times on average, so 8% of an old band's
// blocks are still live when the next starts. An allocator that gives the memory of a big band
// back to the OS as soon as a tiny one frees it faults it all in again a few bands later; one
// that never gives anything back holds the big bands' bytes through the tiny ones.
//
// Three parts, one after the other, so that the memory one part freed can serve the next
// whatever the size of its blocks:
//   small: 20,000 live blocks, bands 16..64 B, 100..900 B, 16..64 B, 1..9 KiB, 16 B..20 KiB
//          (pooled sizes; about 1 MiB to 200 MiB in use);
//   large: 400 live blocks, bands 16..64 B, 100 KiB..900 KiB, 16..64 B, 200 KiB..2 MiB,
//          16..64 B (blocks of hundreds of KiB; about 0 to 440 MiB in use);
//   small again: as the first.
// The RESULT line has each part's seconds beside the total (small_seconds, large_seconds,
// small_again_seconds).
//
// Check: every block is stamped on every 4 KiB page and verified before it is freed.
// Ops: one replacement step. Default: 10 bands of 50k steps, 10 bands of 1000 steps, then 10
// bands of 50k steps.
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

struct SizeRange {
  size_t min_bytes;
  size_t max_bytes;
};

struct Part {
  size_t live_blocks;
  uint64_t steps_per_band;  // at scale 1
  std::span<const SizeRange> bands;
};

constexpr SizeRange kSmallBands[] = {
    {16, 64}, {100, 900}, {16, 64}, {1000, 9000}, {16, 20000},
};
constexpr SizeRange kLargeBands[] = {
    {16, 64}, {100 << 10, 900 << 10}, {16, 64}, {200 << 10, 2 << 20}, {16, 64},
};
constexpr unsigned kRounds = 2;

// Runs one part; the steps it took.
uint64_t run_part(const Part& part, const workload::Options& options, workload::Rng& rng,
                  workload::CheckCounter& checks, uint64_t& serial) {
  const uint64_t steps_per_band = options.scaled(part.steps_per_band, 100);
  std::vector<workload::StampedBlock> live;
  live.reserve(part.live_blocks);
  for (unsigned round = 0; round < kRounds; ++round) {
    for (const SizeRange& band : part.bands) {
      for (uint64_t step = 0; step < steps_per_band; ++step) {
        const size_t bytes = rng.between(band.min_bytes, band.max_bytes);
        workload::StampedBlock block = workload::allocate_stamped(bytes, ++serial);
        if (live.size() < part.live_blocks) {
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
  return steps_per_band * part.bands.size() * kRounds;
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"swing", 0});
  const Part small{20'000, 50'000, kSmallBands};
  const Part large{400, 1'000, kLargeBands};

  workload::CheckCounter checks;
  workload::Rng rng(4100);
  uint64_t serial = 0;
  const workload::Stopwatch stopwatch;
  uint64_t ops = run_part(small, options, rng, checks, serial);
  const double small_seconds = stopwatch.seconds();
  ops += run_part(large, options, rng, checks, serial);
  const double large_seconds = stopwatch.seconds() - small_seconds;
  ops += run_part(small, options, rng, checks, serial);
  const double seconds = stopwatch.seconds();

  const std::string extra = " small_seconds=" + std::to_string(small_seconds) +
                            " large_seconds=" + std::to_string(large_seconds) +
                            " small_again_seconds=" +
                            std::to_string(seconds - small_seconds - large_seconds);
  return workload::report("swing", 1, ops, seconds, checks, extra);
}
