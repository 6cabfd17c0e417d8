// Thread churn: threads that start and exit all the time while others free their blocks, the
// pool giving memory back at the same moment (trim, the idle purger, pages returned), heaps of
// dead threads taking frees, and fork in the middle of it all.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "size_classes/config.hpp"
#include "size_classes/size_classes.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::Block;
using tray_test::kMiB;

// Blocks on their way from the threads that made them to the threads that free them.
class Mailbox {
 public:
  void post(std::vector<Block>& blocks) {
    std::lock_guard<std::mutex> hold(lock_);
    for (const Block& block : blocks) blocks_.push_back(block);
    blocks.clear();
  }
  void take(std::vector<Block>& into) {
    std::lock_guard<std::mutex> hold(lock_);
    into.swap(blocks_);
  }

 private:
  std::mutex lock_;
  std::vector<Block> blocks_;
};

struct Counts {
  std::atomic<size_t> corrupt{0};
  std::atomic<size_t> failed{0};
  std::atomic<size_t> freed{0};
};

size_t small_pages() {
  const tray_stats stats = tray_test::stats_now();
  size_t pages = 0;
  for (unsigned c = 0; c < stats.class_count; ++c) pages += stats.classes[c].pages;
  return pages;
}

void free_all(std::vector<Block>& blocks, Counts& counts) {
  for (const Block& block : blocks) {
    if (!tray_test::free_checked(block)) counts.corrupt.fetch_add(1);
    counts.freed.fetch_add(1);
  }
  blocks.clear();
}

// A short life: enough blocks of mixed classes to take pages from the pool, half of them freed
// by the thread itself (pages go back while others are taken), the other half posted to the
// freers, and one in eight kept until the thread has exited, so that its heap is parked with
// live blocks that other threads then free into it.
void short_life(unsigned seed, Mailbox& to_freers, std::vector<Block>& outlive, Counts& counts) {
  tray_test::Rng rng(seed);
  std::vector<Block> mine;
  std::vector<Block> posted;
  for (int i = 0; i < 400; ++i) {
    const Block block = tray_test::allocate_filled(tray_test::mixed_size(rng));
    if (block.ptr == nullptr) {
      counts.failed.fetch_add(1);
      continue;
    }
    switch (rng.between(0, 7)) {
      case 0: outlive.push_back(block); break;
      case 1: case 2: case 3: posted.push_back(block); break;
      default: mine.push_back(block); break;
    }
  }
  // One page of a multi-unit class, left to the freers: its units go back to the pool from
  // another thread's free.
  posted.push_back(tray_test::allocate_filled(tray::kMaxSmallBytes));
  to_freers.post(posted);
  free_all(mine, counts);
}

