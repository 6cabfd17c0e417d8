// Debug mode (debug=1) through the prefixed API: fills, and one death test per detection,
// matching the message the user sees. The binary turns debug mode on before its first
// allocation, as a program would with tray_option_set.
#include <errno.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "core/core.hpp"
#include "debug/config.hpp"
#include "platform/os.hpp"
#include "span/config.hpp"
#include "support.hpp"

namespace {

const bool g_debug_on = tray_option_set("debug", "1") == 0;

// Freed blocks wait in quarantine; these frees push the one under test out of it, which is
// when its fill is checked.
void flush_quarantine() {
  for (int i = 0; i < 5000; ++i) tray_free(tray_malloc(64));
}

uint32_t word_at(const void* p, size_t offset) {
  uint32_t word;
  std::memcpy(&word, static_cast<const char*>(p) + offset, sizeof word);
  return word;
}

class Debug : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(g_debug_on) << "debug mode could not be set before the first allocation";
  }
};

class DebugDeath : public Debug {
 protected:
  void SetUp() override {
    Debug::SetUp();
    if (tray_test::kThreadSanitizer) GTEST_SKIP() << "death tests fork, which TSan does not support";
  }
};

TEST_F(Debug, FreedBlockHoldsTheFreedPatternInEveryWord) {
  auto* p = static_cast<char*>(tray_malloc(100));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x55, 100);
  tray_free(p);
  for (size_t offset = 0; offset < 100; offset += 4)
    EXPECT_EQ(word_at(p, offset), TRAY_FREED_PATTERN) << "offset " << offset;
}

TEST_F(Debug, MallocFillsWithTheAllocPatternAndCallocWithZero) {
  auto* p = static_cast<unsigned char*>(tray_malloc(24));
  ASSERT_NE(p, nullptr);
  for (size_t offset = 0; offset < 24; offset += 4) EXPECT_EQ(word_at(p, offset), TRAY_ALLOC_PATTERN);
  EXPECT_EQ(p[24], TRAY_CANARY_BYTE);  // past the request: the canary
  tray_free(p);
  auto* z = static_cast<unsigned char*>(tray_calloc(6, 4));
  ASSERT_NE(z, nullptr);
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(z[i], 0u);
  tray_free(z);
}

TEST_F(Debug, UsableSizeIsWhatWasAskedFor) {
  void* p = tray_malloc(40);
  EXPECT_EQ(tray_usable_size(p), 40u);
  void* big = tray_malloc(300000);
  EXPECT_EQ(tray_usable_size(big), 300000u);
  tray_free(p);
  tray_free(big);
  EXPECT_EQ(tray_usable_size(p), 0u);
}

TEST_F(Debug, ReallocMovesAndKeepsTheContents) {
  auto* p = static_cast<char*>(tray_malloc(32));
  std::memcpy(p, "0123456789abcdef0123456789abcde", 32);
  auto* q = static_cast<char*>(tray_realloc(p, 64));
  ASSERT_NE(q, nullptr);
  EXPECT_NE(q, p);
  EXPECT_EQ(std::memcmp(q, "0123456789abcdef0123456789abcde", 32), 0);
  EXPECT_EQ(word_at(p, 8), TRAY_FREED_PATTERN);
  tray_free(q);
}

