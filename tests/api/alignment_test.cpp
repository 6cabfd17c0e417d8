// Aligned allocation: posix_memalign, aligned_alloc and memalign, their argument checks, and
// alignment across small, medium and large blocks.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::kKiB;
using tray_test::kMiB;

bool aligned_to(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// Every power of two from sizeof(void*) up to `largest`.
std::vector<size_t> alignments_up_to(size_t largest) {
  std::vector<size_t> alignments;
  for (size_t a = sizeof(void*); a <= largest; a *= 2) alignments.push_back(a);
  return alignments;
}

const size_t kSweepSizes[] = {1, 7, 64, 100, 4096, 70000, 200000, 5 * kMiB};

TEST(Alignment, PosixMemalignRejectsInvalidAlignments) {
  // Not powers of two, powers of two below sizeof(void*).
  const size_t invalid[] = {0, 3, 24, 48, 1000, 1, 2, 4, TRAY_MAX_ALIGNMENT + 8, SIZE_MAX};
  for (size_t alignment : invalid) {
    void* untouched = reinterpret_cast<void*>(uintptr_t{0x1234});
    void* out = untouched;
    EXPECT_EQ(tray_posix_memalign(&out, alignment, 64), EINVAL) << alignment;
    EXPECT_EQ(out, untouched) << alignment;
  }
}

// POSIX: a power of two multiple of sizeof(void*) is valid; one we cannot serve is ENOMEM.
TEST(Alignment, PowersOfTwoAboveTheLimitAreOutOfMemoryNotInvalid) {
  for (size_t alignment : {TRAY_MAX_ALIGNMENT * 2, size_t{1} << 40, SIZE_MAX / 2 + 1}) {
    void* untouched = reinterpret_cast<void*>(uintptr_t{0x1234});
    void* out = untouched;
    EXPECT_EQ(tray_posix_memalign(&out, alignment, 64), ENOMEM) << alignment;
    EXPECT_EQ(out, untouched) << alignment;
    errno = 0;
    EXPECT_EQ(tray_aligned_alloc(alignment, 64), nullptr) << alignment;
    EXPECT_EQ(errno, ENOMEM) << alignment;
    errno = 0;
    EXPECT_EQ(tray_memalign(alignment, 64), nullptr) << alignment;
    EXPECT_EQ(errno, ENOMEM) << alignment;
  }
  // memalign rounds up: to a power of two too big to serve, or to none at all.
  errno = 0;
  EXPECT_EQ(tray_memalign(TRAY_MAX_ALIGNMENT + 8, 64), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(tray_memalign(SIZE_MAX, 64), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST(Alignment, PosixMemalignOfAnImpossibleSizeFailsWithEnomem) {
  for (size_t size : {SIZE_MAX, SIZE_MAX - 64, size_t{1} << 62}) {
    void* untouched = reinterpret_cast<void*>(uintptr_t{0x1234});
    void* out = untouched;
    EXPECT_EQ(tray_posix_memalign(&out, 64, size), ENOMEM) << size;
    EXPECT_EQ(out, untouched) << size;
  }
}

// Blocks of one alignment are all live at once, each filled over its whole usable size, so
// a block that overlaps another shows up when the patterns are checked.
TEST(Alignment, PosixMemalignSweepsAlignmentsAndSizes) {
  for (size_t alignment : alignments_up_to(4 * kMiB)) {
    std::vector<void*> blocks;
    for (size_t size : kSweepSizes) {
      void* p = nullptr;
      ASSERT_EQ(tray_posix_memalign(&p, alignment, size), 0) << alignment << " / " << size;
      ASSERT_NE(p, nullptr);
      EXPECT_TRUE(aligned_to(p, alignment)) << p << " for " << alignment << " / " << size;
      EXPECT_GE(tray_usable_size(p), size) << alignment << " / " << size;
      EXPECT_EQ(tray_owns(p), 1);
      tray_test::fill_pattern(p, tray_usable_size(p));
      blocks.push_back(p);
    }
    for (void* p : blocks) {
      EXPECT_TRUE(tray_test::pattern_intact(p, tray_usable_size(p))) << alignment;
      tray_free(p);
    }
  }
}

TEST(Alignment, AlignmentsBeyondASegmentWork) {
  for (size_t alignment : {8 * kMiB, 16 * kMiB, 32 * kMiB, 64 * kMiB, TRAY_MAX_ALIGNMENT}) {
    for (size_t size : {size_t{1}, alignment / 2, alignment + 1}) {
      void* p = nullptr;
      ASSERT_EQ(tray_posix_memalign(&p, alignment, size), 0) << alignment << " / " << size;
      EXPECT_TRUE(aligned_to(p, alignment)) << p << " for " << alignment;
      ASSERT_GE(tray_usable_size(p), size);
      // Touch both ends only: the blocks are large, filling them proves nothing more.
      auto* bytes = static_cast<unsigned char*>(p);
      bytes[0] = 1;
      bytes[tray_usable_size(p) - 1] = 2;
      tray_free(p);
    }
  }
}

TEST(Alignment, AlignedAllocRejectsAlignmentsThatAreNotPowersOfTwo) {
  for (size_t alignment : {size_t{0}, size_t{3}, size_t{24}, size_t{100}, TRAY_MAX_ALIGNMENT + 8}) {
    errno = 0;
    EXPECT_EQ(tray_aligned_alloc(alignment, 64), nullptr) << alignment;
    EXPECT_EQ(errno, EINVAL) << alignment;
  }
}

TEST(Alignment, AlignedAllocAcceptsSmallAlignmentsAndOddSizes) {
  for (size_t alignment : {size_t{1}, size_t{2}, size_t{4}, size_t{64}, size_t{4096}}) {
    for (size_t size : {size_t{1}, size_t{100}, size_t{4097}, 300 * kKiB}) {
      void* p = tray_aligned_alloc(alignment, size);
      ASSERT_NE(p, nullptr) << alignment << " / " << size;
      EXPECT_TRUE(aligned_to(p, alignment)) << p << " for " << alignment;
      std::memset(p, 0x3C, tray_usable_size(p));
      tray_free(p);
    }
  }
  errno = 0;
  EXPECT_EQ(tray_aligned_alloc(64, SIZE_MAX), nullptr);
  EXPECT_EQ(errno, ENOMEM);
}

// memalign rounds an alignment that is not a power of two up to the next one. Many blocks
// are checked, since a 16-byte-aligned block is 32-byte aligned half of the time by chance.
TEST(Alignment, MemalignRoundsUpToAPowerOfTwo) {
  const size_t requested_and_effective[][2] = {{24, 32}, {48, 64}, {100, 128}, {3000, 4096}};
  for (const auto& [requested, effective] : requested_and_effective) {
    std::vector<void*> blocks;
    for (int i = 0; i < 64; ++i) {
      void* p = tray_memalign(requested, 40);
      ASSERT_NE(p, nullptr) << requested;
      EXPECT_TRUE(aligned_to(p, effective)) << p << " for memalign(" << requested << ")";
      blocks.push_back(p);
    }
    for (void* p : blocks) tray_free(p);
  }
}

TEST(Alignment, FreeAlignedSizedReleasesEveryKindOfBlock) {
  const size_t large_before = tray_test::stats_now().large.live_bytes;
  for (size_t alignment : alignments_up_to(4 * kMiB)) {
    for (size_t size : kSweepSizes) {
      void* p = tray_aligned_alloc(alignment, size);
      ASSERT_NE(p, nullptr) << alignment << " / " << size;
      tray_test::fill_pattern(p, size);
      tray_free_aligned_sized(p, alignment, size);
    }
  }
  EXPECT_EQ(tray_test::stats_now().large.live_bytes, large_before);
}

// Aligned blocks from the small classes are carved inside pages: the blocks around them must
// stay intact and reusable once they are freed.
TEST(Alignment, AlignedSmallBlocksLiveBesidePlainOnes) {
  std::vector<std::pair<void*, size_t>> blocks;
  tray_test::Rng rng(5);
  for (int i = 0; i < 2000; ++i) {
    const size_t size = rng.between(1, 2 * kKiB);
    void* p = (i % 3 == 0) ? tray_aligned_alloc(size_t{16} << rng.between(0, 8), size)
                           : tray_malloc(size);
    ASSERT_NE(p, nullptr);
    tray_test::fill_pattern(p, size);
    blocks.emplace_back(p, size);
  }
  for (auto [p, size] : blocks) {
    EXPECT_TRUE(tray_test::pattern_intact(p, size)) << p << " / " << size;
    tray_free(p);
  }
}

}  // namespace
