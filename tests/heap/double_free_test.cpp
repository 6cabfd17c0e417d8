// Double-free detection in the release library (hardening.hpp): each way a block can be freed
// twice stops the program with the block's address and class, and correct programs, whose
// blocks are reused over and over, never trip it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "heap/hardening.hpp"
#include "size_classes/size_classes.hpp"
#include "traymalloc.h"

namespace {

constexpr char kMessage256[] = "traymalloc: double free of 0x[0-9a-f]+ \\(size class 256 B\\)";

class DoubleFreeDeath : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

#if TRAY_HARDENING

// Resized in place, a freed block came back as live while it sat on a free list: the next
// malloc of its class would have handed it out a second time.
TEST_F(DoubleFreeDeath, ReallocOfAFreedBlockInPlace) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(250);
        tray_free(p);
        tray_realloc(p, 200);
      },
      "traymalloc: realloc of freed block 0x[0-9a-f]+ \\(size class 256 B\\)");
}

TEST_F(DoubleFreeDeath, ReallocOfAFreedBlockToMove) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(250);
        tray_free(p);
        tray_realloc(p, 4000);
      },
      "traymalloc: realloc of freed block 0x[0-9a-f]+ \\(size class 256 B\\)");
}

TEST_F(DoubleFreeDeath, TheMessagePointsToDebugMode) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(250);
        tray_free(p);
        tray_free(p);
      },
      "\ntraymalloc: rerun with TRAY_OPTIONS=debug=1 to check every block and free \\(fills, canaries, exact reports\\)\n");
}

TEST_F(DoubleFreeDeath, RightAfterTheFree) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(250);
        tray_free(p);
        tray_free(p);
      },
      kMessage256);
}

TEST_F(DoubleFreeDeath, AfterOtherAllocationsAndFrees) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(256);
        tray_free(p);
        // Other classes only: a block of p's class could be p itself, live again.
        std::vector<void*> others;
        for (int i = 0; i < 1000; ++i) others.push_back(tray_malloc(size_t(16 + i % 200)));
        for (int i = 0; i < 100; ++i) others.push_back(tray_malloc(size_t(300 + i * 40)));
        for (size_t i = 0; i < others.size(); i += 2) tray_free(others[i]);
        tray_free(p);
      },
      kMessage256);
}

TEST_F(DoubleFreeDeath, SmallestClass) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(1);
        tray_free(p);
        tray_free(p);
      },
      "traymalloc: double free of 0x[0-9a-f]+ \\(size class 16 B\\)");
}

// The owner frees it, another thread frees it again (a remote free of a free block).
TEST_F(DoubleFreeDeath, SecondFreeFromAnotherThread) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(256);
        tray_free(p);
        std::thread([p] { tray_free(p); }).join();
      },
      kMessage256);
}

// Another thread frees it twice: the first sits in that thread's batch for the owner.
TEST_F(DoubleFreeDeath, TwiceFromAThreadThatDoesNotOwnIt) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(256);
        std::thread([p] {
          void* mine = tray_malloc(32);  // this thread gets a heap, and so a batch to gather in
          tray_free(p);
          tray_free(p);
          tray_free(mine);
        }).join();
      },
      kMessage256);
}

// A remote free, then the owner frees the block again after taking it back.
TEST_F(DoubleFreeDeath, OwnerFreesWhatAnotherThreadFreed) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(256);
        std::thread([p] { tray_free(p); }).join();
        tray_free(p);
      },
      kMessage256);
}

// The free that empties a page (which the heap then keeps for reuse), repeated.
TEST_F(DoubleFreeDeath, LastBlockOfAPage) {
  EXPECT_DEATH(
      {
        const size_t per_page = tray::class_blocks_per_page(tray::size_class_of(256));
        std::vector<void*> blocks;
        for (size_t i = 0; i < 3 * per_page; ++i) blocks.push_back(tray_malloc(256));
        // The blocks of the first block's page: the heap allocates from a later page by now.
        const uintptr_t page = reinterpret_cast<uintptr_t>(blocks[0]) >> 16;
        void* last = nullptr;
        for (void* b : blocks) {
          if (reinterpret_cast<uintptr_t>(b) >> 16 != page) continue;
          tray_free(b);
          last = b;
        }
        tray_free(last);
      },
      kMessage256);
}

#endif  // TRAY_HARDENING

// Blocks come back to the same callers again and again, with whatever the program left in
// them (including the word where a free block keeps the key): none of it looks freed twice.
TEST(DoubleFree, ReusedBlocksNeverLookFree) {
  for (size_t size : {size_t{1}, size_t{16}, size_t{24}, size_t{256}, size_t{4000}}) {
    for (int round = 0; round < 1000; ++round) {
      auto* p = static_cast<unsigned char*>(tray_malloc(size));
      ASSERT_NE(p, nullptr);
      if (round % 2 == 0) std::memset(p, 0xa5, size);
      tray_free(p);
    }
    void* q = tray_calloc(1, size);
    void* r = tray_realloc(q, size / 2 + 1);
    tray_free(r);
  }
  std::vector<void*> handed;
  for (int i = 0; i < 256; ++i) handed.push_back(tray_malloc(64));
  std::thread([&handed] {
    for (void* p : handed) tray_free(p);
  }).join();
  for (int i = 0; i < 256; ++i) tray_free(tray_malloc(64));
}

}  // namespace
