// The size-class table and the size -> class mapping, checked for every small request size.
#include <gtest/gtest.h>

#include <cstddef>

#include "core/core.hpp"
#include "core/geometry.hpp"
#include "size_classes/config.hpp"
#include "size_classes/size_classes.hpp"

namespace tray {
namespace {

TEST(SizeClasses, TableHasTheDocumentedShape) {
  EXPECT_EQ(kSizeClassCount, 64u);
  EXPECT_EQ(class_size(0), 16u);  // two words: the free-list link and the free key
  EXPECT_EQ(class_size(1), 32u);
  EXPECT_EQ(class_size(7), 128u);
  EXPECT_EQ(class_size(8), 160u);  // first geometric class: 5/4 of 128
  EXPECT_EQ(class_size(47), 128u * 1024);
  EXPECT_EQ(kFirstBigClass, 48u);
  EXPECT_EQ(class_size(kFirstBigClass), 160u * 1024);  // the first big class
  EXPECT_EQ(class_size(kSizeClassCount - 1), kMaxSmallBytes);
  EXPECT_EQ(kMaxSmallBytes, 2u * 1024 * 1024);
}

// The big classes' pages: 8 blocks where a segment's 63 units hold them, else as many as they
// hold (7 of 512 KiB, 3 of 1 MiB, 1 of 2 MiB).
TEST(SizeClasses, BigClassesFillTheirPagesAsFarAsASegmentHolds) {
  for (unsigned c = kFirstBigClass; c < kSizeClassCount; ++c) {
    SCOPED_TRACE(testing::Message() << "class " << c << " (" << class_size(c) << " B)");
    const size_t most = (kUnitsPerSegment - 1) * kUnitBytes / class_size(c);
    EXPECT_EQ(class_blocks_per_page(c), most < 8 ? most : 8);
    EXPECT_LE(class_slab_units(c), kUnitsPerSegment - 1);
    EXPECT_EQ(class_slab_bytes(c) % class_size(c), 0u) << "no unit left over";
  }
  EXPECT_EQ(class_blocks_per_page(size_class_of(512 * 1024)), 7u);
  EXPECT_EQ(class_blocks_per_page(size_class_of(1024 * 1024)), 3u);
  EXPECT_EQ(class_blocks_per_page(kSizeClassCount - 1), 1u);
}

TEST(SizeClasses, BlockSizesIncreaseAndKeepSixteenByteAlignment) {
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    SCOPED_TRACE(testing::Message() << "class " << c << " (" << class_size(c) << " B)");
    if (c > 0) {
      EXPECT_GT(class_size(c), class_size(c - 1));
    }
    EXPECT_EQ(class_size(c) % 16, 0u);
  }
}

TEST(SizeClasses, EverySmallSizeMapsToTheSmallestClassThatFitsIt) {
  unsigned previous_class = 0;
  for (size_t size = 0; size <= kMaxSmallBytes; ++size) {
    const unsigned c = size_class_of(size);
    ASSERT_LT(c, kSizeClassCount) << "size " << size;
    ASSERT_GE(class_size(c), size) << "size " << size << " class " << c;
    if (c > 0) {
      ASSERT_LT(class_size(c - 1), size) << "size " << size << " class " << c;
    }
    ASSERT_GE(c, previous_class) << "size " << size;
    previous_class = c;
  }
  EXPECT_EQ(previous_class, kSizeClassCount - 1);
}

TEST(SizeClasses, WasteOfEveryRequestIsBounded) {
  for (size_t size = 0; size <= kMaxSmallBytes; ++size) {
    const size_t block = class_size(size_class_of(size));
    const size_t waste = block - size;
    if (size <= 128) {
      ASSERT_LT(waste, size == 0 ? 17u : 16u) << "size " << size;  // malloc(0): a 16-byte block
    } else {
      ASSERT_LE(waste * 5, block) << "size " << size << " block " << block;  // <= 20%
    }
  }
}

TEST(SizeClasses, SlabsHoldEnoughBlocksAndWasteLittleAtTheirEnd) {
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    SCOPED_TRACE(testing::Message() << "class " << c << " (" << class_size(c) << " B)");
    const size_t slab = class_slab_bytes(c);
    EXPECT_EQ(slab, size_t{class_slab_units(c)} * kUnitBytes);
    EXPECT_GE(class_slab_units(c), 1u);
    EXPECT_LT(class_slab_units(c), kUnitsPerSegment);  // unit 0 of a segment is its header
    EXPECT_EQ(class_blocks_per_page(c), slab / class_size(c));
    if (!is_big_class(c)) {
      EXPECT_GE(class_blocks_per_page(c), 8u);
    }
    EXPECT_LE(slab - size_t{class_blocks_per_page(c)} * class_size(c), slab / 8);
  }
}

}  // namespace
}  // namespace tray
