// The C allocation functions of a program linked against libtraymalloc.so: every one of them
// (and glibc's internal aliases) must be traymalloc's and keep the C and glibc contracts.
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "override_support.hpp"
#include "traymalloc.h"

// Not declared by glibc 2.36's headers (C23 functions, removed or internal names), but
// defined by libtraymalloc.so. noexcept matches glibc's declarations where a newer glibc has one.
extern "C" {
void free_sized(void* p, size_t size) noexcept;
void free_aligned_sized(void* p, size_t alignment, size_t size) noexcept;
void cfree(void* p) noexcept;
void* __libc_malloc(size_t size) noexcept;
void* __libc_calloc(size_t count, size_t size) noexcept;
void* __libc_realloc(void* p, size_t size) noexcept;
void __libc_free(void* p) noexcept;
void* __libc_memalign(size_t alignment, size_t size) noexcept;
int __posix_memalign(void** out, size_t alignment, size_t size) noexcept;
}

namespace {

using tray_test::fill_pattern;
using tray_test::has_pattern;
using tray_test::is_aligned;

const size_t kPageBytes = size_t(sysconf(_SC_PAGESIZE));

// Half the address space: no allocation can succeed. Volatile, so that the compiler neither
// warns about the impossible requests nor assumes anything about their outcome.
volatile size_t g_impossible_bytes = SIZE_MAX / 2;
// An alignment that is no power of two, volatile for the same reasons.
volatile size_t g_alignment_48 = 48;

const std::vector<size_t> kSizes = {0,     1,      7,      8,      9,      16,      24,
                                    100,   512,    1000,   4096,   10000,  65536,   131072,
                                    131073, 1 << 20, 3 << 20, 16 << 20};

TEST(Symbols, EveryAllocationFunctionResolvesToTraymalloc) {
  for (const char* name :
       {"malloc", "free", "calloc", "realloc", "reallocarray", "posix_memalign", "aligned_alloc",
        "memalign", "valloc", "pvalloc", "malloc_usable_size", "free_sized", "free_aligned_sized",
        "cfree", "malloc_trim", "mallinfo2", "mallinfo", "__libc_malloc", "__libc_calloc",
        "__libc_realloc", "__libc_free", "__libc_memalign", "__posix_memalign"}) {
    EXPECT_NE(tray_test::defining_object(name).find("libtraymalloc.so"), std::string::npos)
        << name << " comes from '" << tray_test::defining_object(name) << "'";
  }
}

TEST(Malloc, BlocksOfEverySizeAreOursAlignedAndDisjoint) {
  std::vector<void*> blocks;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    void* p = malloc(kSizes[i]);
    ASSERT_NE(p, nullptr) << kSizes[i];
    EXPECT_EQ(tray_owns(p), 1) << kSizes[i];
    EXPECT_GE(malloc_usable_size(p), kSizes[i]);
    EXPECT_TRUE(is_aligned(p, kSizes[i] < 16 ? 8 : 16)) << p << " for " << kSizes[i];
    fill_pattern(p, malloc_usable_size(p), uint32_t(i));
    blocks.push_back(p);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE(has_pattern(blocks[i], malloc_usable_size(blocks[i]), uint32_t(i))) << kSizes[i];
    free(blocks[i]);
  }
}

