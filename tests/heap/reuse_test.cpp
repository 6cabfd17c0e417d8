// Blocks handed between threads and reused by the thread that frees them (lib/heap/reuse.hpp):
// a stage of a pipeline allocates the blocks it freed; a thread that frees mostly its own
// blocks keeps nothing; what a thread keeps goes home when it ends or trims, and never blocks
// of a program heap; sample points and fork meet kept blocks. Each block's fill is checked
// when it is freed: a block handed out twice breaks it.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "keep_foreign.hpp"
#include "size_classes/size_classes.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::Block;

// Batches of blocks passed from one thread to another.
class Channel {
 public:
  void send(std::vector<Block> batch) {
    {
      std::lock_guard<std::mutex> guard(lock_);
      batches_.push_back(std::move(batch));
    }
    ready_.notify_one();
  }
  std::vector<Block> receive() {
    std::unique_lock<std::mutex> guard(lock_);
    ready_.wait(guard, [&] { return !batches_.empty(); });
    std::vector<Block> batch = std::move(batches_.front());
    batches_.pop_front();
    return batch;
  }

 private:
  std::mutex lock_;
  std::condition_variable ready_;
  std::deque<std::vector<Block>> batches_;
};

std::vector<Block> allocate_batch(size_t count, size_t size) {
  std::vector<Block> batch;
  for (size_t i = 0; i < count; ++i) batch.push_back(tray_test::allocate_filled(size));
  return batch;
}

// Frees a batch, checking every block; returns how many were intact.
size_t free_batch(const std::vector<Block>& batch) {
  size_t intact = 0;
  for (const Block& block : batch) intact += tray_test::free_checked(block) ? 1 : 0;
  return intact;
}

unsigned long long reused_now() { return tray_test::stats_now().reused_blocks; }

unsigned long long class_pages(size_t size) {
  return tray_test::stats_now().classes[tray::size_class_of(size)].pages;
}

// Two stages of a pipeline: each frees what the other allocated, then allocates as many blocks
// itself and hands them on. After a span of such frees the counters of at least one of them
// turn keeping on, and it allocates the blocks it freed from then on, rather than send them
// home and allocate blocks of its own pages.
TEST(Reuse, APipelineKeepsWhatItFrees) {
  constexpr size_t kBlocks = 6000;  // more than a span of kReuseEpochFrees frees a round
  constexpr size_t kSize = 48;
  constexpr unsigned kRounds = 8;
  const unsigned long long reused_before = reused_now();
  Channel to_stage;
  Channel back;
  size_t intact = 0;
  std::thread stage([&] {
    for (unsigned round = 0; round < kRounds; ++round) {
      intact += free_batch(to_stage.receive());
      back.send(allocate_batch(kBlocks, kSize));
    }
  });
  for (unsigned round = 0; round < kRounds; ++round) {
    to_stage.send(allocate_batch(kBlocks, kSize));
    intact += free_batch(back.receive());
  }
  stage.join();
  EXPECT_EQ(intact, 2 * kRounds * kBlocks);
  EXPECT_GE(reused_now() - reused_before, 3 * kBlocks) << "neither stage kept what it freed";
}

// A thread that frees its own blocks thousands of times for each block another thread handed
// it (larson) would keep those blocks for itself in vain: each of its later frees of them would
// be another heap's block again. Its counters keep keeping off.
TEST(Reuse, AThreadThatMostlyFreesItsOwnBlocksKeepsNothing) {
  constexpr size_t kSlots = 1000;
  constexpr size_t kSize = 80;
  constexpr unsigned kRounds = 12;  // three spans of frees of others' blocks
  const size_t steps = 20000;
  const unsigned long long reused_before = reused_now();
  Channel to_worker;
  size_t intact = 0;
  bool kept = true;
  std::thread worker([&] {
    tray_test::Rng rng(11);
    std::vector<Block> slots;
    for (unsigned round = 0; round < kRounds; ++round) {
      std::vector<Block> received = to_worker.receive();
      for (const Block& block : slots) intact += tray_test::free_checked(block) ? 1 : 0;
      slots = std::move(received);
      for (size_t step = 0; step < steps; ++step) {
        Block& slot = slots[rng.between(0, kSlots - 1)];
        intact += tray_test::free_checked(slot) ? 1 : 0;
        slot = tray_test::allocate_filled(kSize);
      }
    }
    intact += free_batch(slots);
    kept = tray::tls_own_heap->reuse_on;
  });
  for (unsigned round = 0; round < kRounds; ++round) to_worker.send(allocate_batch(kSlots, kSize));
  worker.join();
  EXPECT_EQ(intact, kRounds * (steps + kSlots));
  EXPECT_FALSE(kept);
  EXPECT_EQ(reused_now(), reused_before);
}

