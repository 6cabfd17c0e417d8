// Span blocks a thread keeps for itself (span_cache.cpp): a thread's next request of about the
// length of a block it freed gets that block, which no other thread gets meanwhile; the blocks
// go back to their arenas when the thread ends, trims, or stops asking for spans; and taking
// them back races safely with the owner.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "api/api.hpp"
#include "span/config.hpp"
#include "platform/os.hpp"
#include "span/span_cache.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::kKiB;
using tray_test::kMiB;

// A span block: malloc of a big class's size gives a block of a page once the thread asks for
// the class often (heap/tails.cpp).
char* span_malloc(size_t size) { return static_cast<char*>(tray::alloc_large_block(size)); }

char* alloc_filled(size_t size, uint8_t seed) {
  auto* p = span_malloc(size);
  if (p != nullptr) tray_test::fill_sequence(p, size, seed);
  return p;
}

// Threads keep blocks only while they meet others at the arenas' locks: the calling thread
// reports having met them as often as that takes, as a thread in a busy program would. Its
// heap first, which holds its cache.
void meet_other_threads() {
  tray_free(tray_malloc(1));
  for (uint32_t i = 0; i < tray::kSpanCacheContentions; ++i) tray::span_cache_contended(tray::os::now_ms());
}

size_t blocks_kept_by_threads() {
  size_t blocks;
  size_t bytes;
  tray::span_cache_usage(&blocks, &bytes);
  return blocks;
}

class SpanCache : public ::testing::Test {
 protected:
  void SetUp() override {
    if (tray::os::page_size() != tray::kOsPageBytes) GTEST_SKIP() << "spans need 4 KiB pages";
    tray_trim();
    meet_other_threads();
  }
};

// Another thread asks for a span, so that the calling thread, which must hold its heap (and
// so its cache: a thread that starts may adopt the heap of one that ended), is not alone in
// asking when it next asks.
void ask_from_another_thread() {
  std::thread([] { tray_free(alloc_filled(300 * kKiB, 7)); }).join();
  tray_trim();  // whatever that thread kept goes back
}

// A thread that has not met others at the arenas lately, while others ask for spans too, keeps
// nothing: the arenas serve it without a wait, and blocks each thread kept apart would only
// add to the program's peak.
// The thread's own requests may meet the purger at an arena's lock now and then (an allocation
// and a free try two locks): the meetings it reports leave room for those.
TEST_F(SpanCache, AThreadThatMeetsNoOtherKeepsNothing) {
  constexpr uint32_t kLocksPerStep = 2;
  std::thread([] {
    tray_free(tray_malloc(1));
    ask_from_another_thread();
    char* p = alloc_filled(300 * kKiB, 1);
    tray_free(p);
    EXPECT_EQ(blocks_kept_by_threads(), 0u) << "kept with no other thread met";
    // At most kSpanCacheContentions - 1 in all, the two steps' own included.
    const uint32_t reported = tray::kSpanCacheContentions - 1 - 2 * kLocksPerStep;
    for (uint32_t i = 0; i < reported; ++i) tray::span_cache_contended(tray::os::now_ms());
    tray_free(alloc_filled(300 * kKiB, 2));
    EXPECT_EQ(blocks_kept_by_threads(), 0u) << "kept after too few meetings";
    for (uint32_t i = reported; i < tray::kSpanCacheContentions; ++i)
      tray::span_cache_contended(tray::os::now_ms());
    tray_free(alloc_filled(300 * kKiB, 3));
    EXPECT_EQ(blocks_kept_by_threads(), 1u) << "not kept once it meets others often";
  }).join();
}

// A thread that has been alone in asking for spans for kSpanIdleMs keeps blocks without
// meeting others at the arenas' locks: nobody waits there, but it skips their search. Once
// another thread asks too, it keeps nothing until it has been alone that long again.
TEST_F(SpanCache, AThreadAloneInAskingKeepsBlocks) {
  std::thread([] {
    tray_free(tray_malloc(1));
    ask_from_another_thread();
    const auto alone_for = std::chrono::milliseconds(2 * tray::kSpanIdleMs);
    const auto until = std::chrono::steady_clock::now() + alone_for;
    while (std::chrono::steady_clock::now() < until) tray_free(alloc_filled(300 * kKiB, 1));
    char* p = alloc_filled(300 * kKiB, 2);
    tray_free(p);
    EXPECT_EQ(blocks_kept_by_threads(), 1u) << "a thread alone in asking kept nothing";
    char* again = alloc_filled(290 * kKiB, 3);
    EXPECT_EQ(again, p);
    ask_from_another_thread();
    tray_free(again);
    EXPECT_EQ(blocks_kept_by_threads(), 0u) << "kept while another thread asked too";
  }).join();
}

