// The word-at-a-time bitmap helpers (core/bitmap.hpp) against a bit-by-bit reading of the same
// bitmaps: random ones, and the edges (runs across words, at the first and last bit, all set).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/bitmap.hpp"
#include "support.hpp"

namespace {

constexpr size_t kBits = 1024;
constexpr size_t kWords = kBits / 64;

bool bit(const uint64_t* bits, size_t i) { return (bits[i / 64] >> (i % 64) & 1) != 0; }

std::vector<std::pair<size_t, size_t>> runs_one_by_one(const uint64_t* bits) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < kBits;) {
    if (!bit(bits, i)) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < kBits && bit(bits, end)) ++end;
    runs.emplace_back(i, end - i);
    i = end;
  }
  return runs;
}

void check(const uint64_t* bits) {
  std::vector<std::pair<size_t, size_t>> runs;
  EXPECT_FALSE(tray::bitmap::for_each_run(bits, kBits, [&](size_t first, size_t count) {
    runs.emplace_back(first, count);
    return false;
  }));
  ASSERT_EQ(runs, runs_one_by_one(bits));
  // Stopping at each run in turn names that run.
  for (size_t stop = 0; stop < runs.size(); ++stop) {
    size_t seen = 0;
    std::pair<size_t, size_t> last;
    EXPECT_TRUE(tray::bitmap::for_each_run(bits, kBits, [&](size_t first, size_t count) {
      last = {first, count};
      return seen++ == stop;
    }));
    EXPECT_EQ(last, runs[stop]);
  }
  for (size_t from = 0; from < kBits; from += 7) {  // 7: every offset in a word, in turn
    size_t set = from;
    while (set < kBits && !bit(bits, set)) ++set;
    size_t clear = from;
    while (clear < kBits && bit(bits, clear)) ++clear;
    size_t start = from;
    while (start > 0 && bit(bits, start - 1)) --start;
    EXPECT_EQ(tray::bitmap::run_start(bits, from), start) << from;
    EXPECT_EQ(tray::bitmap::next_with(bits, kBits, from, true), set) << from;
    EXPECT_EQ(tray::bitmap::next_with(bits, kBits, from, false), clear) << from;
    const size_t count = std::min<size_t>(200, kBits - from);
    size_t ones = 0;
    size_t end = from;
    for (size_t i = from; i < from + count; ++i)
      if (bit(bits, i)) ++ones, end = i + 1;
    EXPECT_EQ(tray::bitmap::count_range(bits, from, count), ones) << from;
    EXPECT_EQ(tray::bitmap::end_of_set(bits, from, count), end) << from;
  }
}

TEST(Bitmap, RunsAndSearchesMatchABitByBitReading) {
  tray_test::Rng rng(7);
  for (int round = 0; round < 200; ++round) {
    uint64_t bits[kWords] = {};
    // Runs of random lengths, from single bits to several words.
    for (size_t i = 0; i < kBits;) {
      const size_t length = size_t(rng.between(1, round % 2 == 0 ? 8 : 300));
      if (rng.next() % 2 == 0) tray::bitmap::set_range(bits, i, std::min(length, kBits - i), true);
      i += length;
    }
    check(bits);
  }
}

TEST(Bitmap, EdgesOfWordsAndOfTheMap) {
  uint64_t bits[kWords] = {};
  check(bits);
  tray::bitmap::set_range(bits, 0, kBits, true);
  check(bits);
  tray::bitmap::set_range(bits, 1, kBits - 2, false);  // the first and the last bit
  check(bits);
  tray::bitmap::set_range(bits, 63, 2, true);  // a run across two words
  tray::bitmap::set_range(bits, 128, 64, true);  // one whole word
  check(bits);
  tray::bitmap::set_range(bits, 0, kBits, false);
  tray::bitmap::set_range(bits, 1, kBits - 1, true);  // a span chunk's free pages when empty
  check(bits);
}

}  // namespace
