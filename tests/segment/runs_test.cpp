// Runs of free units (lib/segment/runs.hpp): the starts of runs that the pool's searches use,
// against a bit-by-bit count over random and edge-case masks and every length a page takes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "segment/runs.hpp"

namespace {

uint64_t starts_by_counting(uint64_t bits, unsigned count) {
  uint64_t starts = 0;
  for (unsigned i = 0; i + count <= 64; ++i) {
    bool all = true;
    for (unsigned j = 0; j < count && all; ++j) all = (bits >> (i + j)) & 1;
    if (all) starts |= uint64_t{1} << i;
  }
  return starts;
}

TEST(Runs, StartsMatchACountOfEveryBit) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 4000; ++round) {
    uint64_t bits = rng();
    // Long runs as well as scattered bits: a pool's segments hold both.
    if (round % 3 == 1) bits |= bits >> 1 | bits >> 2 | bits >> 4 | bits >> 8 | bits >> 16;
    if (round % 3 == 2) bits = ~(rng() & rng() & rng());
    for (unsigned count = 1; count <= 64; ++count) {
      ASSERT_EQ(tray::run_starts(bits, count), starts_by_counting(bits, count))
          << std::hex << bits << std::dec << " count " << count;
    }
  }
}

TEST(Runs, EdgesOfTheWord) {
  EXPECT_EQ(tray::run_starts(~uint64_t{0}, 64), 1u);
  EXPECT_EQ(tray::run_starts(~uint64_t{0} << 1, 63), 2u);
  EXPECT_EQ(tray::run_starts(~uint64_t{0} << 1, 64), 0u);
  EXPECT_EQ(tray::find_run(tray::kUsableUnits, 56), 1);
  EXPECT_EQ(tray::find_run(0, 1), -1);
  EXPECT_EQ(tray::find_run(uint64_t{0xf0} | (uint64_t{0xff} << 20), 6), 20);
}

}  // namespace
