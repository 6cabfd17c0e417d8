// Helpers shared by the core unit tests: sanitizer detection, resident-memory readings, block
// patterns that expose overlapping or corrupted blocks, and the allocator's counters.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "traymalloc.h"

#if defined(__SANITIZE_ADDRESS__)
#define TRAY_TEST_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define TRAY_TEST_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRAY_TEST_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define TRAY_TEST_TSAN 1
#endif
#endif

namespace tray_test {

#ifdef TRAY_TEST_ASAN
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#ifdef TRAY_TEST_TSAN
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
inline constexpr bool kSanitized = kAddressSanitizer || kThreadSanitizer;
// TSan keeps the shadow of memory given back with madvise resident, and a record of every
// thread that ever ran: resident-memory bounds are checked in the other builds only.
inline constexpr bool kResidentBoundsHold = !kThreadSanitizer;

inline constexpr size_t kKiB = size_t{1} << 10;
inline constexpr size_t kMiB = size_t{1} << 20;

// Loop counts are sized for Release. Sanitizers make every access several times slower (TSan
// most), so their runs take fewer turns through the same paths.
constexpr size_t scaled(size_t release_count) {
  const size_t count = kThreadSanitizer    ? release_count / 16
                       : kAddressSanitizer ? release_count / 4
                                           : release_count;
  return std::max<size_t>(count, 1);
}

// Resident set size of this process, from /proc/self/statm. Read with plain system calls so
// the reading itself allocates nothing.
inline size_t resident_bytes() {
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) std::abort();
  char text[128] = {};
  const ssize_t length = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (length <= 0) std::abort();
  const char* resident_field = text;
  while (*resident_field != ' ' && *resident_field != '\0') ++resident_field;
  return std::strtoull(resident_field, nullptr, 10) * size_t(::sysconf(_SC_PAGESIZE));
}

// How far resident memory may rise above a baseline once everything is freed: 10% of it or
// 8 MiB, whichever is larger. Room for metadata and a few warm pages, far below a leak.
inline size_t rss_slack(size_t baseline) { return std::max(baseline / 10, 8 * kMiB); }

// splitmix64: small, fast and deterministic, so a failing run replays the same way.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi].
  size_t between(size_t lo, size_t hi) { return lo + size_t(next() % (hi - lo + 1)); }

 private:
  uint64_t state_;
};

// Request sizes shaped like a typical program's: mostly small, some medium, and now and then
// one of hundreds of KiB (the smaller big classes).
inline size_t mixed_size(Rng& rng) {
  const uint64_t roll = rng.next() % 100;
  if (roll < 85) return rng.between(8, 1 * kKiB);
  if (roll < 98) return rng.between(1 * kKiB + 1, 32 * kKiB);
  return rng.between(32 * kKiB + 1, 256 * kKiB);
}

// Byte i of a sequence is seed + i: two overlapping blocks filled from different seeds, or a
// block shifted by a copy, disagree with what they should hold. Every 256-byte stretch of a
// sequence is a slice of this ramp, so blocks are filled and checked with memcpy and memcmp
// (which sanitizers check per call, not per byte).
inline constexpr std::array<uint8_t, 512> kRamp = [] {
  std::array<uint8_t, 512> ramp{};
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = uint8_t(i);
  return ramp;
}();
inline constexpr size_t kRampPeriod = 256;

inline void fill_sequence(void* p, size_t size, uint8_t seed) {
  auto* bytes = static_cast<uint8_t*>(p);
  for (size_t done = 0; done < size; done += kRampPeriod)
    std::memcpy(bytes + done, &kRamp[seed], std::min(kRampPeriod, size - done));
}

inline bool sequence_intact(const void* p, size_t size, uint8_t seed) {
  const auto* bytes = static_cast<const uint8_t*>(p);
  for (size_t done = 0; done < size; done += kRampPeriod)
    if (std::memcmp(bytes + done, &kRamp[seed], std::min(kRampPeriod, size - done)) != 0)
      return false;
  return true;
}

// A seed that follows from the block's address and size, so whoever frees a block can check
// it without being told how it was filled.
inline uint8_t address_seed(const void* p, size_t size) {
  const uint64_t mixed = (reinterpret_cast<uintptr_t>(p) ^ (uint64_t(size) << 40)) *
                         0x9E3779B97F4A7C15ull;
  return uint8_t(mixed >> 56);
}

inline void fill_pattern(void* p, size_t size) { fill_sequence(p, size, address_seed(p, size)); }

inline bool pattern_intact(const void* p, size_t size) {
  return sequence_intact(p, size, address_seed(p, size));
}

// A block and the size that was asked for.
struct Block {
  void* ptr = nullptr;
  size_t size = 0;
};

// Allocates `size` bytes filled with their address pattern; ptr is null if allocation failed.
inline Block allocate_filled(size_t size) {
  void* p = tray_malloc(size);
  if (p != nullptr) fill_pattern(p, size);
  return {p, size};
}

// Checks a block's pattern, then frees it; returns whether the pattern was intact.
inline bool free_checked(const Block& block) {
  const bool intact = pattern_intact(block.ptr, block.size);
  tray_free(block.ptr);
  return intact;
}

// The allocator's statistics now.
inline tray_stats stats_now() {
  tray_stats stats{};
  stats.version = TRAY_STATS_VERSION;
  EXPECT_EQ(tray_stats_get(&stats), 0);
  return stats;
}

// On a loaded machine the purger thread may wait for a core well past its deadline: the idle
// tests look again until this long has gone by before they fail.
inline constexpr auto kIdleWaitLoaded = std::chrono::milliseconds(5000);

// Sleeps `wait`, then polls until `given_back()` or kIdleWaitLoaded has passed; returns the
// last answer. Reading statistics gives nothing back: only the purger can make it true.
template <typename Check>
bool given_back_while_idle(std::chrono::milliseconds wait, Check given_back) {
  const auto deadline = std::chrono::steady_clock::now() + kIdleWaitLoaded;
  std::this_thread::sleep_for(wait);
  while (!given_back() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return given_back();
}

// The purger thread starts only once the program has a thread of its own (purge/purger.cpp),
// as most programs that run for long have. A test program whose tests wait for it registers
// this environment, which starts a thread before the tests and joins it: the C library counts
// the process as multi-threaded from then on.
class ThreadedProgram : public testing::Environment {
 public:
  void SetUp() override { std::thread([] {}).join(); }
};

}  // namespace tray_test
