// os::remap_pieces_to against a range the kernel holds as two mappings, as a reservation made
// of joined cached mappings is: the kernel will not move or grow it in one call, the pieces
// move and the last grows, with every byte where it was; and when a piece is refused, the
// range holds what it held, and the target has no hole (it may lie inside a block).
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "platform/os.hpp"
#include "support.hpp"

namespace {

constexpr size_t kPiece = size_t{4} << 20;

// Two read-write mappings side by side that the kernel keeps apart (each had its own pages
// before they met), filled with 0x31 and 0x32, inside a reservation of 5 pieces; its base.
char* two_mappings() {
  auto* area = static_cast<char*>(
      mmap(nullptr, 5 * kPiece, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (area == MAP_FAILED) return nullptr;
  void* low = mmap(area, kPiece, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (low == MAP_FAILED) return nullptr;
  std::memset(low, 0x31, kPiece);
  void* high = mmap(nullptr, kPiece, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (high == MAP_FAILED) return nullptr;
  std::memset(high, 0x32, kPiece);
  if (mremap(high, kPiece, kPiece, MREMAP_MAYMOVE | MREMAP_FIXED, area + kPiece) == MAP_FAILED)
    return nullptr;
  munmap(area + 2 * kPiece, 3 * kPiece);
  return area;
}

// two_mappings() and a reservation of three pieces to move them onto; false if either failed.
bool prepare(char** range, char** target) {
  *range = two_mappings();
  *target = static_cast<char*>(tray::os::reserve_aligned(3 * kPiece, kPiece));
  return *range != nullptr && *target != nullptr;
}

bool all_equal(const char* p, size_t bytes, char value) {
  for (size_t i = 0; i < bytes; i += 512)
    if (p[i] != value) return false;
  return p[bytes - 1] == value;
}

TEST(Remap, JoinedMappingsMoveAndGrowPieceByPiece) {
  if (tray_test::kThreadSanitizer) GTEST_SKIP() << "TSan builds never move mappings with mremap";
  char* range;
  char* target;
  ASSERT_TRUE(prepare(&range, &target));
  ASSERT_FALSE(tray::os::remap_to(range, 2 * kPiece, 3 * kPiece, target))
      << "the kernel moved two mappings in one call: this test shows nothing here";

  ASSERT_TRUE(tray::os::remap_pieces_to(range, 2 * kPiece, 3 * kPiece, target, kPiece));
  EXPECT_TRUE(all_equal(target, kPiece, 0x31));
  EXPECT_TRUE(all_equal(target + kPiece, kPiece, 0x32));
  EXPECT_TRUE(all_equal(target + 2 * kPiece, kPiece, 0)) << "the grown part is not fresh";
  std::memset(target + 2 * kPiece, 0x33, kPiece);  // read-write, like the rest
  unsigned char resident;
  EXPECT_NE(mincore(range, tray::os::page_size(), &resident), 0) << "the old range is still mapped";
  EXPECT_NE(mincore(range + kPiece, tray::os::page_size(), &resident), 0);
  munmap(target, 3 * kPiece);
}

TEST(Remap, RefusedPieceLeavesRangeWhereItWas) {
  if (tray_test::kThreadSanitizer) GTEST_SKIP() << "TSan builds never move mappings with mremap";
  char* range;
  char* target;
  ASSERT_TRUE(prepare(&range, &target));

  tray::os::inject_faults(tray::os::kFaultMremap, 2, 1);  // the first piece moves, the last not
  const bool moved = tray::os::remap_pieces_to(range, 2 * kPiece, 3 * kPiece, target, kPiece);
  const uint64_t refused = tray::os::faults_injected();
  tray::os::inject_faults(0, 0, 0);
  EXPECT_FALSE(moved);
  EXPECT_EQ(refused, 1u);
  EXPECT_TRUE(all_equal(range, kPiece, 0x31)) << "the moved piece did not come back";
  EXPECT_TRUE(all_equal(range + kPiece, kPiece, 0x32));
  unsigned char resident;
  EXPECT_EQ(mincore(target, tray::os::page_size(), &resident), 0) << "a hole was left at the target";
  munmap(target, 3 * kPiece);
  munmap(range, 2 * kPiece);
}

}  // namespace
