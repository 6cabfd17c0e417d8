// phases: a program whose work alternates between a phase of big blocks and a phase of small
// ones, each phase freeing everything it allocated before the next begins.
//
// The pattern of a program whose work comes in kinds: a renderer that loads a level's textures
// and meshes into buffers of a MiB, frees them, then builds a scene of small nodes; a build
// tool that reads files into big buffers, then makes a tree of small objects; a server taking
// a batch of uploads, then a batch of small requests. Each round allocates and writes 200
// blocks of 1 MiB and frees them, then 204,800 blocks of 1000 B and frees them: 200 MiB in
// each phase. An allocator that keeps the memory of big blocks apart from that of small ones
// gives one phase's memory back while it faults in the next one's; one whose memory serves
// either kind faults each page in once.
//
// Check: every block is stamped on every 4 KiB page and verified before it is freed.
// Ops: one block allocated. Default: 3 rounds.
#include <cstdlib>
#include <vector>

#include "common.hpp"

namespace {

constexpr uint64_t kRounds = 3;
constexpr size_t kBigBlocks = 200;
constexpr size_t kBigBytes = size_t{1} << 20;
constexpr size_t kSmallBlocks = 200 * 1024;
constexpr size_t kSmallBytes = 1000;
constexpr char kStampCheck[] = "phases stamp";

// Allocates `count` stamped blocks of `bytes`, then frees them all, checking each.
void run_phase(std::vector<workload::StampedBlock>& blocks, size_t count, size_t bytes,
               uint64_t& serial, workload::CheckCounter& checks) {
  blocks.clear();
  for (size_t i = 0; i < count; ++i) blocks.push_back(workload::allocate_stamped(bytes, ++serial));
  for (workload::StampedBlock& block : blocks) workload::free_stamped(block, checks, kStampCheck);
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"phases", 0});
  const uint64_t rounds = options.scaled(kRounds, 1);

  workload::CheckCounter checks;
  std::vector<workload::StampedBlock> blocks;
  blocks.reserve(kSmallBlocks);
  uint64_t serial = 0;
  const workload::Stopwatch stopwatch;
  for (uint64_t round = 0; round < rounds; ++round) {
    run_phase(blocks, kBigBlocks, kBigBytes, serial, checks);
    run_phase(blocks, kSmallBlocks, kSmallBytes, serial, checks);
  }
  const double seconds = stopwatch.seconds();

  return workload::report("phases", 1, rounds * (kBigBlocks + kSmallBlocks), seconds, checks);
}
