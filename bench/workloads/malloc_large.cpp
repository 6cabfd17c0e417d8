// malloc_large: one thread replacing large buffers of 5..25 MiB, twenty of them live at a time.
//
// Models mimalloc-bench's malloc-large (a test from mimalloc issue #447: buffers of random size
// between 5 and 25 MiB, up to 20 live). Each step allocates a buffer of random size, writes every
// 4 KiB page of it, and puts it in a random one of 20 slots, freeing the buffer that was there
// (after the new one is allocated, as assigning a std::unique_ptr does). Every request is far
// above any size class, so this measures only an allocator's large path: whether a freed
// buffer's pages are kept and reused, or unmapped and faulted in afresh by the next one, and
// what that costs in time (mmap, munmap, page faults) against what it holds in memory.
//
// Check: every page of every buffer is stamped and verified before the buffer is freed.
// Ops: one step (a malloc and, once the slots are full, a free). Default: 500 steps.
#include <array>
#include <cstdlib>

#include "common.hpp"

namespace {

constexpr size_t kSlots = 20;
constexpr size_t kMinBytes = size_t{5} << 20;
constexpr size_t kMaxBytes = size_t{25} << 20;
constexpr uint64_t kSteps = 500;

using Block = workload::StampedBlock;
constexpr char kStampCheck[] = "malloc_large stamp";

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"malloc_large", 0});
  const uint64_t steps = options.scaled(kSteps, 2 * kSlots);

  workload::CheckCounter checks;
  workload::Rng rng(447);
  std::array<Block, kSlots> slots{};
  const workload::Stopwatch stopwatch;
  for (uint64_t step = 1; step <= steps; ++step) {
    const Block fresh =
        workload::allocate_stamped(rng.between(kMinBytes, kMaxBytes), workload::block_tag(0, step));
    Block& slot = slots[rng.below(kSlots)];
    workload::free_stamped(slot, checks, kStampCheck);
    slot = fresh;
  }
  for (Block& slot : slots) workload::free_stamped(slot, checks, kStampCheck);
  const double seconds = stopwatch.seconds();

  return workload::report("malloc_large", 1, steps, seconds, checks);
}
