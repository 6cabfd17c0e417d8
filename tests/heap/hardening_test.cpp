// The release library's checks on free lists and frees (heap/hardening.hpp), one primitive of a
// heap exploit per test: each must stop the program with a message that names what happened,
// before the allocator hands out an address the program wrote or a block that overlaps a live
// one. And the encoding must be there: a freed block's link is no plain pointer.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "heap/hardening.hpp"
#include "traymalloc.h"

namespace {

class HardeningDeath : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

constexpr char kCorrupted[] = "traymalloc: free list corrupted: a write after free or an overflow \\(size class 48 B";

#if TRAY_HARDENING

// The first word of a freed block, read as the program would read it after the free.
uintptr_t first_word(const void* block) {
  uintptr_t word;
  std::memcpy(&word, block, sizeof word);
  return word;
}

// Blocks freed by their own thread go onto their page's list, and come back once the class's
// slot has handed out what it held: up to a page of other blocks first.
constexpr int kUntilReused = 1 << 16;

TEST(Hardening, AFreedBlockHoldsNoPlainPointer) {
  // Two neighbours freed in turn: the second's link leads to the first.
  void* a = tray_malloc(48);
  void* b = tray_malloc(48);
  tray_free(a);
  tray_free(b);
  EXPECT_NE(first_word(b), reinterpret_cast<uintptr_t>(a));
  // Nor anything near the heap: the key carries the link far from any address.
  const uintptr_t distance = first_word(b) > reinterpret_cast<uintptr_t>(a)
                                 ? first_word(b) - reinterpret_cast<uintptr_t>(a)
                                 : reinterpret_cast<uintptr_t>(a) - first_word(b);
  EXPECT_GT(distance, uintptr_t{1} << 32);
  // Decoded, the link does lead there: b comes back, and a right after it.
  std::vector<void*> others;
  void* p = nullptr;
  for (int i = 0; i < kUntilReused && (p = tray_malloc(48)) != b; ++i) others.push_back(p);
  ASSERT_EQ(p, b);
  EXPECT_EQ(tray_malloc(48), a);
  tray_free(a);
  tray_free(b);
  for (void* other : others) tray_free(other);
}

// The classic tcache-poisoning step: write a target over a freed block's link, then mallocs
// until the block comes back; the one after it would return the target.
TEST_F(HardeningDeath, UseAfterFreeWritesALink) {
  EXPECT_DEATH(
      {
        static char target[64];
        void* p = tray_malloc(48);
        tray_free(p);
        void* forged = target;
        std::memcpy(p, &forged, sizeof forged);
        for (int i = 0; i < kUntilReused; ++i)
          if (tray_malloc(48) == target) std::fprintf(stderr, "exploited\n");
      },
      kCorrupted);
}

// A linear overflow out of a live block into its freed neighbour's link: only its low bytes.
TEST_F(HardeningDeath, OverflowIntoAFreedNeighbour) {
  EXPECT_DEATH(
      {
        void* live = tray_malloc(48);
        void* neighbour = tray_malloc(48);
        void* behind = tray_malloc(48);
        if (neighbour != static_cast<char*>(live) + 48) std::abort();  // carved in order
        tray_free(behind);
        tray_free(neighbour);  // the page list's head, linking to `behind`
        std::memset(static_cast<char*>(live) + 48, 0x41, 2);
        for (int i = 0; i < kUntilReused; ++i) live = tray_malloc(48);
      },
      kCorrupted);
}

TEST_F(HardeningDeath, FreeOfAPointerIntoALiveBlock) {
  EXPECT_DEATH(
      {
        char* p = static_cast<char*>(tray_malloc(48));
        tray_free(p + 16);
      },
      "traymalloc: free of invalid pointer 0x[0-9a-f]+: not the start of a block \\(16 bytes into "
      "block 0x[0-9a-f]+ of size class 48 B\\)");
}

TEST_F(HardeningDeath, ReallocOfAPointerIntoALiveBlock) {
  EXPECT_DEATH(
      {
        char* p = static_cast<char*>(tray_malloc(48));
        tray_realloc(p + 32, 100);
      },
      "traymalloc: realloc of invalid pointer 0x[0-9a-f]+: not the start of a block \\(32 bytes "
      "into block 0x[0-9a-f]+ of size class 48 B\\)");
}

// A pointer into another thread's block goes the remote way: checked there too.
TEST_F(HardeningDeath, FreeOfAPointerIntoAnotherThreadsBlock) {
  EXPECT_DEATH(
      {
        char* p = static_cast<char*>(tray_malloc(48));
        std::thread([p] { tray_free(p + 8); }).join();
      },
      "not the start of a block \\(8 bytes into block");
}

// A block freed by another thread travels in a run to its owner; a write after that free
// changes the link that chains it, which the owner checks before it splices the run.
TEST_F(HardeningDeath, UseAfterFreeWritesARemoteRunsLink) {
  EXPECT_DEATH(
      {
        std::vector<void*> mine;
        for (int i = 0; i < 64; ++i) mine.push_back(tray_malloc(48));
        // Its exit sends what the thread gathered to the owner.
        std::thread([&] { for (void* p : mine) tray_free(p); }).join();
        const uintptr_t forged = 0x4141414141414141;
        std::memcpy(mine[10], &forged, sizeof forged);
        std::memcpy(mine[40], &forged, sizeof forged);
        for (int i = 0; i < 100000; ++i) mine.push_back(tray_malloc(48));
      },
      "traymalloc: free list corrupted");
}

#endif  // TRAY_HARDENING

// Correct programs never trip the checks: every class, blocks reused many times, frees from
// other threads, interleaved.
TEST(Hardening, CorrectProgramsPass) {
  std::vector<void*> blocks;
  for (int round = 0; round < 20; ++round) {
    for (size_t size = 1; size <= 4096; size += 37) blocks.push_back(tray_malloc(size));
    std::vector<void*> theirs(blocks.begin(), blocks.begin() + blocks.size() / 2);
    blocks.erase(blocks.begin(), blocks.begin() + blocks.size() / 2);
    std::thread([&theirs] { for (void* p : theirs) tray_free(p); }).join();
  }
  for (void* p : blocks) tray_free(p);
}

}  // namespace
