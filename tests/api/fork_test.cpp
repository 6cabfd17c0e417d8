// fork() while other threads allocate: the child, left with one thread and whatever state
// the others were in, must still allocate, read and free.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstddef>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "size_classes/size_classes.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::Block;
using tray_test::kMiB;

// Threads that allocate, fill, check and free blocks until they are stopped, so that a fork
// lands in the middle of allocator work. Each round fills and empties pages of every small
// class, which moves pages to and from the shared pool, and maps and frees a large block:
// the global locks are often held when the fork comes.
class AllocationLoops {
 public:
  explicit AllocationLoops(unsigned thread_count) {
    for (unsigned t = 0; t < thread_count; ++t) threads_.emplace_back([this, t] { run(t); });
  }
  ~AllocationLoops() {
    stop_.store(true);
    for (std::thread& thread : threads_) thread.join();
  }
  size_t rounds() const { return rounds_.load(std::memory_order_relaxed); }
  size_t corrupt_blocks() const { return corrupt_blocks_.load(); }

 private:
  void run(unsigned seed) {
    tray_test::Rng rng(seed + 100);
    std::array<Block, 64> burst{};
    while (!stop_.load(std::memory_order_relaxed)) {
      for (Block& block : burst)
        block = tray_test::allocate_filled(rng.between(1, tray::kMaxSmallBytes));
      const size_t large_size = rng.between(tray::kMaxSmallBytes + 1, 4 * kMiB);
      if (auto* large = static_cast<unsigned char*>(tray_malloc(large_size))) {
        large[0] = large[large_size - 1] = 1;
        tray_free(large);
      }
      for (const Block& block : burst)
        if (block.ptr != nullptr) release(block);
      rounds_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void release(const Block& block) {
    if (!tray_test::free_checked(block)) corrupt_blocks_.fetch_add(1);
  }

  std::atomic<bool> stop_{false};
  std::atomic<size_t> rounds_{0};
  std::atomic<size_t> corrupt_blocks_{0};
  std::vector<std::thread> threads_;
};

// Exit codes of the child, one per kind of failure.
enum ChildExit : int {
  kChildSucceeded = 0,
  kParentBlockCorrupt = 10,
  kChildAllocationFailed = 11,
  kChildBlockCorrupt = 12,
};

// How a child ended, in words, from its waitpid status.
std::string describe_end(int status) {
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return "killed by signal " + std::to_string(signal) +
           (signal == SIGALRM ? " (the watchdog: it deadlocked)" : "");
  }
  switch (WEXITSTATUS(status)) {
    case kChildSucceeded: return "success";
    case kParentBlockCorrupt: return "a block allocated by the parent lost its contents";
    case kChildAllocationFailed: return "an allocation in the child returned NULL";
    case kChildBlockCorrupt: return "a block allocated in the child lost its contents";
    default: return "exit code " + std::to_string(WEXITSTATUS(status));
  }
}

bool ended_well(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == kChildSucceeded; }

// A deadlocked child (a lock held by a parent thread at fork time) is killed by SIGALRM.
constexpr unsigned kChildWatchdogSeconds = 30;
constexpr size_t kBlocksPerClass = 8;
constexpr size_t kLargeBlockSizes[] = {tray::kMaxSmallBytes + 1, 1 * kMiB, 6 * kMiB};
constexpr size_t kBlocksAcrossClasses =
    tray::kSizeClassCount * kBlocksPerClass + std::size(kLargeBlockSizes);

using BlockSet = std::array<Block, kBlocksAcrossClasses>;

// Fills `blocks` with blocks of every size class and a few large ones; false if one failed.
bool allocate_across_classes(BlockSet& blocks) {
  size_t next = 0;
  for (unsigned c = 0; c < tray::kSizeClassCount; ++c)
    for (size_t k = 0; k < kBlocksPerClass; ++k) blocks[next++].size = tray::class_size(c) - k;
  for (size_t size : kLargeBlockSizes) blocks[next++].size = size;
  for (Block& block : blocks) {
    block = tray_test::allocate_filled(block.size);
    if (block.ptr == nullptr) return false;
  }
  return true;
}

bool check_and_free(const BlockSet& blocks) {
  bool intact = true;
  for (const Block& block : blocks) intact = tray_test::free_checked(block) && intact;
  return intact;
}

// Enough blocks that the child must take fresh pages from the shared pool, whose lock a
// parent thread may have held at the fork.
int allocate_fresh_pages() {
  std::array<Block, 1024> blocks;
  tray_test::Rng rng(77);
  for (Block& block : blocks) {
    block = tray_test::allocate_filled(tray_test::mixed_size(rng));
    if (block.ptr == nullptr) return kChildAllocationFailed;
  }
  bool intact = true;
  for (const Block& block : blocks) intact = tray_test::free_checked(block) && intact;
  return intact ? kChildSucceeded : kChildBlockCorrupt;
}

// Runs in the child: no gtest assertions here, only an exit code for the parent to read.
int child_main(const BlockSet& parent_blocks) {
  if (!check_and_free(parent_blocks)) return kParentBlockCorrupt;
  for (int round = 0; round < 2; ++round) {
    BlockSet blocks;
    if (!allocate_across_classes(blocks)) return kChildAllocationFailed;
    if (!check_and_free(blocks)) return kChildBlockCorrupt;
  }
  return allocate_fresh_pages();
}

// Forks while the parent holds blocks of every class: the child runs `child` (child_main unless
// a test needs more) on its copy of them, and the parent checks how the child ended and that
// its own blocks are intact (the child's frees touched its own copy only).
void fork_and_check(int fork_index, int (*child)(const BlockSet&) = child_main) {
  BlockSet parent_blocks;
  ASSERT_TRUE(allocate_across_classes(parent_blocks));
  const pid_t pid = ::fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    ::alarm(kChildWatchdogSeconds);
    ::_exit(child(parent_blocks));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(ended_well(status)) << "fork " << fork_index << ": child " << describe_end(status);
  EXPECT_TRUE(check_and_free(parent_blocks)) << "fork " << fork_index;
}

TEST(Fork, ChildOfAMultiThreadedParentAllocatesAndFrees) {
  // Each fork has a fair chance to catch a lock held; a dozen make a missing fork handler
  // show up reliably.
  constexpr int kForks = 12;
  AllocationLoops loops(3);
  for (int fork_index = 0; fork_index < kForks; ++fork_index) {
    // Fork only once the loops have done a round since the previous fork.
    const size_t rounds_before = loops.rounds();
    while (loops.rounds() <= rounds_before) std::this_thread::yield();

    ASSERT_NO_FATAL_FAILURE(fork_and_check(fork_index));
  }
  EXPECT_EQ(loops.corrupt_blocks(), 0u);
}

// After a fork the child is single-threaded again and may start threads of its own; their
// heaps must work, and blocks must still move between them.
int child_runs_a_thread(const BlockSet& parent_blocks) {
  BlockSet thread_blocks;
  bool allocated = false;
  std::thread([&] { allocated = allocate_across_classes(thread_blocks); }).join();
  if (!allocated) return kChildAllocationFailed;
  if (!check_and_free(thread_blocks)) return kChildBlockCorrupt;
  return child_main(parent_blocks);
}

TEST(Fork, ChildOfASingleThreadedParentRunsThreads) {
  // The parent's large blocks would start the purger thread, and the parent would no longer be
  // single-threaded (ThreadSanitizer then kills a child that starts a thread).
  ASSERT_EQ(tray_option_set("purge_thread", "0"), 0);
  ASSERT_NO_FATAL_FAILURE(fork_and_check(0, child_runs_a_thread));
}

// fork while another thread is sending blocks home: the fork may land with a batch half
// gathered in the sender's heap or half pushed onto the owner's stack. The child, whose sender
// does not exist, must still allocate and free in every class; the parent's blocks keep
// coming home afterwards.
TEST(Fork, WhileBlocksAreInTransit) {
  constexpr int kForks = 8;
  std::atomic<bool> stop{false};
  std::atomic<size_t> corrupt{0};
  std::atomic<size_t> freed{0};
  std::mutex queue_lock;
  std::vector<Block> queue;
  std::thread sender([&] {
    tray_free(tray_malloc(16));  // a heap of its own: remote frees gather in its buckets
    std::vector<Block> taken;
    while (!stop.load()) {
      {
        std::lock_guard<std::mutex> hold(queue_lock);
        taken.swap(queue);
      }
      for (const Block& block : taken) {
        if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
        freed.fetch_add(1);
      }
      taken.clear();
    }
  });
  tray_test::Rng rng(9);
  for (int fork_index = 0; fork_index < kForks; ++fork_index) {
    const size_t freed_before = freed.load();
    {
      std::lock_guard<std::mutex> hold(queue_lock);
      for (int i = 0; i < 300; ++i) queue.push_back(tray_test::allocate_filled(tray_test::mixed_size(rng)));
    }
    while (freed.load() == freed_before) std::this_thread::yield();  // the sender is at work

    ASSERT_NO_FATAL_FAILURE(fork_and_check(fork_index));
  }
  stop.store(true);
  sender.join();
  for (const Block& block : queue)
    if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
  EXPECT_EQ(corrupt.load(), 0u);
}

}  // namespace
