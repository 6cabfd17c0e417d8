// The large-block cache: freed mappings are split, joined and grown to serve requests of other
// sizes, so these tests replace blocks of mixed sizes and check that no block ever shares
// memory with another, that calloc still gets zeros from reused memory, and that realloc keeps
// the contents whatever the cache made of the mapping underneath.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "large/config.hpp"
#include "platform/os.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::kMiB;

struct Stamped {
  uint64_t* words = nullptr;
  size_t bytes = 0;
  uint64_t tag = 0;
};

// One word per 4 KiB page, plus the last word: every page a block spans is written, so a page
// shared with another block (or lost by a move) shows up as a wrong word.
constexpr size_t kStrideWords = 4096 / sizeof(uint64_t);

void stamp(const Stamped& block) {
  const size_t words = block.bytes / sizeof(uint64_t);
  for (size_t i = 0; i < words; i += kStrideWords) block.words[i] = block.tag + i;
  block.words[words - 1] = ~block.tag;
}

bool intact(const Stamped& block) {
  const size_t words = block.bytes / sizeof(uint64_t);
  for (size_t i = 0; i < words; i += kStrideWords)
    if (block.words[i] != block.tag + i) return false;
  return block.words[words - 1] == ~block.tag;
}

bool all_zero(const void* p, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; i += 512)
    if (b[i] != 0) return false;
  return b[bytes - 1] == 0;
}

// Random replacement of large blocks, as a program of big buffers does: every size meets
// mappings freed by blocks of every other size.
TEST(Large, MixedSizesReplacedAtRandomNeverOverlap) {
  constexpr size_t kSlots = 12;
  const size_t steps = tray_test::scaled(400);
  tray_test::Rng rng(7);
  std::vector<Stamped> slots(kSlots);
  const size_t large_before = tray_test::stats_now().large.live_bytes;
  for (size_t step = 0; step < steps; ++step) {
    Stamped& slot = slots[rng.between(0, kSlots - 1)];
    if (slot.words != nullptr) {
      ASSERT_TRUE(intact(slot)) << "step " << step;
      tray_free(slot.words);
    }
    slot.bytes = (rng.between(1, 24) * kMiB + rng.between(0, kMiB - 1)) & ~size_t{7};
    if (rng.between(0, 4 - 1) == 0) {
      slot.words = static_cast<uint64_t*>(tray_calloc(1, slot.bytes));
      ASSERT_NE(slot.words, nullptr);
      ASSERT_TRUE(all_zero(slot.words, slot.bytes)) << "calloc of reused memory, step " << step;
    } else {
      slot.words = static_cast<uint64_t*>(tray_malloc(slot.bytes));
      ASSERT_NE(slot.words, nullptr);
    }
    slot.tag = step * 0x9E3779B97F4A7C15ULL | 1;
    stamp(slot);
  }
  for (Stamped& slot : slots) {
    if (slot.words == nullptr) continue;
    EXPECT_TRUE(intact(slot));
    tray_free(slot.words);
  }
  EXPECT_EQ(tray_test::stats_now().large.live_bytes, large_before);
}

