// Failures the fuzzer found, kept as unit tests of every build (its inputs stay in the seed
// corpus too).
#include <gtest/gtest.h>

#include <cstddef>

#include "traymalloc.h"

namespace {

// Size 0 aligned to 4 MiB or more: the block once started at the end of its mapping, in a
// chunk the allocator did not own (usable size 0, and freeing it looked up a stranger's chunk).
TEST(FuzzRegression, EmptyBlockAlignedToSegmentsIsOwned) {
  for (size_t alignment = 4096; alignment <= (size_t{64} << 20); alignment *= 2) {
    void* a = tray_aligned_alloc(alignment, 0);
    void* m = tray_memalign(alignment, 0);
    void* p = nullptr;
    ASSERT_EQ(tray_posix_memalign(&p, alignment, 0), 0);
    for (void* block : {a, m, p}) {
      ASSERT_NE(block, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % alignment, 0u);
      EXPECT_TRUE(tray_owns(block)) << "alignment " << alignment;
      EXPECT_GE(tray_usable_size(block), 1u) << "alignment " << alignment;
    }
    tray_free(a);
    tray_free(m);
    tray_free(p);
  }
}

}  // namespace
