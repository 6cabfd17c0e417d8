// large_realloc: large blocks, and buffers grown by realloc the way vectors and string
// builders grow them.
//
// Models the large-object side of allocator benchmarks such as mimalloc-bench's "malloc-large"
// and the realloc-heavy growth of document or network buffers. Each round grows one buffer
// from 64 B to 32 MiB by half its size at a time (realloc), with a small allocation in between
// growths as real code has, then allocates 16 blocks of 256 KiB..16 MiB and frees them in
// random order. An allocator wins here by growing in place or remapping instead of copying,
// and by keeping recently freed large mappings for reuse instead of paying mmap, page faults
// and munmap every time.
//
// Check: every 4 KiB page of every block is stamped; a grown buffer must still hold the old
// stamps after each realloc, and each large block is verified before it is freed.
// Ops: one realloc or large malloc. Default: 12 rounds.
#include <cstdlib>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kGrowthStartBytes = 64;
constexpr size_t kGrowthEndBytes = size_t{32} << 20;
constexpr size_t kLargeBlocksPerRound = 16;
constexpr size_t kLargeMinBytes = size_t{256} << 10;
constexpr size_t kLargeMaxBytes = size_t{16} << 20;

using Block = workload::StampedBlock;

uint64_t grow_buffer(workload::Rng& rng, uint64_t round, workload::CheckCounter& checks) {
  const uint64_t tag = workload::block_tag(round, 0);
  size_t bytes = kGrowthStartBytes;
  void* buffer = std::malloc(bytes);
  workload::stamp(buffer, bytes, tag);
  uint64_t reallocs = 0;
  std::vector<void*> neighbours;
  while (bytes < kGrowthEndBytes) {
    neighbours.push_back(std::malloc(rng.between(16, 256)));
    const size_t grown = std::min(kGrowthEndBytes, bytes + bytes / 2);
    buffer = std::realloc(buffer, grown);
    ++reallocs;
    checks.expect(workload::stamp_intact(buffer, bytes, tag), "large_realloc: realloc lost data");
    bytes = grown;
    workload::stamp(buffer, bytes, tag);
  }
  checks.expect(workload::stamp_intact(buffer, bytes, tag), "large_realloc: grown buffer");
  std::free(buffer);
  for (void* neighbour : neighbours) std::free(neighbour);
  return reallocs;
}

void churn_large_blocks(workload::Rng& rng, uint64_t round, workload::CheckCounter& checks) {
  Block blocks[kLargeBlocksPerRound];
  for (size_t i = 0; i < kLargeBlocksPerRound; ++i) {
    blocks[i].bytes = rng.log_between(kLargeMinBytes, kLargeMaxBytes);
    blocks[i].ptr = std::malloc(blocks[i].bytes);
    blocks[i].tag = workload::block_tag(round, i + 1);
    workload::stamp(blocks[i].ptr, blocks[i].bytes, blocks[i].tag);
  }
  for (size_t left = kLargeBlocksPerRound; left > 0; --left) {
    Block& victim = blocks[rng.below(left)];
    checks.expect(workload::stamp_intact(victim.ptr, victim.bytes, victim.tag),
                  "large_realloc: large block");
    std::free(victim.ptr);
    victim = blocks[left - 1];
  }
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"large_realloc", 0});
  const uint64_t rounds = options.scaled(12, 2);

  workload::CheckCounter checks;
  workload::Rng rng(6000);
  uint64_t ops = 0;
  const workload::Stopwatch stopwatch;
  for (uint64_t round = 0; round < rounds; ++round) {
    ops += grow_buffer(rng, round, checks);
    churn_large_blocks(rng, round, checks);
    ops += kLargeBlocksPerRound;
  }
  const double seconds = stopwatch.seconds();

  return workload::report("large_realloc", 1, ops, seconds, checks);
}