// A block past kDebugReallocMoveBytes changes size in place while it has room, and a move leaves
// room for half as much again: a buffer grown 64 bytes per call from 8 KiB to 4 MiB moves about
// 16 times, not 65,000 (each a copy of the whole buffer: a growing loop was quadratic), and
// keeps every byte; what it gains in place reads the allocation fill.
TEST_F(Debug, ReallocOfABigBlockGrowsInPlaceAndMovesAtEachHalfAgain) {
  size_t size = 8 * tray_test::kKiB;
  auto* p = static_cast<unsigned char*>(tray_malloc(size));
  ASSERT_NE(p, nullptr);
  tray_test::fill_sequence(p, size, 7);
  int moves = 0;
  int fills_checked = 0;
  while (size < 4 * tray_test::kMiB) {
    auto* q = static_cast<unsigned char*>(tray_realloc(p, size + 64));
    ASSERT_NE(q, nullptr);
    if (q != p) {
      ++moves;
    } else if (fills_checked++ < 1000) {
      for (size_t offset = size; offset < size + 64; offset += 4)
        ASSERT_EQ(word_at(q, offset), TRAY_ALLOC_PATTERN) << "offset " << offset;
    }
    std::memset(q + size, int(size / 64 % 251), 64);
    p = q;
    size += 64;
    ASSERT_EQ(tray_usable_size(p), size);
  }
  EXPECT_LE(moves, 20);
  EXPECT_GE(moves, 10) << "a growing buffer must still move now and then, for stale pointers to show";
  EXPECT_TRUE(tray_test::sequence_intact(p, 8 * tray_test::kKiB, 7));
  for (size_t offset = 8 * tray_test::kKiB; offset < size; offset += 64)
    ASSERT_EQ(p[offset], offset / 64 % 251) << "offset " << offset;
  tray_free(p);
}

// Up to kDebugReallocMoveBytes a realloc always moves, big block or small; a big block that
// shrinks to less than half of itself moves too, and one that shrinks less stays, with the
// bytes it gave up turned into canary.
TEST_F(Debug, ReallocMovesSmallResultsAndDeepShrinks) {
  auto* p = static_cast<char*>(tray_malloc(300000));
  ASSERT_NE(p, nullptr);
  tray_test::fill_sequence(p, 300000, 3);
  auto* q = static_cast<char*>(tray_realloc(p, 250000));
  ASSERT_EQ(q, p);
  EXPECT_EQ(tray_usable_size(q), 250000u);
  EXPECT_EQ(static_cast<unsigned char>(q[250000]), TRAY_CANARY_BYTE);
  EXPECT_TRUE(tray_test::sequence_intact(q, 250000, 3));
  auto* r = static_cast<char*>(tray_realloc(q, 100000));
  ASSERT_NE(r, q);
  EXPECT_TRUE(tray_test::sequence_intact(r, 100000, 3));
  auto* s = static_cast<char*>(tray_realloc(r, tray::kDebugReallocMoveBytes));
  ASSERT_NE(s, r);
  EXPECT_TRUE(tray_test::sequence_intact(s, tray::kDebugReallocMoveBytes, 3));
  tray_free(s);
}

TEST_F(Debug, AlignedBlocksAreAlignedAndChecked) {
  for (size_t alignment : {size_t{64}, size_t{4096}, size_t{1} << 20}) {
    void* p = tray_aligned_alloc(alignment, 100);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignment, 0u);
    EXPECT_EQ(tray_usable_size(p), 100u);
    tray_free(p);
  }
}

TEST_F(DebugDeath, WriteAfterFreeIsNamedWithItsOffset) {
  EXPECT_DEATH(
      {
        auto* p = static_cast<uint32_t*>(tray_malloc(64));
        tray_free(p);
        p[6] = 0;
        flush_quarantine();
      },
      "traymalloc: write after free: block 0x[0-9a-f]+ \\(size class 80 B\\) modified at offset "
      "24 \\(found 0x00000000, expected 0x1deadb0b\\)");
}

TEST_F(DebugDeath, DoubleFreeIsNamed) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(40);
        tray_free(p);
        tray_free(p);
      },
      "traymalloc: double free of 0x[0-9a-f]+ \\(size class 48 B\\)");
}

TEST_F(DebugDeath, DoubleFreeIsFoundAfterTheBlockLeftQuarantine) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(40);
        tray_free(p);
        flush_quarantine();
        tray_free(p);
      },
      "traymalloc: double free of 0x[0-9a-f]+ \\(size class 48 B\\)");
}

void free_twice(size_t size) {
  void* p = tray_malloc(size);
  tray_free(p);
  tray_free(p);
}

// Writes the byte just past a block of `size` bytes, then frees it.
void overflow_by_one(size_t size) {
  auto* p = static_cast<char*>(tray_malloc(size));
  p[size] = 1;
  tray_free(p);
}

