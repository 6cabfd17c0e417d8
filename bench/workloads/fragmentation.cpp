// fragmentation: a long soak of mixed-size churn whose size distribution shifts over time,
// reporting peak RSS against peak live bytes.
//
// Models the phase behaviour that Wilson, Johnstone, Neely and Boles describe in real
// programs ("Dynamic storage allocation: a survey and critical review", 1995) and that a
// long-running server shows when its request mix changes: one thread keeps ~64 MiB live and
// keeps replacing random blocks, while the sizes it asks for move through six phases (tiny,
// small, medium, tiny again, large, everything). Blocks of an old phase die at random, leaving
// pages that are mostly empty; an allocator that cannot reuse or return them shows a high
// RSS / live ratio.
//
// Live bytes count the blocks' requested sizes plus the workload's own index of blocks (16 B
// per block), so peak_rss_kb / peak_live_kb is the allocator's overhead, ideally near 1.
// Check: every block is stamped on every 4 KiB page and verified before it is freed.
// Ops: one replacement step. Default: 6 phases of 300k steps.
#include <cstdlib>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kTargetLiveBytes = size_t{64} << 20;

struct SizeRange {
  size_t min_bytes;
  size_t max_bytes;
};
constexpr SizeRange kPhases[] = {
    {16, 128}, {128, 1024}, {1024, 8192}, {16, 256}, {8192, 65536}, {16, 65536},
};
constexpr size_t kSmallestBytes = 16;

struct Block {
  void* ptr;
  size_t bytes;
};

// Derived from the block itself, so the index needs no third field.
uint64_t tag_of(const Block& block) {
  return workload::block_tag(block.bytes, reinterpret_cast<uintptr_t>(block.ptr));
}

class LiveSet {
 public:
  explicit LiveSet(workload::CheckCounter& checks) : checks_(checks) {
    // Reserved once so the index never reallocates (a copy would double it at the peak).
    blocks_.reserve(kTargetLiveBytes / kSmallestBytes + 1);
  }

  void add(size_t bytes) {
    Block block{std::malloc(bytes), bytes};
    workload::stamp(block.ptr, bytes, tag_of(block));
    blocks_.push_back(block);
    live_bytes_ += bytes;
    peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_ + blocks_.size() * sizeof(Block));
  }

  void remove_random(workload::Rng& rng) {
    const size_t victim = rng.below(blocks_.size());
    release(blocks_[victim]);
    blocks_[victim] = blocks_.back();
    blocks_.pop_back();
  }

  void clear() {
    for (const Block& block : blocks_) release(block);
    blocks_.clear();
  }

  bool empty() const { return blocks_.empty(); }
  size_t live_bytes() const { return live_bytes_; }
  size_t peak_live_bytes() const { return peak_live_bytes_; }

 private:
  void release(const Block& block) {
    checks_.expect(workload::stamp_intact(block.ptr, block.bytes, tag_of(block)),
                   "fragmentation block stamp");
    live_bytes_ -= block.bytes;
    std::free(block.ptr);
  }

  workload::CheckCounter& checks_;
  std::vector<Block> blocks_;
  size_t live_bytes_ = 0;
  size_t peak_live_bytes_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"fragmentation", 0});
  const uint64_t steps_per_phase = options.scaled(300'000, 1000);

  workload::CheckCounter checks;
  workload::Rng rng(3000);
  LiveSet live(checks);
  const workload::Stopwatch stopwatch;
  for (const SizeRange& phase : kPhases) {
    for (uint64_t step = 0; step < steps_per_phase; ++step) {
      const size_t bytes = rng.log_between(phase.min_bytes, phase.max_bytes);
      while (!live.empty() && live.live_bytes() + bytes > kTargetLiveBytes) live.remove_random(rng);
      live.add(bytes);
    }
  }
  live.clear();
  const double seconds = stopwatch.seconds();

  const uint64_t ops = steps_per_phase * std::size(kPhases);
  const std::string extra = " peak_live_kb=" + std::to_string(live.peak_live_bytes() / 1024);
  return workload::report("fragmentation", 1, ops, seconds, checks, extra);
}
