// Sparse pages: a page that keeps a few live blocks gives back the OS pages that hold only
// free blocks, the live blocks keep their contents, and the blocks of the given-back OS pages
// come back when the class needs them again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <chrono>
#include <vector>

#include "heap/config.hpp"
#include "size_classes/config.hpp"
#include "heap/hardening.hpp"
#include "platform/os.hpp"
#include "size_classes/size_classes.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::kMiB;

constexpr size_t kTotalBytes = 32 * kMiB;

struct Held {
  unsigned char* p;
  unsigned char fill;
};

// Fills `count` blocks of `size` bytes, then frees all but one in `keep_every`.
std::vector<Held> sparse_class(size_t size, size_t count, size_t keep_every) {
  std::vector<Held> all(count), kept;
  for (size_t i = 0; i < count; ++i) {
    all[i] = {static_cast<unsigned char*>(tray_malloc(size)), static_cast<unsigned char>(i % 251 + 1)};
    EXPECT_NE(all[i].p, nullptr);
    std::memset(all[i].p, all[i].fill, size);
  }
  for (size_t i = 0; i < count; ++i) {
    if (i % keep_every == 0) kept.push_back(all[i]);
    else tray_free(all[i].p);
  }
  return kept;
}

bool intact(const Held& held, size_t size) {
  for (size_t i = 0; i < size; ++i)
    if (held.p[i] != held.fill) return false;
  return true;
}

// Hands out `count` blocks of `size` beside the `kept` ones: each must be distinct from them
// and from each other, and all keep their contents. Then frees them all.
void hand_out_again_then_free_all(const std::vector<Held>& kept, size_t size, size_t count) {
  std::set<unsigned char*> seen;
  for (const Held& held : kept) seen.insert(held.p);
  std::vector<Held> again;
  for (size_t i = 0; i < count; ++i) {
    Held held{static_cast<unsigned char*>(tray_malloc(size)), 0x5a};
    ASSERT_NE(held.p, nullptr);
    ASSERT_TRUE(seen.insert(held.p).second) << "block handed out twice: " << static_cast<void*>(held.p);
    std::memset(held.p, held.fill, size);
    again.push_back(held);
  }
  for (const Held& held : kept) EXPECT_TRUE(intact(held, size));
  for (const Held& held : again) EXPECT_TRUE(intact(held, size));
  for (const Held& held : kept) tray_free(held.p);
  for (const Held& held : again) tray_free(held.p);
}

// Blocks of a whole OS page each: one live block in 16 leaves 15 free OS pages in 16.
TEST(Sparse, TrimGivesBackTheFreeOsPagesOfSparsePages) {
  const size_t kSize = tray::os::page_size();
  const tray_stats before = tray_test::stats_now();
  const std::vector<Held> kept = sparse_class(kSize, kTotalBytes / kSize, 16);
  const tray_stats sparse = tray_test::stats_now();
  // No page is empty: none went back to the pool.
  EXPECT_LT(sparse.released_bytes - before.released_bytes, kTotalBytes / 8);
  EXPECT_EQ(tray_trim(), 1);
  const tray_stats trimmed = tray_test::stats_now();
  EXPECT_GE(trimmed.released_bytes - sparse.released_bytes, kTotalBytes / 2);
  EXPECT_LE(trimmed.committed_bytes + kTotalBytes / 2, sparse.committed_bytes);
  for (const Held& held : kept) EXPECT_TRUE(intact(held, kSize));
  for (const Held& held : kept) tray_free(held.p);
}

// Blocks that straddle OS pages (48 B), given back and then handed out again: every block
// handed out is distinct from the live ones and from each other, and the live ones keep
// their contents.
TEST(Sparse, GivenBackBlocksComeBackWhenTheClassGrowsAgain) {
  constexpr size_t kSize = 48;
  constexpr size_t kCount = kTotalBytes / 8 / kSize;
  const std::vector<Held> kept = sparse_class(kSize, kCount, 500);
  const tray_stats sparse = tray_test::stats_now();
  EXPECT_EQ(tray_trim(), 1);
  EXPECT_GT(tray_test::stats_now().released_bytes, sparse.released_bytes);

  hand_out_again_then_free_all(kept, kSize, kCount);
}

