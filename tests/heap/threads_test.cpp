// Threads: a stress run where blocks are freed by threads other than their allocator, large
// mappings changing hands, and a churn of short-lived threads whose heaps and memory must be
// reused.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "heap/config.hpp"
#include "large/config.hpp"
#include "purge/config.hpp"
#include "segment/config.hpp"
#include "size_classes/config.hpp"
#include "heap/heap.hpp"
#include "size_classes/size_classes.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::Block;
using tray_test::Rng;

struct Problems {
  std::atomic<size_t> corrupt_blocks{0};
  std::atomic<size_t> failed_allocations{0};
};

// Every block is filled from its address when allocated and checked just before it is freed,
// by whichever thread frees it.
Block allocate_filled(size_t size, Problems& problems) {
  const Block block = tray_test::allocate_filled(size);
  if (block.ptr == nullptr) problems.failed_allocations.fetch_add(1, std::memory_order_relaxed);
  return block;
}

void free_checked(const Block& block, Problems& problems) {
  if (!tray_test::free_checked(block))
    problems.corrupt_blocks.fetch_add(1, std::memory_order_relaxed);
}

Block take_random(std::vector<Block>& blocks, Rng& rng) {
  const size_t index = rng.between(0, blocks.size() - 1);
  const Block block = blocks[index];
  blocks[index] = blocks.back();
  blocks.pop_back();
  return block;
}

// Blocks that other threads handed to one thread for freeing.
class Mailbox {
 public:
  void post(const Block& block) {
    std::lock_guard lock(mutex_);
    blocks_.push_back(block);
  }
  std::vector<Block> take_all() {
    std::lock_guard lock(mutex_);
    return std::exchange(blocks_, {});
  }

 private:
  std::mutex mutex_;
  std::vector<Block> blocks_;
};

struct StressShared {
  explicit StressShared(unsigned threads) : mailboxes(threads) {}
  std::vector<Mailbox> mailboxes;
  Problems problems;
  std::atomic<size_t> blocks_posted{0};
};

constexpr size_t kLiveLimit = 512;     // blocks a stress thread holds before retiring half
constexpr size_t kMailboxPeriod = 64;  // allocations between two looks at the mailbox

void stress_thread(unsigned self, size_t allocations, StressShared& shared) {
  Rng rng(self * 7919 + 1);
  const size_t thread_count = shared.mailboxes.size();
  std::vector<Block> live;
  live.reserve(kLiveLimit);
  for (size_t i = 1; i <= allocations; ++i) {
    const Block block = allocate_filled(tray_test::mixed_size(rng), shared.problems);
    if (block.ptr != nullptr) live.push_back(block);
    if (live.size() == kLiveLimit) {
      // Random picks leave pages partly used, so pages keep moving between full and free.
      while (live.size() > kLiveLimit / 2) {
        const Block retired = take_random(live, rng);
        if (rng.next() % 4 == 0) {
          const size_t receiver = (self + 1 + rng.between(0, thread_count - 2)) % thread_count;
          shared.mailboxes[receiver].post(retired);
          shared.blocks_posted.fetch_add(1, std::memory_order_relaxed);
        } else {
          free_checked(retired, shared.problems);
        }
      }
    }
    if (i % kMailboxPeriod == 0)
      for (const Block& received : shared.mailboxes[self].take_all())
        free_checked(received, shared.problems);
  }
  for (const Block& block : live) free_checked(block, shared.problems);
}

TEST(Threads, CrossThreadFreesUnderStress) {
  constexpr unsigned kThreads = 4;
  const size_t allocations_per_thread = tray_test::scaled(400000);
  const size_t large_bytes_before = tray_test::stats_now().large.live_bytes;

  StressShared shared(kThreads);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t)
    threads.emplace_back(stress_thread, t, allocations_per_thread, std::ref(shared));
  for (std::thread& thread : threads) thread.join();
  // What was posted after its receiver's last look is freed here, after its allocator exited.
  for (Mailbox& mailbox : shared.mailboxes)
    for (const Block& block : mailbox.take_all()) free_checked(block, shared.problems);

  EXPECT_EQ(shared.problems.corrupt_blocks.load(), 0u);
  EXPECT_EQ(shared.problems.failed_allocations.load(), 0u);
  EXPECT_GT(shared.blocks_posted.load(), allocations_per_thread / 10);
  EXPECT_EQ(tray_test::stats_now().large.live_bytes, large_bytes_before);
}