// A block freed by a thread is its own next block of about that length, and only its: another
// thread asking for the same length meanwhile gets another block.
TEST_F(SpanCache, AThreadGetsBackTheBlockItFreedAndNoOtherThreadDoes) {
  char* p = alloc_filled(300 * kKiB, 1);
  ASSERT_NE(p, nullptr);
  tray_free(p);
  EXPECT_EQ(blocks_kept_by_threads(), 1u);
  char* elsewhere = nullptr;
  std::thread([&] { elsewhere = alloc_filled(300 * kKiB, 2); }).join();
  EXPECT_NE(elsewhere, p) << "another thread took the block this one keeps";
  char* again = alloc_filled(290 * kKiB, 3);  // the same rounded run
  EXPECT_EQ(again, p);
  EXPECT_EQ(blocks_kept_by_threads(), 0u);
  EXPECT_TRUE(tray_test::sequence_intact(elsewhere, 300 * kKiB, 2));
  tray_free(again);
  tray_free(elsewhere);
}

// Kept blocks count as cached; handed out to calloc, what they touched reads zero; a run more
// than a rounding step longer than the request stays kept.
TEST_F(SpanCache, KeptBlocksCountAsCachedAndCallocOfOneIsZero) {
  char* p = alloc_filled(400 * kKiB, 1);
  ASSERT_NE(p, nullptr);
  tray_free(p);
  const auto kept = tray_test::stats_now();
  EXPECT_GE(kept.large.cached_blocks, 1u);
  EXPECT_GE(kept.large.cached_bytes, 400 * kKiB) << "the block's touched bytes count as cached";
  char* shorter = alloc_filled(200 * kKiB, 2);
  EXPECT_NE(shorter, p) << "half the length is not about the same";
  EXPECT_EQ(blocks_kept_by_threads(), 1u);
  auto* zeroed = static_cast<char*>(tray_calloc(1, 400 * kKiB));
  ASSERT_EQ(zeroed, p);
  for (size_t i = 0; i < 400 * kKiB; i += 64) ASSERT_EQ(zeroed[i], 0) << "at " << i;
  tray_free(zeroed);
  tray_free(shorter);
}

// At most kSpanCacheBlocks blocks, of runs up to kSpanCacheMaxRunBytes: the oldest goes back to
// its arena to make room, and longer blocks go there at once.
TEST_F(SpanCache, AThreadKeepsAFewBlocksOfUpToAMegabyte) {
  std::vector<char*> blocks;
  for (size_t i = 0; i < tray::kSpanCacheBlocks + 2; ++i) blocks.push_back(alloc_filled(260 * kKiB, uint8_t(i)));
  for (char* p : blocks) tray_free(p);
  EXPECT_EQ(blocks_kept_by_threads(), tray::kSpanCacheBlocks);
  char* big = alloc_filled(1100 * kKiB, 9);
  ASSERT_NE(big, nullptr);
  tray_free(big);
  EXPECT_EQ(blocks_kept_by_threads(), tray::kSpanCacheBlocks) << "a block of over 1 MiB was kept";
  // The newest come back first.
  for (size_t i = blocks.size(); i-- > blocks.size() - tray::kSpanCacheBlocks;) {
    char* p = alloc_filled(260 * kKiB, 1);
    EXPECT_EQ(p, blocks[i]);
    blocks[i] = p;
  }
  for (size_t i = blocks.size() - tray::kSpanCacheBlocks; i < blocks.size(); ++i) tray_free(blocks[i]);
  tray_trim();
  EXPECT_EQ(blocks_kept_by_threads(), 0u) << "trim leaves blocks with their threads";
}

// A thread that ends gives what it kept back: the next thread to ask gets it.
TEST_F(SpanCache, AThreadThatEndsGivesItsBlocksBack) {
  char* freed = nullptr;
  std::thread([&] {
    meet_other_threads();
    freed = alloc_filled(300 * kKiB, 1);
    tray_free(freed);
    EXPECT_EQ(blocks_kept_by_threads(), 1u);
  }).join();
  EXPECT_EQ(blocks_kept_by_threads(), 0u);
  char* p = alloc_filled(300 * kKiB, 2);
  EXPECT_EQ(p, freed) << "the block went back to its arena, which hands it out again";
  tray_free(p);
}

