// Guarded sampling through the prefixed API: which blocks are guarded, and that every entry
// point works on them. The reports (faults, double frees) are tested from outside, on a buggy
// program (tests/guard). Each test runs in a process of its own (gtest_discover_tests), and
// its allocations in a fresh thread, whose heap reads the sampling options at its first
// allocation.
#include <errno.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "segment/segment.hpp"
#include "support.hpp"

namespace {

bool guarded(const void* p) { return tray::chunk_kind(p) == tray::kChunkGuard; }

template <typename Body>
void in_fresh_thread(Body body) {
  std::thread(body).join();
}

TEST(Guard, SlotsOptionIsAPlainCount) {
  EXPECT_EQ(tray_option_set("guard_slots", "16"), 0);
  EXPECT_EQ(tray_option_set("guard_slots", "1k"), EINVAL);
  EXPECT_EQ(tray_option_set("guard_slots", ""), EINVAL);
  EXPECT_EQ(tray_option_set("guard_slots", "64"), 0);
}

TEST(Guard, EveryEntryPointWorksOnGuardedBlocks) {
  ASSERT_EQ(tray_option_set("guard_sample", "1"), 0);
  in_fresh_thread([] {
    auto* p = static_cast<uint8_t*>(tray_malloc(100));
    ASSERT_TRUE(guarded(p));
    EXPECT_TRUE(tray_owns(p));
    EXPECT_EQ(tray_usable_size(p), 100u);  // the request exactly: the rest is padding
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
    std::memset(p, 0x5a, 100);
    p = static_cast<uint8_t*>(tray_realloc(p, 3000));
    ASSERT_TRUE(guarded(p));
    for (int i = 0; i < 100; ++i) ASSERT_EQ(p[i], 0x5a);
    tray_free_sized(p, 3000);

    auto* zeroed = static_cast<uint8_t*>(tray_calloc(40, 100));
    ASSERT_TRUE(guarded(zeroed));
    for (int i = 0; i < 4000; ++i) ASSERT_EQ(zeroed[i], 0);
    tray_free(zeroed);

    void* aligned = tray_aligned_alloc(256, 256);
    EXPECT_TRUE(guarded(aligned));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(aligned) % 256, 0u);
    tray_free(aligned);

    void* large = tray_malloc(size_t{64} << 10);  // above the largest guarded block
    EXPECT_FALSE(guarded(large));
    tray_free(large);
  });
  EXPECT_EQ(tray_option_set("guard_sample", "0"), 0);
}

// Live guarded blocks hold their slots; past guard_slots, allocations are served as usual, and
// a freed slot serves again.
TEST(Guard, LiveBlocksAreBoundedBySlots) {
  ASSERT_EQ(tray_option_set("guard_slots", "8"), 0);
  ASSERT_EQ(tray_option_set("guard_sample", "1"), 0);
  in_fresh_thread([] {
    std::vector<void*> blocks;
    size_t count = 0;
    for (int i = 0; i < 20; ++i) {
      blocks.push_back(tray_malloc(64));
      count += guarded(blocks.back()) ? 1 : 0;
    }
    EXPECT_EQ(count, 8u);
    for (void*& p : blocks)
      if (guarded(p)) {
        tray_free(p);
        p = nullptr;
        break;
      }
    void* again = tray_malloc(64);
    EXPECT_TRUE(guarded(again));
    tray_free(again);
    for (void* p : blocks) tray_free(p);
  });
  EXPECT_EQ(tray_option_set("guard_sample", "0"), 0);
}

// A freed slot's pages are inaccessible and hold nothing anyone may read: they go back to the
// OS, so what guarded sampling keeps resident is the live guarded blocks.
TEST(Guard, FreedSlotsGiveTheirPagesBack) {
  ASSERT_EQ(tray_option_set("guard_slots", "64"), 0);
  ASSERT_EQ(tray_option_set("guard_sample", "1"), 0);
  in_fresh_thread([] {
    // Three pages: a class whose blocks need no more than page alignment (16 KiB ones do).
    constexpr size_t kBlockBytes = size_t{12} << 10;
    std::vector<void*> blocks;
    for (int i = 0; i < 64; ++i) {
      void* p = tray_malloc(kBlockBytes);
      ASSERT_TRUE(guarded(p));
      std::memset(p, 0x33, kBlockBytes);
      blocks.push_back(p);
    }
    const size_t live = tray_test::resident_bytes();
    for (void* p : blocks) tray_free(p);
    const size_t freed = tray_test::resident_bytes();
    EXPECT_GE(live, freed + 48 * kBlockBytes)
        << "resident with the blocks live " << live << " B, after their free " << freed << " B";
  });
  EXPECT_EQ(tray_option_set("guard_sample", "0"), 0);
}

}  // namespace
