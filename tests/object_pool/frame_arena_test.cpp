// tray::FrameArena: alignment, reset, spilling into more blocks and settling back to one.
#include "tray/frame_arena.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace {

bool aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

struct Vec3 {
  float x, y, z;
};

TEST(FrameArena, HonoursEveryPowerOfTwoAlignment) {
  tray::FrameArena arena(4096);
  for (size_t alignment = 1; alignment <= 8192; alignment *= 2) {
    void* odd = arena.allocate(3, 1);  // leave the cursor misaligned
    void* p = arena.allocate(24, alignment);
    ASSERT_NE(odd, nullptr);
    EXPECT_TRUE(aligned(p, alignment)) << "alignment " << alignment;
    std::memset(p, 0xab, 24);
  }
}

TEST(FrameArena, BumpsThroughABlockAndKeepsEveryAllocationIntact) {
  tray::FrameArena arena(256);
  char* regions[16];
  for (int i = 0; i < 16; ++i) {
    regions[i] = static_cast<char*>(arena.allocate(10, 1));
    std::memset(regions[i], i, 10);
    if (i > 0) {
      EXPECT_EQ(regions[i], regions[i - 1] + 10);
    }
  }
  for (int i = 0; i < 16; ++i) {
    for (int b = 0; b < 10; ++b) ASSERT_EQ(regions[i][b], i) << "region " << i;
  }
  EXPECT_EQ(arena.bytes_used(), 160u);
}

TEST(FrameArena, CreateConstructsAndCreateArrayValueInitializes) {
  tray::FrameArena arena;
  Vec3* v = arena.create<Vec3>(1.0f, 2.0f, 3.0f);
  EXPECT_EQ(v->y, 2.0f);
  std::span<int> counts = arena.create_array<int>(100);
  ASSERT_EQ(counts.size(), 100u);
  for (int c : counts) EXPECT_EQ(c, 0);
  EXPECT_TRUE(aligned(counts.data(), alignof(int)));
}

TEST(FrameArena, ResetStartsTheNextFrameAtTheSameAddress) {
  tray::FrameArena arena(1024);
  void* first = arena.allocate(100);
  (void)arena.allocate(200);
  EXPECT_GE(arena.bytes_used(), 300u);

  arena.reset();
  EXPECT_EQ(arena.bytes_used(), 0u);
  EXPECT_EQ(arena.allocate(100), first);
  EXPECT_EQ(arena.bytes_reserved(), 1024u);
}

TEST(FrameArena, AFrameThatSpillsSettlesOnOneBlockAfterReset) {
  tray::FrameArena arena(1024);
  for (int i = 0; i < 40; ++i) (void)arena.allocate(64, 16);  // 2560 bytes: three blocks
  const size_t spilled = arena.bytes_reserved();
  EXPECT_GE(spilled, 2560u);
  EXPECT_EQ(arena.bytes_used(), 2560u);

  arena.reset();
  EXPECT_EQ(arena.bytes_reserved(), 0u);
  void* first = arena.allocate(64, 16);
  EXPECT_EQ(arena.bytes_reserved(), spilled);  // one block as large as all before
  for (int i = 1; i < 40; ++i) (void)arena.allocate(64, 16);
  EXPECT_EQ(arena.bytes_reserved(), spilled);  // the same frame fits without a new block

  arena.reset();
  EXPECT_EQ(arena.allocate(64, 16), first);
}

TEST(FrameArena, RequestLargerThanABlockGetsItsOwnBlock) {
  tray::FrameArena arena(128);
  void* big = arena.allocate(10000, 64);
  EXPECT_TRUE(aligned(big, 64));
  std::memset(big, 1, 10000);
  EXPECT_GE(arena.bytes_reserved(), 10000u);
}

TEST(FrameArenaDeathTest, AlignmentThatIsNotAPowerOfTwoIsRefused) {
  tray::FrameArena arena;
  EXPECT_DEATH((void)arena.allocate(8, 24), "tray::FrameArena: alignment 24 is not a power of two");
}

}  // namespace
