// The unit map that the free fast path finds a block's page with (segment.hpp): it must name
// the block's own page for every unit of every page, and the ownerless g_foreign_page, or a
// segment's ownerless pages[0], for every address no live page holds.
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "segment/segment.hpp"
#include "support.hpp"

namespace {

// The page that p's unit belongs to, found from the segment's descriptors alone: the nearest
// carved page that starts at or before the unit and covers it, or the ownerless pages[0].
tray::Page* owning_page(const void* p) {
  tray::Segment* s = tray::segment_of(p);
  const size_t unit = (reinterpret_cast<uintptr_t>(p) >> tray::kUnitShift) & (tray::kUnitsPerSegment - 1);
  for (size_t first = unit + 1; first-- > 1;) {
    const tray::Page& page = s->pages[first];
    if (page.unit_count != 0) return first + page.unit_count > unit ? &s->pages[first] : &s->pages[0];
  }
  return &s->pages[0];
}

TEST(UnitMap, NamesThePageOfEveryUnitOfEachPage) {
  // 128 KiB blocks live in pages of 16 units, 64 B blocks in pages of one.
  for (size_t size : {size_t{64}, size_t{16} << 10, size_t{128} << 10}) {
    std::vector<void*> blocks;
    for (int i = 0; i < 24; ++i) blocks.push_back(tray_malloc(size));
    for (void* p : blocks) {
      ASSERT_EQ(tray::chunk_kind(p), tray::kChunkSegment) << size;
      tray::Page* page = owning_page(p);
      ASSERT_NE(page->heap, nullptr);
      auto* bytes = static_cast<char*>(p);
      for (size_t offset = 0; offset < size; offset += 4096)
        EXPECT_EQ(tray::unit_page_of(bytes + offset), page) << size << " +" << offset;
      EXPECT_EQ(tray::unit_page_of(bytes + size - 1), page) << size;
    }
    for (void* p : blocks) tray_free(p);
  }
}

TEST(UnitMap, NamesTheOwnerlessPageForMemoryOfNoPage) {
  int on_stack = 0;
  static int in_data = 0;
  void* mapped = mmap(nullptr, 1 << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  void* large = tray_malloc(size_t{8} << 20);
  for (const void* p : {static_cast<const void*>(nullptr), static_cast<const void*>(&on_stack),
                        static_cast<const void*>(&in_data), static_cast<const void*>(mapped),
                        static_cast<const void*>(large)}) {
    EXPECT_EQ(tray::unit_page_of(p), &tray::g_foreign_page) << p;
  }
  EXPECT_EQ(tray::g_foreign_page.heap, nullptr);
  tray_free(large);
  munmap(mapped, 1 << 20);
}

// Every 128 GiB range of the 48-bit space reads the ownerless page where no segment is, at its
// first and last unit: a range without a leaf reads the shared leaf of zeros, and the
// root's offsets land inside it at both ends.
TEST(UnitMap, EveryRangeWithoutSegmentsReadsTheOwnerlessPage) {
  tray_free(tray_malloc(64));  // the root is filled
  for (uintptr_t range = 0; range < tray::kUnitRootEntries; ++range) {
    const uintptr_t first = range << tray::kUnitLeafShift;
    const uintptr_t last = first + (uintptr_t{1} << tray::kUnitLeafShift) - 1;
    for (uintptr_t address : {first, first + tray::kUnitBytes, last}) {
      if (tray::chunk_kind(reinterpret_cast<void*>(address)) == tray::kChunkSegment) continue;
      ASSERT_EQ(tray::unit_page_of(reinterpret_cast<void*>(address)), &tray::g_foreign_page)
          << std::hex << address;
    }
  }
}

// The map takes address space where segments are, not across the address space: a leaf of
// zeros and one leaf per range that holds segments, reported as unit_map_bytes.
TEST(UnitMap, TakesAddressSpaceOnlyWhereSegmentsAre) {
  void* p = tray_malloc(64);
  tray_stats stats{};
  stats.version = TRAY_STATS_VERSION;
  ASSERT_EQ(tray_stats_get(&stats), 0);
  EXPECT_GE(stats.unit_map_bytes, 2 * tray::kUnitLeafBytes);
  EXPECT_LE(stats.unit_map_bytes, 4 * tray::kUnitLeafBytes) << "more ranges than segments need";
  tray_free(p);
}

// Units that went back to the pool name their segment's pages[0],
// never the descriptor of the page they left (a later page elsewhere in the segment reuses
// it); units of unmapped segments name g_foreign_page.
TEST(UnitMap, UnitsBackInThePoolNameNoPage) {
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(tray_malloc(size_t{96} << 10));
  for (void* p : blocks) ASSERT_EQ(tray::unit_page_of(p), owning_page(p));
  for (void* p : blocks) tray_free(p);
  // Most of these pages went back to the pool (a heap keeps 1 MiB of empty pages).
  size_t released = 0;
  for (void* p : blocks) {
    EXPECT_EQ(tray::unit_page_of(p), owning_page(p));
    released += owning_page(p)->heap == nullptr;
  }
  EXPECT_GE(released, blocks.size() / 2);
  tray_trim();
  for (void* p : blocks) {
    if (tray::chunk_kind(p) == tray::kChunkSegment) EXPECT_EQ(tray::unit_page_of(p), owning_page(p));
    else EXPECT_EQ(tray::unit_page_of(p), &tray::g_foreign_page);
  }
}

}  // namespace