// Blocks too big for the large-block cache are mapped and unmapped on every call, so the
// threads keep getting address ranges another thread has just given back. Only the ends of a
// block are touched: filling it would prove nothing more.
TEST(Threads, LargeMappingsMoveBetweenThreads) {
  constexpr unsigned kThreads = 3;
  constexpr size_t kBlockBytes = tray::kLargeCacheFloorBytes + 8 * tray_test::kMiB;
  const size_t rounds = tray_test::scaled(2000);
  std::atomic<size_t> failures{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (size_t i = 0; i < rounds; ++i) {
        const size_t size = kBlockBytes + i % 4096;
        auto* bytes = static_cast<unsigned char*>(tray_malloc(size));
        if (bytes == nullptr || tray_owns(bytes) != 1) {
          failures.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        bytes[0] = 1;
        bytes[size - 1] = 2;
        tray_free(bytes);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0u);
}

constexpr size_t kBlocksPerChurnThread = 64;

// Allocates, frees half of its blocks itself and hands the other half to the main thread,
// which frees them after this thread is gone.
void churn_thread(size_t index, std::vector<Block>& handed_over, Problems& problems) {
  Rng rng(index + 1);
  std::vector<Block> blocks;
  for (size_t i = 0; i < kBlocksPerChurnThread; ++i) {
    const Block block = allocate_filled(tray_test::mixed_size(rng), problems);
    if (block.ptr != nullptr) blocks.push_back(block);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i % 2 == 0) {
      free_checked(blocks[i], problems);
    } else {
      handed_over.push_back(blocks[i]);
    }
  }
}

// The memory the test bounds: the process's resident bytes, or under ASan the allocator's
// own committed bytes. ASan's shadow of memory that was poisoned stays resident after the
// allocator gives the memory back with madvise, so the process grows with every address the
// allocator ever used: in runs under load (ctest -j), 9 MiB between the two readings of which
// the allocator's committed bytes were under 5.
size_t held_bytes() {
  return tray_test::kAddressSanitizer ? size_t(tray_test::stats_now().committed_bytes)
                                      : tray_test::resident_bytes();
}

// Held bytes once the idle purger has given back what was freed: pages freed a moment ago
// wait out their purge delay, and up to the dirty floor of them could otherwise be counted at
// one reading and not at the other.
size_t settled_held_bytes() {
  std::this_thread::sleep_for(
      std::chrono::milliseconds(tray::kPurgeDelayMs + tray::kPurgerLateMs + 100));
  return held_bytes();
}

// Held bytes once they are at most `bound`, or after 3 s: on a loaded machine (ctest -j) the
// idle purger can run later than its deadlines, so memory on its way back to the OS is given
// time to get there; memory that is kept for good still fails the bound.
size_t held_bytes_within(size_t bound) {
  size_t held = settled_held_bytes();
  for (int wait = 0; wait < 30 && held > bound; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    held = held_bytes();
  }
  return held;
}

TEST(Threads, ShortLivedThreadsReuseHeapsAndMemory) {
  constexpr size_t kConcurrent = 4;
  const size_t thread_total = tray_test::scaled(3000);
  const size_t heaps_before = tray_test::stats_now().heaps_created;
  Problems problems;
  size_t held_after_first_third = 0;

  for (size_t started = 0; started < thread_total; started += kConcurrent) {
    std::array<std::vector<Block>, kConcurrent> handed_over;
    std::vector<std::thread> batch;
    for (size_t t = 0; t < kConcurrent; ++t)
      batch.emplace_back(churn_thread, started + t, std::ref(handed_over[t]), std::ref(problems));
    for (std::thread& thread : batch) thread.join();
    for (const auto& blocks : handed_over)
      for (const Block& block : blocks) free_checked(block, problems);
    if (held_after_first_third == 0 && started + kConcurrent >= thread_total / 3)
      held_after_first_third = settled_held_bytes();
  }

  EXPECT_EQ(problems.corrupt_blocks.load(), 0u);
  EXPECT_EQ(problems.failed_allocations.load(), 0u);
  // A heap whose thread exited is taken over by the next thread: the batch size, plus the
  // main thread's own heap, bounds how many were ever needed.
  EXPECT_LE(tray_test::stats_now().heaps_created - heaps_before, kConcurrent + 2);
  if (tray_test::kResidentBoundsHold) {
    const size_t bound = held_after_first_third + tray_test::rss_slack(held_after_first_third);
    EXPECT_LE(held_bytes_within(bound), bound)
        << "resident memory kept growing while threads came and went";
  }
}

// Bytes of pages the small classes hold, in every heap and parked or not.
size_t small_page_bytes() {
  const tray_stats stats = tray_test::stats_now();
  size_t bytes = 0;
  for (unsigned c = 0; c < stats.class_count; ++c)
    bytes += stats.classes[c].pages * stats.classes[c].page_bytes;
  return bytes;
}

// A thread that used a block of each of the big classes, whose pages span up to 16 units, and
// freed them all: the pages its classes allocated from are empty, and its parked heap may keep
// no more of them than kHeapRetainedBytes. Kept whole, they were several MiB per exited thread
// that other threads then took fresh pages beside (mstress).
TEST(Threads, AnExitedThreadsHeapKeepsAtMostItsRetainedBudgetOfEmptyPages) {
  std::vector<size_t> sizes;
  for (size_t size = 16 * tray_test::kKiB; size <= tray::kMaxSmallBytes; size += 8 * tray_test::kKiB)
    sizes.push_back(size);
  const size_t before = small_page_bytes();
  std::thread([&] {
    for (const size_t size : sizes) {
      void* p = tray_malloc(size);
      ASSERT_NE(p, nullptr);
      std::memset(p, 1, size);
      tray_free(p);
    }
  }).join();
  const size_t after = small_page_bytes();
  EXPECT_LE(after, before + tray::kHeapRetainedBytes)
      << "an exited thread's heap kept " << (after - before) / tray_test::kKiB
      << " KiB of pages with no live block";
}

// A trim gives back the empty pages of every parked heap, those another thread is collecting
// at that moment too. A collection (the purger's, or a thread's slow path) takes the heaps
// with work off the parked stack while it works on them; a trim that did not wait for it found
// them gone and left their pages held. Here a thread does nothing but collect, as the purger
// does when parked heaps keep getting frees, while owners exit and their blocks are freed.
TEST(Threads, TrimBesideACollectionOfParkedHeapsGivesTheirPagesBack) {
  constexpr size_t kBytes = 3000;
  constexpr unsigned kOwners = 6;
  constexpr size_t kPerOwner = 64;
  const size_t rounds = tray_test::scaled(60);
  constexpr unsigned kClass = tray::size_class_of(kBytes);
  auto class_pages = [] { return tray_test::stats_now().classes[kClass].pages; };
  tray_trim();
  const unsigned long long pages_before = class_pages();
  std::atomic<bool> stop{false};
  std::thread collector([&] {
    while (!stop.load(std::memory_order_relaxed)) tray::heap_collect_idle();
  });
  Problems problems;
  size_t rounds_with_pages_left = 0;
  unsigned long long most_pages_left = 0;
  for (size_t round = 0; round < rounds; ++round) {
    std::array<std::vector<Block>, kOwners> owned;
    std::vector<std::thread> owners;
    for (unsigned o = 0; o < kOwners; ++o)
      owners.emplace_back([&, o] {
        for (size_t i = 0; i < kPerOwner; ++i)
          owned[o].push_back(allocate_filled(kBytes, problems));
      });
    for (std::thread& owner : owners) owner.join();
    for (const auto& blocks : owned)
      for (const Block& block : blocks) free_checked(block, problems);
    tray_trim();
    const unsigned long long left = class_pages() - pages_before;
    if (left != 0) ++rounds_with_pages_left;
    most_pages_left = std::max(most_pages_left, left);
  }
  stop.store(true);
  collector.join();
  EXPECT_EQ(problems.corrupt_blocks.load(), 0u);
  EXPECT_EQ(problems.failed_allocations.load(), 0u);
  EXPECT_EQ(rounds_with_pages_left, 0u)
      << "of " << rounds << " trims, up to " << most_pages_left << " pages of exited owners kept";
}

}  // namespace