// What a thread keeps and never allocates goes home when the thread ends, or when it trims:
// its owner's pages empty and go back with the owner's trim.
void kept_blocks_go_home(bool by_trim) {
  constexpr size_t kSize = 6000;  // the 6 KiB class, which the other tests leave alone
  constexpr size_t kBlocks = 400;
  tray_trim();
  const unsigned long long pages_before = class_pages(kSize);
  std::vector<Block> batch = allocate_batch(kBlocks, kSize);
  size_t intact = 0;
  bool still_held = false;
  std::thread keeper([&] {
    tray_test::keep_foreign_blocks(true);
    // The class is one the thread allocates from, so that its runs take the blocks in.
    const Block own = tray_test::allocate_filled(kSize);
    intact += free_batch(batch);
    intact += tray_test::free_checked(own) ? 1 : 0;
    if (by_trim) {
      tray_trim();
      for (const auto& runs : tray::tls_own_heap->reuse)
        for (const tray::ReuseRun& run : runs) still_held |= run.count != 0;
    }
  });
  keeper.join();
  EXPECT_EQ(intact, kBlocks + 1);
  EXPECT_FALSE(still_held);
  tray_trim();
  EXPECT_EQ(class_pages(kSize), pages_before) << "a block stayed with the thread that freed it";
}

TEST(Reuse, KeptBlocksGoHomeWhenTheThreadEnds) { kept_blocks_go_home(false); }
TEST(Reuse, KeptBlocksGoHomeWhenTheThreadTrims) { kept_blocks_go_home(true); }

// Blocks of a program heap go to its part, whatever the freeing thread keeps: a destroy must
// find every block freed before it.
TEST(Reuse, BlocksOfAProgramHeapAreNeverKept) {
  constexpr size_t kBlocks = 2000;
  constexpr size_t kSize = 96;
  tray_heap_t* heap = tray_heap_new();
  ASSERT_NE(heap, nullptr);
  std::vector<Block> batch;
  for (size_t i = 0; i < kBlocks; ++i) {
    void* p = tray_heap_malloc(heap, kSize);
    ASSERT_NE(p, nullptr);
    tray_test::fill_pattern(p, kSize);
    batch.push_back({p, kSize});
  }
  const unsigned long long reused_before = reused_now();
  size_t intact = 0;
  size_t in_heap = 0;
  std::thread keeper([&] {
    tray_test::keep_foreign_blocks(true);
    std::vector<Block> own = allocate_batch(kBlocks, kSize);
    intact += free_batch(batch);
    std::vector<Block> again = allocate_batch(kBlocks, kSize);
    for (const Block& block : again) in_heap += tray_heap_of(block.ptr) == heap ? 1 : 0;
    intact += free_batch(own) + free_batch(again);
  });
  keeper.join();
  tray_heap_destroy(heap);
  EXPECT_EQ(intact, 3 * kBlocks);
  EXPECT_EQ(in_heap, 0u);
  EXPECT_EQ(reused_now(), reused_before);
}

// With a sampler on, a sample point falls among kept blocks now and then: they go home
// rather than into the slot, and the sampled allocation is served as any other.
TEST(Reuse, SamplePointsAmongKeptBlocks) {
  constexpr size_t kBlocks = 3000;
  constexpr size_t kSize = 64;
  ASSERT_EQ(tray_option_set("guard_sample", "16k"), 0);
  Channel to_stage;
  Channel back;
  size_t intact = 0;
  std::thread stage([&] {
    tray_test::keep_foreign_blocks(true);
    for (unsigned round = 0; round < 8; ++round) {
      intact += free_batch(to_stage.receive());
      back.send(allocate_batch(kBlocks, kSize));
    }
  });
  for (unsigned round = 0; round < 8; ++round) {
    to_stage.send(allocate_batch(kBlocks, kSize));
    intact += free_batch(back.receive());
  }
  stage.join();
  ASSERT_EQ(tray_option_set("guard_sample", "0"), 0);
  EXPECT_EQ(intact, 16 * kBlocks);
}

// A child forked while its parent keeps other threads' blocks allocates them as the parent
// would, and so does the parent after.
TEST(Reuse, ForkWhileBlocksAreKept) {
  constexpr size_t kBlocks = 500;
  constexpr size_t kSize = 112;
  tray_test::keep_foreign_blocks(true);
  std::vector<Block> own = allocate_batch(kBlocks, kSize);
  std::vector<Block> theirs;
  std::thread maker([&] { theirs = allocate_batch(kBlocks, kSize); });
  maker.join();
  size_t intact = free_batch(theirs);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::vector<Block> again = allocate_batch(kBlocks, kSize);
    const bool ok = free_batch(again) == kBlocks && free_batch(own) == kBlocks;
    tray_trim();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::vector<Block> again = allocate_batch(kBlocks, kSize);
  intact += free_batch(again) + free_batch(own);
  tray_test::keep_foreign_blocks(false);
  EXPECT_EQ(intact, 3 * kBlocks);
}

}  // namespace