// A thread that stops asking for spans while it lives on (it waits, or works on small blocks)
// keeps nothing after kSpanIdleMs: the purger gives its blocks back. A block it frees after
// that goes back at once.
TEST_F(SpanCache, AThreadThatStopsAskingKeepsNothingOnceItsRequestsStop) {
  std::atomic<bool> freed{false};
  std::atomic<bool> done{false};
  std::thread idle([&] {
    meet_other_threads();
    char* a = alloc_filled(300 * kKiB, 1);
    char* b = alloc_filled(300 * kKiB, 2);
    tray_free(a);
    freed.store(true);
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    tray_free(b);
    EXPECT_EQ(blocks_kept_by_threads(), 0u) << "kept a block freed after its requests stopped";
  });
  while (!freed.load()) std::this_thread::yield();
  EXPECT_EQ(blocks_kept_by_threads(), 1u);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (blocks_kept_by_threads() != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(blocks_kept_by_threads(), 0u) << "the purger left an idle thread's block with it";
  done.store(true);
  idle.join();
}

// A double free of a kept block stops the program before the block could be kept twice and
// handed out to two owners.
TEST_F(SpanCache, ADoubleFreeOfAKeptBlockStopsTheProgram) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        char* p = alloc_filled(300 * kKiB, 1);
        tray_free(p);
        tray_free(p);
      },
      "traymalloc: double free of 0x[0-9a-f]+ \\(large block\\)");
}

// After a fork the child holds what the parent's threads kept: the forking thread's blocks,
// which it takes again, and those of a thread that does not exist in the child, which its trim
// gives back like any other.
TEST_F(SpanCache, AForkedChildUsesAndGivesBackWhatThreadsKept) {
  std::atomic<int> stage{0};
  // It keeps asking, so that the purger leaves its block with it until the fork.
  std::thread other([&] {
    meet_other_threads();
    while (stage.load() != 2) {
      tray_free(alloc_filled(600 * kKiB, 2));
      stage.store(std::max(stage.load(), 1));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  while (stage.load() != 1) std::this_thread::yield();
  meet_other_threads();  // however long the other thread took to start
  char* mine = alloc_filled(300 * kKiB, 1);
  ASSERT_NE(mine, nullptr);
  tray_free(mine);
  const pid_t pid = ::fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    // The child: exit codes only.
    char* again = alloc_filled(300 * kKiB, 3);
    if (again != mine) ::_exit(1);
    tray_free(again);
    tray_trim();
    if (blocks_kept_by_threads() != 0) ::_exit(2);
    char* big = alloc_filled(600 * kKiB, 4);
    if (big == nullptr || !tray_test::sequence_intact(big, 600 * kKiB, 4)) ::_exit(3);
    tray_free(big);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  stage.store(2);
  other.join();
}

// Threads replace blocks while another trims over and over: a block the trim takes back is
// never also taken by its owner, so no two live blocks share an address, and every block
// keeps its contents.
TEST_F(SpanCache, TrimsBesideThreadsReplacingBlocksHandEachOutOnce) {
  constexpr int kThreads = 3;
  constexpr int kSteps = 3000;
  std::mutex lock;
  std::set<char*> live;
  std::atomic<int> bad{0};
  std::atomic<int> running{kThreads};
  auto work = [&](int self) {
    meet_other_threads();
    uint32_t seed = uint32_t(self) * 7919 + 1;
    std::vector<std::pair<char*, uint8_t>> mine(8, {nullptr, 0});
    for (int step = 0; step < kSteps; ++step) {
      seed = seed * 1103515245 + 12345;
      auto& [p, fill] = mine[(seed >> 8) % mine.size()];
      if (p != nullptr) {
        if (!tray_test::sequence_intact(p, 4 * kKiB, fill)) bad.fetch_add(1);
        {
          const std::lock_guard<std::mutex> guard(lock);
          live.erase(p);
        }
        tray_free(p);
      }
      fill = uint8_t(seed >> 16);
      p = span_malloc(256 * kKiB + (seed >> 4) % (64 * kKiB));
      if (p == nullptr) {
        bad.fetch_add(1);
        continue;
      }
      tray_test::fill_sequence(p, 4 * kKiB, fill);
      const std::lock_guard<std::mutex> guard(lock);
      if (!live.insert(p).second) bad.fetch_add(1);
    }
    for (auto& [p, fill] : mine) {
      if (p == nullptr) continue;
      {
        const std::lock_guard<std::mutex> guard(lock);
        live.erase(p);
      }
      tray_free(p);
    }
    running.fetch_sub(1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  while (running.load() != 0) tray_trim();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