TEST_F(DebugDeath, DoubleFreeOfALargeBlockIsNamed) {
  EXPECT_DEATH(free_twice(size_t{3} << 20),
               "traymalloc: double free of 0x[0-9a-f]+ \\(large block of 3145728 requested bytes\\)");
}

// A block of a big class (1 MiB and the canary's byte: the 1280 KiB class), checked as any
// class's block.
TEST_F(DebugDeath, DoubleFreeOfABigClassBlockIsNamed) {
  EXPECT_DEATH(free_twice(size_t{1} << 20), "traymalloc: double free of 0x[0-9a-f]+ \\(size class 1310720 B\\)");
}

TEST_F(DebugDeath, OverflowIntoTheCanaryIsFoundAtFree) {
  EXPECT_DEATH(
      {
        auto* p = static_cast<char*>(tray_malloc(40));
        p[41] = 1;
        tray_free(p);
      },
      "traymalloc: heap buffer overflow: block 0x[0-9a-f]+ of 40 requested bytes written at "
      "offset 41 \\(size class 48 B\\)");
}

TEST_F(DebugDeath, OneRequestedByteIsOneByte) {
  EXPECT_DEATH(
      {
        auto* p = static_cast<char*>(tray_malloc(1));
        p[1] = 1;
        tray_free(p);
      },
      "heap buffer overflow: block 0x[0-9a-f]+ of 1 requested byte written at offset 1 ");
}

TEST_F(DebugDeath, OverflowOfAWholeClassSizeStillHasACanary) {
  EXPECT_DEATH(
      {
        auto* p = static_cast<char*>(tray_malloc(64));  // a class size: the block is 80 B
        p[64] = 1;
        tray_realloc(p, 128);
      },
      "heap buffer overflow: block 0x[0-9a-f]+ of 64 requested bytes written at offset 64");
}

// A block that grew in place keeps a canary after its new size, and the canary a growth takes
// over is checked first: an overflow before the realloc is named with the old size.
TEST_F(DebugDeath, OverflowOfABlockThatGrewInPlaceIsFound) {
  const auto grown_in_place = [] {
    auto* p = static_cast<char*>(tray_realloc(tray_malloc(8192), 16384));  // moves, with room
    auto* q = static_cast<char*>(tray_realloc(p, 17000));
    if (q != p) abort();
    return q;
  };
  EXPECT_DEATH(
      {
        char* p = grown_in_place();
        p[17000] = 1;
        tray_free(p);
      },
      "heap buffer overflow: block 0x[0-9a-f]+ of 17000 requested bytes written at offset 17000");
  EXPECT_DEATH(
      {
        char* p = grown_in_place();
        p[17100] = 1;
        tray_realloc(p, 18000);
      },
      "heap buffer overflow: block 0x[0-9a-f]+ of 17000 requested bytes written at offset 17100");
}

TEST_F(DebugDeath, OverflowOfALargeBlockIsFound) {
  EXPECT_DEATH(overflow_by_one(3000000),
               "heap buffer overflow: block 0x[0-9a-f]+ of 3000000 requested bytes written at offset "
               "3000000 \\(large block\\)");
}

TEST_F(DebugDeath, OverflowOfABigClassBlockIsFound) {
  EXPECT_DEATH(overflow_by_one(300000),
               "heap buffer overflow: block 0x[0-9a-f]+ of 300000 requested bytes written at offset "
               "300000");
}

TEST_F(DebugDeath, FreeOfAPointerIntoABlockIsInvalid) {
  EXPECT_DEATH(
      {
        auto* p = static_cast<char*>(tray_malloc(40));
        tray_free(p + 8);
      },
      "traymalloc: free of invalid pointer 0x[0-9a-f]+: not the start of a block \\(8 bytes into "
      "block 0x[0-9a-f]+ of size class 48 B\\)");
}

TEST_F(DebugDeath, FreeOfMemoryWeDidNotAllocateIsInvalid) {
  EXPECT_DEATH(
      {
        static int not_heap;
        tray_free(&not_heap);
      },
      "traymalloc: free of invalid pointer 0x[0-9a-f]+: not allocated by traymalloc");
}

