// fork() from a program whose threads are busy allocating, with libtraymalloc.so preloaded.
// The child inherits the allocator in whatever state the other threads left it; it must be
// able to read and free the parent's blocks, allocate, start a thread, and fork again. A lock
// left held across fork shows up as a hang, which the test's timeout turns into a failure.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "override_support.hpp"

namespace {

using tray_test::fill_pattern;
using tray_test::has_pattern;

constexpr int kWorkers = 3;
constexpr int kForks = 20;
constexpr size_t kParentBlocks = 400;

struct Block {
  void* p;
  size_t bytes;
  uint32_t seed;
};

// A child reports what went wrong through its exit status.
enum ChildStatus : int {
  kChildOk = 0,
  kParentBlockDamaged = 10,
  kParentBlockNotOurs,
  kAllocationFailed,
  kThreadFailed,
  kGrandchildFailed,
  kForkFailed,
  kOwnBlockDamaged,
};

size_t size_for(uint32_t i) {
  static constexpr size_t kSizes[] = {8, 40, 200, 1000, 5000, 40000, 200000};
  return kSizes[i % (sizeof kSizes / sizeof kSizes[0])];
}

std::vector<Block> allocate_blocks(size_t count, uint32_t first_seed) {
  std::vector<Block> blocks;
  for (uint32_t i = 0; i < count; ++i) {
    const size_t bytes = size_for(i);
    void* p = malloc(bytes);
    if (p != nullptr) fill_pattern(p, bytes, first_seed + i);
    blocks.push_back({p, bytes, first_seed + i});
  }
  return blocks;
}

bool all_intact(const std::vector<Block>& blocks) {
  for (const Block& b : blocks)
    if (b.p == nullptr || !has_pattern(b.p, b.bytes, b.seed)) return false;
  return true;
}

// Random-sized malloc/free traffic until told to stop, from a private xorshift stream.
void churn(uint32_t seed, const std::atomic<bool>& stop) {
  void* live[64] = {};
  uint32_t x = seed | 1;
  while (!stop.load(std::memory_order_relaxed)) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    void*& slot = live[x % 64];
    free(slot);
    slot = malloc(size_for(x >> 8));
  }
  for (void* p : live) free(p);
}

// The grandchild: plain allocator use in a process forked from a forked process.
[[noreturn]] void grandchild_main() {
  std::vector<Block> blocks = allocate_blocks(300, 9000);
  const bool intact = all_intact(blocks);
  for (const Block& b : blocks) free(b.p);
  _exit(intact ? kChildOk : kOwnBlockDamaged);
}

int child_main(const std::vector<Block>& parent_blocks, const tray_test::LoadedTray& tray) {
  if (!all_intact(parent_blocks)) return kParentBlockDamaged;
  for (const Block& b : parent_blocks)
    if (tray.owns(b.p) != 1) return kParentBlockNotOurs;
  for (size_t i = 0; i < parent_blocks.size(); i += 2) free(parent_blocks[i].p);

  std::vector<Block> own = allocate_blocks(500, 5000);
  for (const Block& b : own)
    if (b.p == nullptr || tray.owns(b.p) != 1) return kAllocationFailed;

  // A thread of the child frees the rest of the parent's blocks and allocates on its own.
  bool thread_ok = false;
  try {
    std::thread helper([&] {
      for (size_t i = 1; i < parent_blocks.size(); i += 2) free(parent_blocks[i].p);
      std::vector<Block> mine = allocate_blocks(300, 7000);
      thread_ok = all_intact(mine);
      for (const Block& b : mine) free(b.p);
    });
    helper.join();
  } catch (...) {
    return kThreadFailed;
  }
  if (!thread_ok) return kThreadFailed;

  const pid_t grandchild = fork();
  if (grandchild < 0) return kForkFailed;
  if (grandchild == 0) grandchild_main();
  int status = 0;
  if (waitpid(grandchild, &status, 0) != grandchild || !WIFEXITED(status) ||
      WEXITSTATUS(status) != kChildOk)
    return kGrandchildFailed;

  if (!all_intact(own)) return kOwnBlockDamaged;
  for (const Block& b : own) free(b.p);
  return kChildOk;
}

TEST(ForkUnderPreload, ChildrenOfABusyProcessAllocateFreeAndForkAgain) {
  const tray_test::LoadedTray tray = tray_test::LoadedTray::find();
  ASSERT_TRUE(tray.present()) << "run this test with libtraymalloc.so in LD_PRELOAD";

  const std::vector<Block> parent_blocks = allocate_blocks(kParentBlocks, 1);
  ASSERT_TRUE(all_intact(parent_blocks));
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) workers.emplace_back(churn, 1000u + w, std::cref(stop));

  // Failures are collected, not asserted, so the workers are always stopped and joined.
  std::string failure;
  for (int round = 0; round < kForks && failure.empty(); ++round) {
    const pid_t child = fork();
    if (child < 0) {
      failure = "fork failed";
      break;
    }
    if (child == 0) _exit(child_main(parent_blocks, tray));
    int status = 0;
    if (waitpid(child, &status, 0) != child) failure = "waitpid failed";
    else if (WIFSIGNALED(status))
      failure = "round " + std::to_string(round) + ": child killed by signal " +
                std::to_string(WTERMSIG(status));
    else if (WEXITSTATUS(status) != kChildOk)
      failure = "round " + std::to_string(round) + ": child exited with status " +
                std::to_string(WEXITSTATUS(status));
    free(malloc(size_for(uint32_t(round))));
  }
  stop = true;
  for (std::thread& t : workers) t.join();

  EXPECT_EQ(failure, "");
  EXPECT_TRUE(all_intact(parent_blocks));
  for (const Block& b : parent_blocks) {
    EXPECT_EQ(tray.owns(b.p), 1);
    free(b.p);
  }
}

}  // namespace