// Waves of short lives, each wave's survivors freed by the main thread after it joined them,
// while freer threads free what the waves post and a trimmer gives the pool's memory back.
TEST(Churn, ThreadsStartAndExitWhileOthersFreeTheirBlocksAndThePoolPurges) {
  constexpr unsigned kWaveThreads = 4;
  constexpr unsigned kFreers = 2;
  const size_t waves = tray_test::scaled(400);
  Mailbox mailbox;
  Counts counts;
  std::atomic<bool> stop{false};
  std::vector<std::thread> helpers;
  for (unsigned f = 0; f < kFreers; ++f)
    helpers.emplace_back([&] {
      std::vector<Block> taken;
      while (!stop.load()) {
        mailbox.take(taken);
        free_all(taken, counts);
        std::this_thread::yield();
      }
    });
  std::atomic<size_t> trims{0};
  helpers.emplace_back([&] {
    while (!stop.load()) {
      tray_trim();
      trims.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  for (size_t wave = 0; wave < waves; ++wave) {
    std::vector<std::vector<Block>> outlive(kWaveThreads);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < kWaveThreads; ++t)
      threads.emplace_back(short_life, unsigned(wave * kWaveThreads + t), std::ref(mailbox),
                           std::ref(outlive[t]), std::ref(counts));
    for (std::thread& thread : threads) thread.join();
    for (std::vector<Block>& blocks : outlive) free_all(blocks, counts);
  }
  stop.store(true);
  for (std::thread& helper : helpers) helper.join();
  std::vector<Block> rest;
  mailbox.take(rest);
  free_all(rest, counts);

  EXPECT_EQ(counts.corrupt.load(), 0u);
  EXPECT_EQ(counts.failed.load(), 0u);
  EXPECT_GT(trims.load(), 0u);
  // Everything is free: a trim leaves no page of a parked heap and no dirty unit behind.
  tray_trim();
  EXPECT_EQ(small_pages(), 0u) << "pages of dead threads' heaps stayed out of the pool";
}

// The heap of a thread that exited takes frees from many threads at once, while new threads
// start (and may adopt it) and a trim collects it: every block comes home exactly once, so
// the pages end up empty and back in the pool.
TEST(Churn, ManyThreadsFreeIntoTheHeapOfADeadThread) {
  constexpr unsigned kSenders = 4;
  const size_t rounds = tray_test::scaled(60);
  Counts counts;
  for (size_t round = 0; round < rounds; ++round) {
    std::vector<Block> left;
    std::thread([&] {
      tray_test::Rng rng{round};
      for (int i = 0; i < 2000; ++i) left.push_back(tray_test::allocate_filled(tray_test::mixed_size(rng)));
    }).join();
    std::vector<std::thread> threads;
    for (unsigned s = 0; s < kSenders; ++s)
      threads.emplace_back([&, s] {
        for (size_t i = s; i < left.size(); i += kSenders)
          if (!tray_test::free_checked(left[i])) counts.corrupt.fetch_add(1);
      });
    threads.emplace_back([] { tray_free(tray_malloc(64)); });  // adopts a parked heap
    threads.emplace_back([] { tray_trim(); });
    for (std::thread& thread : threads) thread.join();
  }
  EXPECT_EQ(counts.corrupt.load(), 0u);
  tray_trim();
  EXPECT_EQ(small_pages(), 0u);
}

// fork while threads start, exit, free each other's blocks and trim: the child, whose other
// threads do not exist, allocates and frees in every class and runs a thread of its own.
TEST(Churn, ForkWhileThreadsChurn) {
  // A child that starts a thread after a multi-threaded fork is killed by ThreadSanitizer,
  // and can hang in AddressSanitizer (GCC 12's), on the lock of its thread registry that
  // another thread of the parent held at the fork: under them the child starts none, the
  // purger included.
  if (tray_test::kSanitized) {
    ASSERT_EQ(tray_option_set("purge_thread", "0"), 0);
  }
  std::atomic<bool> stop{false};
  Mailbox mailbox;
  Counts counts;
  std::thread churner([&] {
    for (unsigned seed = 0; !stop.load(); ++seed) {
      std::vector<Block> outlive;
      std::thread(short_life, seed, std::ref(mailbox), std::ref(outlive), std::ref(counts)).join();
      free_all(outlive, counts);
    }
  });
  std::thread freer([&] {
    std::vector<Block> taken;
    while (!stop.load()) {
      mailbox.take(taken);
      free_all(taken, counts);
      tray_trim();
    }
  });
  const int forks = tray_test::kThreadSanitizer ? 4 : 16;
  for (int f = 0; f < forks; ++f) {
    const size_t freed_before = counts.freed.load();
    while (counts.freed.load() == freed_before) std::this_thread::yield();
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      bool ok = true;
      for (unsigned c = 0; c < tray::kSizeClassCount && ok; ++c) {
        const Block block = tray_test::allocate_filled(tray::class_size(c));
        ok = block.ptr != nullptr && tray_test::free_checked(block);
      }
      auto large_round_trip = [&] {
        const Block block = tray_test::allocate_filled(4 * kMiB);
        ok = ok && block.ptr != nullptr && tray_test::free_checked(block);
      };
      if (tray_test::kSanitized) large_round_trip();
      else std::thread(large_round_trip).join();
      tray_trim();
      _exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "fork " << f;
  }
  stop.store(true);
  churner.join();
  freer.join();
  std::vector<Block> rest;
  mailbox.take(rest);
  free_all(rest, counts);
  EXPECT_EQ(counts.corrupt.load(), 0u);
  EXPECT_EQ(counts.failed.load(), 0u);
}

}  // namespace