TEST(Malloc, ZeroBytesGivesDistinctBlocks) {
  void* a = malloc(0);
  void* b = malloc(0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(tray_owns(a), 1);
  free(a);
  free(b);
}

TEST(Malloc, ImpossibleSizeFailsWithEnomem) {
  for (size_t size : {size_t{SIZE_MAX}, g_impossible_bytes, size_t{1} << 50}) {
    errno = 0;
    EXPECT_EQ(malloc(size), nullptr) << size;
    EXPECT_EQ(errno, ENOMEM) << size;
  }
}

TEST(Free, NullIsANoOp) {
  free(nullptr);
  void* p = malloc(10);
  EXPECT_EQ(tray_owns(p), 1);
  free(p);
}

TEST(Calloc, ZeroesReusedDirtyMemory) {
  for (size_t size : {size_t{24}, size_t{1000}, size_t{100000}, size_t{4} << 20}) {
    for (int round = 0; round < 3; ++round) {
      void* dirty = malloc(size);
      memset(dirty, 0xAB, size);
      free(dirty);
      auto* zeroed = static_cast<unsigned char*>(calloc(size / 8, 8));
      ASSERT_NE(zeroed, nullptr);
      EXPECT_EQ(tray_owns(zeroed), 1);
      size_t nonzero = 0;
      for (size_t i = 0; i < size; ++i) nonzero += zeroed[i] != 0;
      EXPECT_EQ(nonzero, 0u) << size;
      free(zeroed);
    }
  }
}

TEST(Calloc, OverflowingProductFailsWithEnomem) {
  errno = 0;
  EXPECT_EQ(calloc(g_impossible_bytes + 2, 2), nullptr);
  EXPECT_EQ(errno, ENOMEM);
}

TEST(Realloc, GrowingAndShrinkingKeepsTheContents) {
  size_t size = 10;
  auto* p = static_cast<unsigned char*>(malloc(size));
  fill_pattern(p, size, 7);
  std::vector<size_t> steps;
  for (size_t s = 20; s <= (size_t{8} << 20); s *= 3) steps.push_back(s);
  for (size_t i = steps.size(); i-- > 0;) steps.push_back(steps[i] / 2 + 1);
  for (size_t next : steps) {
    p = static_cast<unsigned char*>(realloc(p, next));
    ASSERT_NE(p, nullptr) << next;
    EXPECT_EQ(tray_owns(p), 1) << next;
    EXPECT_GE(malloc_usable_size(p), next);
    ASSERT_TRUE(has_pattern(p, std::min(size, next), 7)) << size << " -> " << next;
    fill_pattern(p, next, 7);
    size = next;
  }
  free(p);
}

TEST(Realloc, NullActsAsMallocAndZeroFrees) {
  void* p = realloc(nullptr, 100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(tray_owns(p), 1);
  EXPECT_EQ(realloc(p, 0), nullptr);  // glibc's behaviour: p is freed
}

TEST(Realloc, FailureLeavesTheBlockIntact) {
  void* p = malloc(64);
  fill_pattern(p, 64, 3);
  errno = 0;
  EXPECT_EQ(realloc(p, g_impossible_bytes), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_TRUE(has_pattern(p, 64, 3));
  free(p);
}

TEST(Reallocarray, ResizesAndRejectsOverflow) {
  auto* p = static_cast<uint32_t*>(reallocarray(nullptr, 100, sizeof(uint32_t)));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(tray_owns(p), 1);
  for (uint32_t i = 0; i < 100; ++i) p[i] = i;
  p = static_cast<uint32_t*>(reallocarray(p, 100000, sizeof(uint32_t)));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(tray_owns(p), 1);
  for (uint32_t i = 0; i < 100; ++i) ASSERT_EQ(p[i], i);
  errno = 0;
  void* failed = reallocarray(p, g_impossible_bytes, 4);
  ASSERT_EQ(failed, nullptr);
  EXPECT_EQ(errno, ENOMEM);
  if (failed == nullptr) {  // p is still valid only on this path, as the compiler knows
    EXPECT_EQ(p[99], 99u);
    free(p);
  }
}

TEST(PosixMemalign, EveryPowerOfTwoAlignmentUpTo16MiB) {
  for (size_t alignment = sizeof(void*); alignment <= (size_t{16} << 20); alignment *= 2) {
    for (size_t size : {size_t{1}, alignment, alignment + 1}) {
      void* p = nullptr;
      ASSERT_EQ(posix_memalign(&p, alignment, size), 0) << alignment << " " << size;
      EXPECT_TRUE(is_aligned(p, alignment)) << p << " for " << alignment;
      EXPECT_EQ(tray_owns(p), 1);
      EXPECT_GE(malloc_usable_size(p), size);
      memset(p, 0x5A, size);
      free(p);
    }
  }
}

TEST(PosixMemalign, InvalidAlignmentIsEinvalAndLeavesOutAlone) {
  void* const untouched = reinterpret_cast<void*>(uintptr_t{0x1234});
  for (size_t alignment : {size_t{0}, size_t{3}, size_t{4}, size_t{24}}) {
    void* p = untouched;
    EXPECT_EQ(posix_memalign(&p, alignment, 16), EINVAL) << alignment;
    EXPECT_EQ(p, untouched);
  }
  // Valid, but beyond what traymalloc serves (TRAY_MAX_ALIGNMENT): out of memory, as glibc.
  void* p = untouched;
  EXPECT_EQ(posix_memalign(&p, size_t{1} << 40, 16), ENOMEM);
  EXPECT_EQ(p, untouched);
}

TEST(AlignedAlloc, AlignsAndRejectsNonPowersOfTwo) {
  for (size_t alignment : {size_t{16}, size_t{64}, size_t{4096}, size_t{1} << 21}) {
    void* p = aligned_alloc(alignment, 3 * alignment);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(is_aligned(p, alignment));
    EXPECT_EQ(tray_owns(p), 1);
    free(p);
  }
  errno = 0;
  EXPECT_EQ(aligned_alloc(g_alignment_48, 96), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST(Memalign, RoundsAnAlignmentUpToAPowerOfTwo) {
  void* p = memalign(g_alignment_48, 100);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(is_aligned(p, 64));
  EXPECT_EQ(tray_owns(p), 1);
  free(p);
  void* q = memalign(8192, 10);
  EXPECT_TRUE(is_aligned(q, 8192));
  free(q);
}

TEST(Valloc, IsPageAligned) {
  for (size_t size : {size_t{1}, kPageBytes - 1, kPageBytes + 1, size_t{1} << 20}) {
    void* p = valloc(size);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(is_aligned(p, kPageBytes)) << size;
    EXPECT_EQ(tray_owns(p), 1);
    free(p);
  }
}

TEST(Pvalloc, IsPageAlignedWithUsableSizeRoundedUpToPages) {
  for (size_t size : {size_t{0}, size_t{1}, kPageBytes, kPageBytes + 1, 5 * kPageBytes - 3}) {
    void* p = pvalloc(size);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(is_aligned(p, kPageBytes)) << size;
    const size_t pages = size == 0 ? 1 : (size + kPageBytes - 1) / kPageBytes;
    EXPECT_GE(malloc_usable_size(p), pages * kPageBytes) << size;
    EXPECT_EQ(tray_owns(p), 1);
    memset(p, 1, pages * kPageBytes);
    free(p);
  }
}

TEST(MallocUsableSize, NullIsZero) { EXPECT_EQ(malloc_usable_size(nullptr), 0u); }

TEST(FreeSized, GivesSmallAndLargeBlocksBack) {
  tray_stats before{TRAY_STATS_VERSION};
  ASSERT_EQ(tray_stats_get(&before), 0);
  for (size_t size : {size_t{24}, size_t{5000}, size_t{2} << 20}) {
    void* p = malloc(size);
    EXPECT_EQ(tray_owns(p), 1);
    free_sized(p, size);
  }
  void* aligned = aligned_alloc(4096, size_t{3} << 20);
  EXPECT_EQ(tray_owns(aligned), 1);
  free_aligned_sized(aligned, 4096, size_t{3} << 20);
  free_sized(nullptr, 0);
  tray_stats after{TRAY_STATS_VERSION};
  ASSERT_EQ(tray_stats_get(&after), 0);
  EXPECT_EQ(after.large.live_bytes, before.large.live_bytes);  // both large blocks were released
  EXPECT_EQ(after.foreign_frees, before.foreign_frees);
}

TEST(GlibcAliases, AllocateAndFreeWithTraymalloc) {
  void* a = __libc_malloc(100);
  EXPECT_EQ(tray_owns(a), 1);
  a = __libc_realloc(a, 100000);
  EXPECT_EQ(tray_owns(a), 1);
  __libc_free(a);

  auto* zeroed = static_cast<unsigned char*>(__libc_calloc(64, 4));
  ASSERT_NE(zeroed, nullptr);
  EXPECT_EQ(tray_owns(zeroed), 1);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(zeroed[i], 0);
  cfree(zeroed);

  void* aligned = __libc_memalign(256, 10);
  EXPECT_TRUE(is_aligned(aligned, 256));
  EXPECT_EQ(tray_owns(aligned), 1);
  free(aligned);

  void* out = nullptr;
  ASSERT_EQ(__posix_memalign(&out, 1024, 10), 0);
  EXPECT_TRUE(is_aligned(out, 1024));
  EXPECT_EQ(tray_owns(out), 1);
  free(out);
}

TEST(MallocTrim, ReportsReleasingFreedPages) {
  std::vector<void*> blocks;
  for (int i = 0; i < 20000; ++i) blocks.push_back(malloc(1000));  // ~20 MB in small pages
  for (void* p : blocks) free(p);
  const int first = malloc_trim(0);
  EXPECT_EQ(first, 1);
  EXPECT_EQ(malloc_trim(0), 0);  // nothing was freed since
}

TEST(Mallinfo2, ReportsTraymallocsSegmentsAndLargeBlocks) {
  const struct mallinfo2 before = mallinfo2();
  EXPECT_GT(before.arena, 0u);  // gtest itself allocated through us

  void* large = malloc(size_t{32} << 20);
  memset(large, 1, size_t{32} << 20);
  const struct mallinfo2 with_large = mallinfo2();
  EXPECT_GE(with_large.hblkhd, before.hblkhd + (size_t{32} << 20));

  {
    std::vector<void*> blocks;  // its own array is a large block too: gone at the end
    for (int i = 0; i < 40000; ++i) blocks.push_back(malloc(512));  // 20 MB: new segments
    const struct mallinfo2 with_small = mallinfo2();
    EXPECT_GE(with_small.arena, before.arena + (size_t{16} << 20));
    EXPECT_GE(with_small.uordblks, before.uordblks + (size_t{16} << 20));
    for (void* p : blocks) free(p);
  }
  free(large);
  EXPECT_EQ(mallinfo2().hblkhd, before.hblkhd);
}

TEST(DefaultHeap, TakesThisThreadsMallocAndNew) {
  std::string why;
  EXPECT_TRUE(tray_test::default_heap_routes_this_thread(&why)) << why;
}

}  // namespace