// Every block size the pass works a word of its bitmaps at a time for: blocks that split OS
// pages at odd places, and ranges of blocks that cross 64-bit words. Two rounds: the second
// frees half of what the first kept, so OS pages go beside ones already given back (and blocks
// straddle the two). After each, the live blocks keep their contents, and then every block
// handed out again is distinct: a block left on the list from a page that went, or one that
// went with a live neighbour, fails here.
TEST(Sparse, EveryBlockSizeGivesBackOnlyFreeOsPagesThroughTwoRounds) {
  for (const size_t size : {16, 48, 80, 112, 208, 336, 1024, 1280, 2560, 3072, 5120, 12288}) {
    SCOPED_TRACE("block size " + std::to_string(size));
    const size_t count = 4 * kMiB / size;
    // About one block kept in 2.7 OS pages, at an odd stride: free OS pages between them.
    const size_t stride = 11000 * (tray::os::page_size() / 4096) / size | 1;
    std::vector<Held> kept = sparse_class(size, count, std::max<size_t>(3, stride));
    const tray_stats full = tray_test::stats_now();
    EXPECT_EQ(tray_trim(), 1);
    const tray_stats first = tray_test::stats_now();
    EXPECT_GT(first.released_bytes, full.released_bytes);
    for (const Held& held : kept) ASSERT_TRUE(intact(held, size));
    std::vector<Held> half;
    for (size_t i = 0; i < kept.size(); ++i) {
      if (i % 2 == 0) half.push_back(kept[i]);
      else tray_free(kept[i].p);
    }
    kept.swap(half);
    EXPECT_EQ(tray_trim(), 1);
    EXPECT_GT(tray_test::stats_now().released_bytes, first.released_bytes);
    for (const Held& held : kept) ASSERT_TRUE(intact(held, size));
    hand_out_again_then_free_all(kept, size, count);
  }
}

// Without trim: the heap looks at its sparse pages on its own slow paths (here, large blocks),
// and takes a page once nothing allocated from it for a whole pass interval.
TEST(Sparse, SlowPathsGiveBackSparsePagesWithoutTrim) {
  const size_t kSize = 2 * tray::os::page_size();
  const std::vector<Held> kept = sparse_class(kSize, kTotalBytes / kSize, 16);
  const tray_stats sparse = tray_test::stats_now();
  for (int pass = 0; pass < 2; ++pass) {
    std::this_thread::sleep_for(std::chrono::milliseconds(tray::kSparsePassMs * 2));
    void* large = tray_malloc(2 * tray::kMaxSmallBytes);
    ASSERT_NE(large, nullptr);
    tray_free(large);
  }
  // Half the pages (8 blocks each) kept a block, and 7/8 of each of those can go.
  EXPECT_GE(tray_test::stats_now().released_bytes - sparse.released_bytes, kTotalBytes * 3 / 8);
  for (const Held& held : kept) EXPECT_TRUE(intact(held, kSize));
  for (const Held& held : kept) tray_free(held.p);
}

// sparse_delay_ms: a class that took a new page within that many milliseconds keeps its
// sparse pages whole through the passes; once it has been quiet that long, they go as above.
TEST(Sparse, DelayKeepsTheSparsePagesOfARecentlyBusyClass) {
  constexpr int kDelayMs = 1000;
  ASSERT_EQ(tray_option_set("sparse_delay_ms", std::to_string(kDelayMs).c_str()), 0);
  constexpr size_t kSize = 8192;
  const std::vector<Held> kept = sparse_class(kSize, kTotalBytes / kSize, 16);
  const tray_stats sparse = tray_test::stats_now();
  const auto slow_path_after = [](int wait_ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    void* large = tray_malloc(2 * tray::kMaxSmallBytes);
    ASSERT_NE(large, nullptr);
    tray_free(large);
  };
  for (int pass = 0; pass < 2; ++pass) slow_path_after(int(tray::kSparsePassMs) * 2);
  EXPECT_LT(tray_test::stats_now().released_bytes - sparse.released_bytes, kTotalBytes / 16);
  slow_path_after(kDelayMs + 100);
  slow_path_after(int(tray::kSparsePassMs) * 2);
  EXPECT_GE(tray_test::stats_now().released_bytes - sparse.released_bytes, kTotalBytes * 3 / 8);
  for (const Held& held : kept) EXPECT_TRUE(intact(held, kSize));
  for (const Held& held : kept) tray_free(held.p);
  EXPECT_EQ(tray_option_set("sparse_delay_ms", "0"), 0);
}

