// The sampling countdown (sample.hpp): how often each sampler fires, for requests of every
// size, must match its mean rate, so that estimates scaled by it are unbiased; samplers that
// are off must never fire, and option changes must reach a heap on its next slow path.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "options/options.hpp"
#include "heap/sample_countdown.hpp"
#include "size_classes/size_classes.hpp"
#include "traymalloc.h"
#include "segment/types.hpp"

namespace {

using tray::Heap;

class Sampling : public testing::Test {
 protected:
  void SetUp() override { set("prof", "0"), set("guard_sample", "0"), set("prof_sample", "512k"); }
  void TearDown() override { SetUp(); }

  static void set(const char* name, const char* value) {
    ASSERT_EQ(tray_option_set(name, value), 0) << name << "=" << value;
  }

  // A heap armed for the current options, as the slow path would arm it.
  static void arm(Heap& heap) { tray::sample_refresh(&heap); }

  // The countdown a request of `size` bytes is charged to: its class's, or the large one.
  static unsigned stream_of(size_t size) {
    return size <= tray::kMaxSmallBytes ? tray::size_class_of(size) : tray::kSampleStreamLarge;
  }

  // Charges `count` requests of `size` bytes one by one (a class's slot charges a block's bytes
  // for each block it takes in); returns how many times each sampler fired.
  struct Fires {
    uint64_t prof = 0, guard = 0, requests = 0;
  };
  static Fires run(Heap& heap, size_t size, uint64_t count) {
    Fires fires;
    const unsigned stream = stream_of(size);
    for (uint64_t i = 0; i < count; ++i) {
      tray::countdown_of(&heap, stream) -= int64_t(size);
      if (tray::countdown_of(&heap, stream) >= 0) continue;
      const unsigned fired = tray::sample_take(&heap, stream);
      fires.prof += (fired & tray::kSamplerProf) != 0;
      fires.guard += (fired & tray::kSamplerGuard) != 0;
    }
    fires.requests = count;
    return fires;
  }

  tray::Page empty_page_;
  Heap heap_{&empty_page_};
};

// Within `sigmas` standard deviations of a count whose expectation is `expected` (Poisson).
void expect_count_near(uint64_t count, double expected, double sigmas = 5) {
  EXPECT_NEAR(double(count), expected, sigmas * std::sqrt(expected) + 1)
      << "expected about " << expected;
}

TEST_F(Sampling, OffByDefaultSoTheCountdownNeverRunsOut) {
  arm(heap_);
  for (unsigned stream = 0; stream < tray::kSampleStreams; ++stream)
    EXPECT_EQ(tray::countdown_of(&heap_, stream), INT64_MAX);
  const Fires fires = run(heap_, 1 << 20, 100000);  // 100 GiB of requests
  EXPECT_EQ(fires.prof + fires.guard, 0u);
}

// Each request of s bytes is sampled with probability 1 - exp(-s / mean).
TEST_F(Sampling, ProfFiresAtItsByteRateForSmallAndLargeRequests) {
  set("prof", "1");
  set("prof_sample", "4096");
  arm(heap_);
  for (const size_t size : {16u, 48u, 1000u, 4096u, 100000u}) {
    const uint64_t count = 40000;
    const Fires fires = run(heap_, size, count);
    const double p = 1 - std::exp(-double(size) / 4096);
    expect_count_near(fires.prof, p * double(count));
    EXPECT_EQ(fires.guard, 0u);
  }
}

TEST_F(Sampling, TwoSamplersFireIndependentlyAtTheirOwnRates) {
  set("prof", "1");
  set("prof_sample", "8k");
  set("guard_sample", "64k");
  arm(heap_);
  const uint64_t count = 200000;
  const Fires fires = run(heap_, 64, count);
  expect_count_near(fires.prof, count * (1 - std::exp(-64.0 / 8192)));
  expect_count_near(fires.guard, count * (1 - std::exp(-64.0 / 65536)));
}

TEST_F(Sampling, ARateOfOneByteSamplesEveryRequest) {
  set("guard_sample", "1");
  arm(heap_);
  const Fires fires = run(heap_, 16, 10000);
  // A 16-byte request is missed only if the exponential gap exceeds 16 mean gaps: e^-16.
  EXPECT_GE(fires.guard, 9999u);
}

TEST_F(Sampling, IntervalsAreExponential) {
  set("prof", "1");
  set("prof_sample", "1m");
  double sum = 0, sum_squares = 0;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    arm(heap_);
    const double interval = double(tray::countdown_of(&heap_, stream_of(64)));
    sum += interval;
    sum_squares += interval * interval;
  }
  const double mean = sum / draws;
  const double deviation = std::sqrt(sum_squares / draws - mean * mean);
  EXPECT_NEAR(mean, 1 << 20, 0.05 * (1 << 20));
  EXPECT_NEAR(deviation, 1 << 20, 0.05 * (1 << 20));  // an exponential's deviation is its mean
}

TEST_F(Sampling, ChangedOptionsReachAHeapOnItsNextSlowPath) {
  arm(heap_);
  EXPECT_EQ(tray::countdown_of(&heap_, 0), INT64_MAX);
  set("guard_sample", "1");
  EXPECT_NE(heap_.sampling.generation, tray::g_sample_generation.load());
  // What the heap's next slow path does first: every stream re-armed.
  tray::sample_refresh(&heap_);
  for (unsigned stream = 0; stream < tray::kSampleStreams; ++stream)
    EXPECT_LT(tray::countdown_of(&heap_, stream), 64) << "stream " << stream;
  set("guard_sample", "0");
  tray::sample_refresh(&heap_);
  EXPECT_EQ(tray::countdown_of(&heap_, tray::kSampleStreamLarge), INT64_MAX);
}

TEST(SampleOptions, ByteCountsTakeBinarySuffixesAndRejectGarbage) {
  EXPECT_EQ(tray_option_set("prof_sample", "2m"), 0);
  EXPECT_EQ(tray::option(tray::Option::kProfSample), 2 << 20);
  EXPECT_EQ(tray_option_set("prof_sample", "4K"), 0);
  EXPECT_EQ(tray::option(tray::Option::kProfSample), 4096);
  EXPECT_EQ(tray_option_set("prof_sample", "12345"), 0);
  EXPECT_EQ(tray::option(tray::Option::kProfSample), 12345);
  for (const char* bad : {"", "k", "12x", "-1", "1.5m", "99999999999999999999"})
    EXPECT_EQ(tray_option_set("prof_sample", bad), EINVAL) << bad;
  EXPECT_EQ(tray::option(tray::Option::kProfSample), 12345);  // the last good value stays
  EXPECT_EQ(tray_option_set("prof_sample", "512k"), 0);
}

}  // namespace
