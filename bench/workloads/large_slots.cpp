// large_slots: 2000 live blocks of 256..512 KiB, one replaced at random per step.
//
// A cache or pool of large buffers (decoded images, I/O buffers, per-connection arenas) that a
// program keeps by the thousand and recycles: about 750 MiB of address space live. Only each
// block's first word is written, so page faults stay out of it (a block's first page is where
// most allocators keep its header anyway) and the allocator's own bookkeeping for blocks of
// this size is what is timed: finding room for a block among many
// chunks or spans, and taking a freed block back. An allocator that searches its large-block
// space linearly pays for every chunk it holds on every request.
//
// Check: each block's first word holds its tag, verified before it is freed.
// Ops: one step (a free and a malloc). Default: 200k steps.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kSlots = 2000;
constexpr size_t kMinBytes = size_t{256} << 10;
constexpr size_t kMaxBytes = size_t{512} << 10;
constexpr uint64_t kSteps = 200'000;

uint64_t* allocate(workload::Rng& rng, uint64_t tag) {
  auto* block = static_cast<uint64_t*>(std::malloc(rng.between(kMinBytes, kMaxBytes)));
  *block = tag;
  return block;
}

void release(uint64_t* block, uint64_t tag, workload::CheckCounter& checks) {
  checks.expect(*block == tag, "large_slots tag");
  std::free(block);
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"large_slots", 0});
  const uint64_t steps = options.scaled(kSteps, kSlots);

  workload::CheckCounter checks;
  workload::Rng rng(2000);
  std::vector<uint64_t*> slots(kSlots);
  std::vector<uint64_t> tags(kSlots);
  uint64_t serial = 0;
  for (size_t i = 0; i < kSlots; ++i) slots[i] = allocate(rng, tags[i] = ++serial);
  const workload::Stopwatch stopwatch;
  for (uint64_t step = 0; step < steps; ++step) {
    const size_t i = rng.below(kSlots);
    release(slots[i], tags[i], checks);
    slots[i] = allocate(rng, tags[i] = ++serial);
  }
  const double seconds = stopwatch.seconds();
  for (size_t i = 0; i < kSlots; ++i) release(slots[i], tags[i], checks);

  return workload::report("large_slots", 1, steps, seconds, checks);
}