// The page a class allocates from (its queue's head) holds up to 8 blocks of 16 KiB and
// more, 128 KiB to 1 MiB: once nothing allocated from it or freed into it for
// kSparseHeadIdleMs, its free OS pages go like those of the other pages.
TEST(Sparse, IdleHeadPageGivesBackItsFreeOsPages) {
  constexpr size_t kSize = 64 << 10;
  const unsigned c = tray::size_class_of(kSize);
  const size_t per_page = tray::class_blocks_per_page(c);
  ASSERT_GE(per_page, 4u);
  std::thread([&] {
    // A thread of its own: a fresh heap, whose only page of the class is the head.
    std::vector<Held> held;
    for (size_t i = 0; i + 1 < per_page; ++i)
      held.push_back({static_cast<unsigned char*>(tray_malloc(kSize)), static_cast<unsigned char>(i + 1)});
    for (Held& h : held) std::memset(h.p, h.fill, kSize);
    for (size_t i = 1; i < held.size(); ++i) tray_free(held[i].p);
    const tray_stats before = tray_test::stats_now();
    // Slow paths (a large block each) more often than every kSparseHeadIdleMs, for longer.
    const auto pause = std::chrono::milliseconds(tray::kSparsePassMs * 2);
    for (uint64_t waited = 0; waited < tray::kSparseHeadIdleMs * 2; waited += tray::kSparsePassMs * 2) {
      std::this_thread::sleep_for(pause);
      void* large = tray_malloc(2 * tray::kMaxSmallBytes);
      ASSERT_NE(large, nullptr);
      tray_free(large);
    }
    EXPECT_GE(tray_test::stats_now().released_bytes - before.released_bytes, (held.size() - 1) * kSize);
    EXPECT_TRUE(intact(held[0], kSize));
    // The given-back blocks come back, distinct from the live one.
    std::vector<void*> again;
    for (size_t i = 1; i < held.size(); ++i) {
      again.push_back(tray_malloc(kSize));
      ASSERT_NE(again.back(), nullptr);
      ASSERT_NE(again.back(), held[0].p);
      std::memset(again.back(), 0x5a, kSize);
    }
    EXPECT_TRUE(intact(held[0], kSize));
    for (void* p : again) tray_free(p);
    tray_free(held[0].p);
  }).join();
}

#if TRAY_HARDENING
// A block of an OS page the pass gave back has lost its free key with the page: a second free
// of it passes free's check. What comes after must catch it before the block has two owners.
class SparseDoubleFreeDeath : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }

  // Blocks of one OS page each (of 4 KiB, 16 to a page; fewer where OS pages are larger), one
  // in `keep_every` kept, the rest freed and given back by a trim; then a freed one is freed
  // again.
  static void free_a_given_back_block_again(size_t keep_every) {
    std::vector<void*> all(kCount);
    for (void*& p : all) {
      p = tray_malloc(block_bytes());
      std::memset(p, 0x11, block_bytes());
    }
    for (size_t i = 0; i < kCount; ++i)
      if (i % keep_every != 0) tray_free(all[i]);
    if (tray_trim() != 1) std::abort();
    tray_free(all[1]);
  }

  static size_t block_bytes() { return tray::os::page_size(); }
  static constexpr size_t kCount = 2048;
  const std::string given_back_message_ = "traymalloc: double free of 0x[0-9a-f]+ \\(size class " +
      std::to_string(block_bytes()) + " B\\), or a write after free: its OS page had been given back";
};

TEST_F(SparseDoubleFreeDeath, CaughtOnTheFreeListAtTheNextPass) {
  EXPECT_DEATH(
      {
        free_a_given_back_block_again(8);
        tray_trim();
      },
      given_back_message_);
}

// One live block per page: the second free counts the page empty, with that block still live;
// caught before the page goes back to the pool (the trim's).
TEST_F(SparseDoubleFreeDeath, CaughtBeforeAPageItMadeLookEmptyGoesBack) {
  EXPECT_DEATH(
      {
        free_a_given_back_block_again(16);
        tray_trim();
      },
      given_back_message_);
}

TEST_F(SparseDoubleFreeDeath, CaughtBeforeItsPageHandsItOutASecondTime) {
  EXPECT_DEATH(
      {
        free_a_given_back_block_again(8);
        // The block is handed out from its page's free list, then its page runs out and brings
        // back the blocks of its given-back OS pages, that one among them.
        for (size_t i = 0; i < kCount; ++i) std::memset(tray_malloc(block_bytes()), 0x5a, block_bytes());
      },
      given_back_message_);
}
#endif

}  // namespace
