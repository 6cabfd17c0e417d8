// The C contracts of the prefixed API: malloc/calloc/free edge cases, errno, usable size,
// ownership, foreign pointers and the counters.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "size_classes/size_classes.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::kKiB;
using tray_test::kMiB;

// One request size per size class (its block size), plus sizes that are not a class size and
// large ones that get their own mapping.
std::vector<size_t> sizes_across_classes() {
  std::vector<size_t> sizes;
  for (unsigned c = 0; c < tray::kSizeClassCount; ++c) {
    sizes.push_back(tray::class_size(c));
    sizes.push_back(tray::class_size(c) - 3);
  }
  for (size_t large : {tray::kMaxSmallBytes + 1, 200 * kKiB, 1 * kMiB + 5, 9 * kMiB})
    sizes.push_back(large);
  return sizes;
}

// All bytes are zero when the first is and each byte equals the next (one memcmp call, which
// sanitizers check as a whole range rather than byte by byte).
bool all_zero(const void* p, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(p);
  return size == 0 || (bytes[0] == 0 && std::memcmp(bytes, bytes + 1, size - 1) == 0);
}

int global_object = 42;

TEST(Api, MallocZeroReturnsDistinctFreeablePointers) {
  void* a = tray_malloc(0);
  void* b = tray_malloc(0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(tray_owns(a), 1);
  tray_free(a);
  tray_free(b);
}

TEST(Api, FreeOfNullDoesNothing) {
  const tray_stats before = tray_test::stats_now();
  tray_free(nullptr);
  tray_free_sized(nullptr, 0);
  tray_free_aligned_sized(nullptr, 64, 0);
  EXPECT_EQ(tray_test::stats_now().foreign_frees, before.foreign_frees);
  void* p = tray_malloc(32);  // the allocator still works afterwards
  ASSERT_NE(p, nullptr);
  tray_free(p);
}

TEST(Api, ImpossibleRequestsFailWithEnomem) {
  for (size_t size : {SIZE_MAX, SIZE_MAX - 4096, size_t{1} << 62, size_t(PTRDIFF_MAX)}) {
    errno = 0;
    EXPECT_EQ(tray_malloc(size), nullptr) << size;
    EXPECT_EQ(errno, ENOMEM) << size;
  }
}

// Under the kernel's default overcommit policy (heuristic), a request no machine here could
// back is refused, as glibc's are: NULL and ENOMEM, not a mapping whose first touches get the
// program killed. 32 TiB is below kMaxRequestBytes, so the kernel is what says no.
TEST(Api, RequestsTheKernelCouldNeverBackFailWithEnomem) {
  FILE* policy = std::fopen("/proc/sys/vm/overcommit_memory", "r");
  if (policy == nullptr) GTEST_SKIP() << "no overcommit policy to read";
  int mode = -1;
  const int read = std::fscanf(policy, "%d", &mode);
  std::fclose(policy);
  if (read != 1 || mode == 1) GTEST_SKIP() << "overcommit_memory=" << mode << " backs anything";
  for (size_t size : {size_t{1} << 45, (size_t{1} << 44) + 12345}) {
    errno = 0;
    EXPECT_EQ(tray_malloc(size), nullptr) << size;
    EXPECT_EQ(errno, ENOMEM) << size;
    errno = 0;
    EXPECT_EQ(tray_calloc(size / 16, 16), nullptr) << size;
    EXPECT_EQ(errno, ENOMEM) << size;
  }
}

TEST(Api, CallocOverflowFailsWithEnomem) {
  const size_t count_size_pairs[][2] = {{SIZE_MAX / 2 + 1, 2},
                                        {2, SIZE_MAX / 2 + 1},
                                        {SIZE_MAX, SIZE_MAX},
                                        {size_t{1} << 32, size_t{1} << 32}};
  for (const auto& pair : count_size_pairs) {
    errno = 0;
    EXPECT_EQ(tray_calloc(pair[0], pair[1]), nullptr) << pair[0] << " x " << pair[1];
    EXPECT_EQ(errno, ENOMEM);
  }
}

TEST(Api, CallocOfNothingReturnsAFreeablePointer) {
  void* a = tray_calloc(0, 16);
  void* b = tray_calloc(16, 0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  tray_free(a);
  tray_free(b);
}

TEST(Api, ReallocarrayOverflowFailsAndKeepsTheBlock) {
  auto* p = static_cast<unsigned char*>(tray_malloc(100));
  ASSERT_NE(p, nullptr);
  tray_test::fill_sequence(p, 100, 7);
  errno = 0;
  EXPECT_EQ(tray_reallocarray(p, SIZE_MAX / 2 + 1, 2), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_TRUE(tray_test::sequence_intact(p, 100, 7));
  EXPECT_GE(tray_usable_size(p), 100u);
  tray_free(p);
}

TEST(Api, CallocMemoryIsZeroInEveryClassAndWhenLarge) {
  for (size_t size : sizes_across_classes()) {
    void* p = tray_calloc(1, size);
    ASSERT_NE(p, nullptr) << size;
    EXPECT_TRUE(all_zero(p, size)) << size;
    tray_free(p);
  }
}

// A freed block comes back dirty from the thread's cache: calloc must clear it anyway.
TEST(Api, CallocClearsReusedDirtyBlocks) {
  constexpr int kBlocks = 16;
  for (size_t size : sizes_across_classes()) {
    void* dirty[kBlocks];
    for (void*& p : dirty) {
      p = tray_malloc(size);
      ASSERT_NE(p, nullptr) << size;
      std::memset(p, 0xA5, tray_usable_size(p));
    }
    for (void* p : dirty) tray_free(p);
    void* fresh[kBlocks];
    for (void*& p : fresh) {
      p = tray_calloc(size, 1);
      ASSERT_NE(p, nullptr) << size;
      EXPECT_TRUE(all_zero(p, size)) << size;
    }
    for (void* p : fresh) tray_free(p);
  }
}

TEST(Api, UsableSizeCoversTheRequest) {
  EXPECT_EQ(tray_usable_size(nullptr), 0u);
  for (size_t size : sizes_across_classes()) {
    void* p = tray_malloc(size);
    ASSERT_NE(p, nullptr) << size;
    EXPECT_GE(tray_usable_size(p), size);
    tray_free(p);
  }
}

// Three neighbours of one class: writing the whole usable size of the middle one must leave
// the outer two untouched.
TEST(Api, WholeUsableSizeIsWritableWithoutTouchingNeighbours) {
  for (size_t size : sizes_across_classes()) {
    void* block[3];
    for (void*& p : block) {
      p = tray_malloc(size);
      ASSERT_NE(p, nullptr) << size;
    }
    tray_test::fill_pattern(block[0], tray_usable_size(block[0]));
    tray_test::fill_pattern(block[2], tray_usable_size(block[2]));
    std::memset(block[1], 0x5A, tray_usable_size(block[1]));
    EXPECT_TRUE(tray_test::pattern_intact(block[0], tray_usable_size(block[0]))) << size;
    EXPECT_TRUE(tray_test::pattern_intact(block[2], tray_usable_size(block[2]))) << size;
    for (void* p : block) tray_free(p);
  }
}

TEST(Api, FreeSizedReleasesTheBlock) {
  const size_t large_before = tray_test::stats_now().large.live_bytes;
  for (size_t size : sizes_across_classes()) {
    void* p = tray_malloc(size);
    ASSERT_NE(p, nullptr) << size;
    tray_test::fill_pattern(p, size);
    tray_free_sized(p, size);
  }
  EXPECT_EQ(tray_test::stats_now().large.live_bytes, large_before);
}

TEST(Api, OwnsWhatItAllocatedAndNothingElse) {
  void* small = tray_malloc(24);
  void* large = tray_malloc(5 * kMiB);
  ASSERT_NE(small, nullptr);
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(tray_owns(small), 1);
  EXPECT_EQ(tray_owns(large), 1);
  EXPECT_EQ(tray_owns(static_cast<char*>(large) + 5 * kMiB - 1), 1);  // its last byte

  int on_stack = 0;
  void* from_libc = std::malloc(64);
  ASSERT_NE(from_libc, nullptr);
  EXPECT_EQ(tray_owns(&on_stack), 0);
  EXPECT_EQ(tray_owns(&global_object), 0);
  EXPECT_EQ(tray_owns(from_libc), 0);
  EXPECT_EQ(tray_owns(nullptr), 0);
  EXPECT_EQ(tray_usable_size(from_libc), 0u);

  std::free(from_libc);
  tray_free(small);
  tray_free(large);
}

// The prefixed API sits beside libc's malloc: a pointer it does not own is left alone and
// counted, and the block stays intact for its real owner.
TEST(Api, FreeOfAForeignPointerIsIgnoredAndCounted) {
  void* mine = tray_malloc(48);
  ASSERT_NE(mine, nullptr);
  tray_test::fill_pattern(mine, 48);
  auto* foreign = static_cast<unsigned char*>(std::malloc(48));
  ASSERT_NE(foreign, nullptr);
  tray_test::fill_sequence(foreign, 48, 99);

  const size_t foreign_before = tray_test::stats_now().foreign_frees;
  tray_free(foreign);
  EXPECT_EQ(tray_test::stats_now().foreign_frees, foreign_before + 1);

  EXPECT_TRUE(tray_test::sequence_intact(foreign, 48, 99));
  EXPECT_TRUE(tray_test::pattern_intact(mine, 48));
  void* next = tray_malloc(48);  // and the allocator is still sound
  ASSERT_NE(next, nullptr);
  EXPECT_NE(next, static_cast<void*>(foreign));
  tray_free(next);
  tray_free(mine);
  std::free(foreign);
}

// A pointer into a segment that no page holds (here the header unit's tail, past the segment
// header) must be dropped and counted, not linked anywhere: free tells such pointers from
// blocks by their page having no owner, before it asks the chunk map.
TEST(Api, FreeInsideASegmentButInNoPageIsIgnoredAndCounted) {
  void* mine = tray_malloc(48);
  ASSERT_NE(mine, nullptr);
  tray_test::fill_pattern(mine, 48);
  const uintptr_t segment = reinterpret_cast<uintptr_t>(mine) & ~uintptr_t(tray::kSegmentBytes - 1);
  void* stray = reinterpret_cast<void*>(segment + tray::kUnitBytes - 64);

  const size_t foreign_before = tray_test::stats_now().foreign_frees;
  tray_free(stray);
  EXPECT_EQ(tray_test::stats_now().foreign_frees, foreign_before + 1);

  EXPECT_TRUE(tray_test::pattern_intact(mine, 48));
  void* next = tray_malloc(48);  // and the allocator is still sound
  ASSERT_NE(next, nullptr);
  EXPECT_NE(next, stray);
  tray_free(next);
  tray_free(mine);
}

TEST(Api, StatsRejectAnUnknownVersion) {
  tray_stats stats{};
  stats.version = TRAY_STATS_VERSION + 1;
  EXPECT_EQ(tray_stats_get(&stats), EINVAL);
  stats.version = 0;
  EXPECT_EQ(tray_stats_get(&stats), EINVAL);
  EXPECT_EQ(tray_stats_get(nullptr), EINVAL);
  stats.version = TRAY_STATS_VERSION;
  EXPECT_EQ(tray_stats_get(&stats), 0);
  EXPECT_EQ(stats.class_count, 64u);
}

TEST(Api, StatsFollowALargeBlock) {
  constexpr size_t kSize = 3 * kMiB;
  const tray_stats before = tray_test::stats_now();
  void* p = tray_malloc(kSize);
  ASSERT_NE(p, nullptr);
  const tray_stats during = tray_test::stats_now();
  EXPECT_EQ(during.large.allocations, before.large.allocations + 1);
  EXPECT_EQ(during.large.live_blocks, before.large.live_blocks + 1);
  EXPECT_GE(during.large.live_bytes, before.large.live_bytes + kSize);
  EXPECT_GE(during.large.peak_bytes, during.large.live_bytes);
  EXPECT_GE(during.large.mapped_bytes, kSize);
  EXPECT_GE(during.mapped_bytes, kSize);
  tray_free(p);
  const tray_stats after = tray_test::stats_now();
  EXPECT_EQ(after.large.live_bytes, before.large.live_bytes);
  EXPECT_EQ(after.large.frees, before.large.frees + 1);
}

}  // namespace