// realloc of blocks whose mappings the cache has cut and joined: the kernel may refuse to move
// such a mapping, and the contents must survive whichever way the block grows.
TEST(Large, ReallocOfReusedMappingsKeepsContents) {
  tray_test::Rng rng(11);
  const size_t rounds = tray_test::scaled(60);
  for (size_t round = 0; round < rounds; ++round) {
    // Neighbouring blocks freed together leave joined mappings in the cache.
    std::vector<void*> burst;
    for (int i = 0; i < 4; ++i) burst.push_back(tray_malloc(rng.between(1, 9) * kMiB));
    for (void* p : burst) {
      ASSERT_NE(p, nullptr);
      std::memset(p, 0x5c, kMiB);
      tray_free(p);
    }
    Stamped block;
    block.bytes = rng.between(1, 6) * kMiB;
    block.words = static_cast<uint64_t*>(tray_malloc(block.bytes));
    ASSERT_NE(block.words, nullptr);
    block.tag = round + 1;
    stamp(block);
    const Stamped before = block;
    block.bytes = before.bytes + rng.between(1, 20) * kMiB;
    block.words = static_cast<uint64_t*>(tray_realloc(before.words, block.bytes));
    ASSERT_NE(block.words, nullptr);
    const Stamped kept{block.words, before.bytes - sizeof(uint64_t), 0};
    for (size_t i = 0; i < kept.bytes / sizeof(uint64_t); i += kStrideWords)
      ASSERT_EQ(block.words[i], before.tag + i) << "round " << round << " word " << i;
    ASSERT_EQ(block.words[before.bytes / sizeof(uint64_t) - 1], ~before.tag);
    stamp(block);
    ASSERT_TRUE(intact(block));
    tray_free(block.words);
  }
}

// Blocks that reuse mappings freed by bigger blocks keep the touched pages past their ends
// (for a bigger block later) only up to a share of the live large bytes: with all of them
// live, the rest would be resident for nothing. Eight 8 MiB mappings reused for 6 MiB blocks
// kept 2 MiB each, 16 MiB beside 48 MiB live.
TEST(Large, TailsOfReusedMappingsStayWithinAShareOfTheLiveBytes) {
  constexpr size_t kCount = 8;
  constexpr size_t kBigBytes = 8 * kMiB - 64 * 1024;  // two chunks, nearly all touched
  constexpr size_t kSmallBytes = 6 * kMiB;            // the tail within the ratio's bound
  static_assert(kBigBytes - kSmallBytes <= kSmallBytes / tray::kLargeCacheFitRatio);
  static_assert(kCount * kBigBytes <= tray::kLargeCacheFloorBytes);
  tray_trim();
  void* blocks[kCount];
  for (void*& p : blocks) {
    p = tray_malloc(kBigBytes);
    ASSERT_NE(p, nullptr);
    std::memset(p, 1, kBigBytes);
  }
  for (void* p : blocks) tray_free(p);
  const tray_stats freed = tray_test::stats_now();
  const size_t others = size_t(freed.committed_bytes - freed.large.cached_bytes);
  for (void*& p : blocks) {
    p = tray_malloc(kSmallBytes);
    ASSERT_NE(p, nullptr);
  }
  const tray_stats reused = tray_test::stats_now();
  const size_t live = size_t(reused.large.live_bytes);
  const size_t tails = size_t(reused.committed_bytes - reused.large.cached_bytes) - others - live;
  EXPECT_LE(tails, live / tray::kLargeTailLiveRatio + kCount * tray::os::page_size());
  for (void* p : blocks) tray_free(p);
}

// Misuse of a block with a mapping of its own (above the span blocks' 4 MiB) stops the program
// with a message that names what happened, in release builds too: a second free would have
// put the mapping in the cache twice, for two later requests to share.
TEST(LargeDeath, ADoubleFreeIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        void* p = tray_malloc(16 * kMiB);
        tray_free(p);
        tray_free(p);
      },
      "traymalloc: double free of 0x[0-9a-f]+ \\(large block\\)");
}

TEST(LargeDeath, AReallocOfAFreedBlockIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        void* p = tray_malloc(16 * kMiB);
        tray_free(p);
        tray_realloc(p, 20 * kMiB);
      },
      "traymalloc: realloc of freed block 0x[0-9a-f]+ \\(large block\\)");
}

TEST(LargeDeath, AFreeInsideABlockIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto* p = static_cast<char*>(tray_malloc(16 * kMiB));
        tray_free(p + 4096);
      },
      "traymalloc: free of invalid pointer 0x[0-9a-f]+: not the start of a block \\(4096 bytes "
      "into large block 0x[0-9a-f]+ of [0-9]+ bytes\\)");
}

}  // namespace