TEST_F(DebugDeath, ReallocOfAFreedBlockIsNamed) {
  EXPECT_DEATH(
      {
        void* p = tray_malloc(200);
        tray_free(p);
        tray_realloc(p, 400);
      },
      "traymalloc: realloc of freed block 0x[0-9a-f]+ \\(size class 224 B\\)");
}

// A fault, whether it kills the process (SIGSEGV) or AddressSanitizer's handler reports it and
// exits: the statement has no other way to die.
TEST_F(DebugDeath, AFreedLargeBlockCannotBeTouched) {
  EXPECT_DEATH(
      {
        auto* p = static_cast<volatile char*>(static_cast<char*>(tray_malloc(size_t{2} << 20)));
        p[100] = 1;
        tray_free(const_cast<char*>(p));
        p[100] = 2;
      },
      "");
}

// Freed large blocks under a chunk stay inaccessible in their span chunk until newer ones push
// them out of the retired ring; then their pages serve new blocks, readable and writable.
TEST_F(Debug, RetiredSpanBlocksServeAgainOnceEvicted) {
  if (tray::os::page_size() != tray::kOsPageBytes) GTEST_SKIP() << "spans need 4 KiB pages";
  constexpr size_t kSize = 200 * 1024;
  for (size_t i = 0; i < 2 * tray::kDebugRetiredLargeCount; ++i) {
    auto* p = static_cast<char*>(tray_malloc(kSize));
    ASSERT_NE(p, nullptr);
    std::memset(p, int(i), kSize);
    tray_free(p);
  }
  const auto stats = tray_test::stats_now();
  // The retired ring's blocks (each with its header page and a page of canary), and room for
  // the blocks of the test's other steps and the chunks' partly used ends.
  EXPECT_LE(stats.large.mapped_bytes,
            tray::kDebugRetiredLargeCount * (kSize + 8192) + 4 * tray::kSegmentBytes)
      << "evicted blocks' pages were reused, not left to new chunks";
}

TEST_F(Debug, DebugAbortZeroReportsCountsAndGoesOn) {
  ASSERT_EQ(tray_option_set("debug_abort", "0"), 0);
  const uint64_t before = tray_test::stats_now().debug_errors;
  void* p = tray_malloc(40);
  tray_free(p);
  testing::internal::CaptureStderr();
  tray_free(p);
  const std::string report = testing::internal::GetCapturedStderr();
  EXPECT_EQ(tray_option_set("debug_abort", "1"), 0);
  EXPECT_NE(report.find("traymalloc: double free of"), std::string::npos) << report;
  EXPECT_EQ(tray_test::stats_now().debug_errors, before + 1);
  void* q = tray_malloc(40);  // the allocator is intact
  ASSERT_NE(q, nullptr);
  tray_free(q);
}

TEST_F(Debug, DebugCannotBeSwitchedOnceStarted) {
  tray_free(tray_malloc(8));
  EXPECT_EQ(tray_option_set("debug", "0"), EBUSY);
  EXPECT_EQ(tray_option_set("no_such_option", "1"), EINVAL);
  EXPECT_EQ(tray_option_set("debug_abort", "maybe"), EINVAL);
}

// Blocks freed by other threads go through the quarantine of the freeing thread and back to
// their owner: no false report, and every block comes back intact.
TEST_F(Debug, CrossThreadFreesRaiseNoFalseAlarm) {
  const uint64_t before = tray_test::stats_now().debug_errors;
  constexpr int kBlocks = 20000;
  std::vector<void*> blocks(kBlocks);
  for (int i = 0; i < kBlocks; ++i) {
    blocks[i] = tray_malloc(size_t(16 + i % 500));
    std::memset(blocks[i], i & 0xff, size_t(16 + i % 500));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kBlocks; i += 4) tray_free(blocks[i]);
      for (int i = 0; i < 5000; ++i) tray_free(tray_malloc(size_t(8 + i % 300)));
    });
  }
  for (auto& thread : threads) thread.join();
  for (int i = 0; i < kBlocks; ++i) tray_free(tray_malloc(size_t(16 + i % 500)));
  EXPECT_EQ(tray_test::stats_now().debug_errors, before);
}

}  // namespace
