// realloc and reallocarray: the special cases of their arguments, and contents kept across
// every move between small classes and large blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <vector>

#include "size_classes/config.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::kKiB;
using tray_test::kMiB;

// Takes a block through `sizes` with realloc. Each step checks that the bytes both sizes share
// survived, then refills the new block from the same seed.
void realloc_through(const std::vector<size_t>& sizes, uint8_t seed) {
  void* p = tray_malloc(sizes.front());
  ASSERT_NE(p, nullptr);
  tray_test::fill_sequence(p, sizes.front(), seed);
  for (size_t i = 1; i < sizes.size(); ++i) {
    const size_t old_size = sizes[i - 1];
    const size_t new_size = sizes[i];
    p = tray_realloc(p, new_size);
    ASSERT_NE(p, nullptr) << old_size << " -> " << new_size;
    ASSERT_GE(tray_usable_size(p), new_size);
    ASSERT_TRUE(tray_test::sequence_intact(p, std::min(old_size, new_size), seed))
        << "contents lost in realloc " << old_size << " -> " << new_size;
    tray_test::fill_sequence(p, new_size, seed);
  }
  tray_free(p);
}

TEST(Realloc, OfNullAllocates) {
  void* p = tray_realloc(nullptr, 200);
  ASSERT_NE(p, nullptr);
  EXPECT_GE(tray_usable_size(p), 200u);
  EXPECT_EQ(tray_owns(p), 1);
  tray_free(p);

  void* zero = tray_realloc(nullptr, 0);  // behaves as malloc(0): a unique pointer
  ASSERT_NE(zero, nullptr);
  tray_free(zero);
}

// Like glibc, realloc(p, 0) frees p and returns NULL.
TEST(Realloc, ToZeroFreesTheBlock) {
  void* small = tray_malloc(64);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(tray_realloc(small, 0), nullptr);

  const size_t large_before = tray_test::stats_now().large.live_bytes;
  void* large = tray_malloc(2 * kMiB);
  ASSERT_NE(large, nullptr);
  EXPECT_GT(tray_test::stats_now().large.live_bytes, large_before);
  EXPECT_EQ(tray_realloc(large, 0), nullptr);
  EXPECT_EQ(tray_test::stats_now().large.live_bytes, large_before);
}

TEST(Realloc, KeepsContentsBetweenSmallClasses) {
  realloc_through({24, 100, 1000, 10, 16, 17, 5000, 60 * kKiB, 128 * kKiB, 33}, 11);
}

TEST(Realloc, KeepsContentsFromSmallToLarge) {
  realloc_through({1000, 1 * kMiB}, 12);
  realloc_through({tray::kMaxSmallBytes, tray::kMaxSmallBytes + 1}, 13);
}

TEST(Realloc, KeepsContentsBetweenLargeBlocks) {
  realloc_through({1 * kMiB, 64 * kMiB, 3 * kMiB}, 14);
  realloc_through({200 * kKiB, 210 * kKiB, 4 * kMiB + 1, 4 * kMiB - 1, 129 * kKiB}, 15);
}

TEST(Realloc, KeepsContentsFromLargeToSmall) {
  realloc_through({3 * kMiB, 100}, 16);
  realloc_through({tray::kMaxSmallBytes + 1, tray::kMaxSmallBytes}, 17);
}

// Small steps up and back down cross every class boundary and exercise whatever the
// allocator does in place.
TEST(Realloc, GrowsAndShrinksByTenPercentSteps) {
  std::vector<size_t> sizes;
  for (size_t size = 1; size < 600 * kKiB; size += size / 10 + 1) sizes.push_back(size);
  for (size_t i = sizes.size(); i-- > 0;) sizes.push_back(sizes[i]);
  realloc_through(sizes, 18);
}

TEST(Realloc, OfAnImpossibleSizeFailsAndKeepsTheBlock) {
  for (size_t size : {size_t{100}, 2 * kMiB}) {
    void* p = tray_malloc(size);
    ASSERT_NE(p, nullptr);
    tray_test::fill_sequence(p, size, 19);
    const size_t usable = tray_usable_size(p);
    for (size_t huge : {SIZE_MAX, size_t{1} << 62, size_t(PTRDIFF_MAX)}) {
      errno = 0;
      EXPECT_EQ(tray_realloc(p, huge), nullptr) << size << " -> " << huge;
      EXPECT_EQ(errno, ENOMEM);
    }
    EXPECT_EQ(tray_usable_size(p), usable);
    EXPECT_TRUE(tray_test::sequence_intact(p, size, 19)) << size;
    tray_free(p);
  }
}

TEST(Realloc, ReallocarrayMultipliesCountBySize) {
  auto* p = static_cast<uint32_t*>(tray_reallocarray(nullptr, 10, sizeof(uint32_t)));
  ASSERT_NE(p, nullptr);
  EXPECT_GE(tray_usable_size(p), 10 * sizeof(uint32_t));
  for (uint32_t i = 0; i < 10; ++i) p[i] = i * 7;

  p = static_cast<uint32_t*>(tray_reallocarray(p, 100000, sizeof(uint32_t)));
  ASSERT_NE(p, nullptr);
  EXPECT_GE(tray_usable_size(p), 100000 * sizeof(uint32_t));
  for (uint32_t i = 0; i < 10; ++i) EXPECT_EQ(p[i], i * 7);
  tray_free(p);
}

TEST(Realloc, MovesAnAlignedBlockWithItsContents) {
  void* p = tray_memalign(4096, 3000);
  ASSERT_NE(p, nullptr);
  tray_test::fill_sequence(p, 3000, 20);
  p = tray_realloc(p, 10000);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(tray_test::sequence_intact(p, 3000, 20));
  p = tray_realloc(p, 500);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(tray_test::sequence_intact(p, 500, 20));
  tray_free(p);
}

// Growing many blocks in turn moves them between pages: none may land on another live one.
TEST(Realloc, InterleavedGrowthKeepsBlocksApart) {
  constexpr int kBlocks = 64;
  void* blocks[kBlocks];
  size_t sizes[kBlocks];
  for (int i = 0; i < kBlocks; ++i) {
    sizes[i] = 8;
    blocks[i] = tray_malloc(sizes[i]);
    ASSERT_NE(blocks[i], nullptr);
    tray_test::fill_sequence(blocks[i], sizes[i], uint8_t(i));
  }
  for (int round = 0; round < 14; ++round) {
    for (int i = 0; i < kBlocks; ++i) {
      const size_t grown = sizes[i] * 2 - size_t(i % 5);
      blocks[i] = tray_realloc(blocks[i], grown);
      ASSERT_NE(blocks[i], nullptr);
      ASSERT_TRUE(tray_test::sequence_intact(blocks[i], sizes[i], uint8_t(i))) << i;
      sizes[i] = grown;
      tray_test::fill_sequence(blocks[i], sizes[i], uint8_t(i));
    }
  }
  for (int i = 0; i < kBlocks; ++i) {
    EXPECT_TRUE(tray_test::sequence_intact(blocks[i], sizes[i], uint8_t(i))) << i;
    tray_free(blocks[i]);
  }
}

}  // namespace
