// The large cache's policies, each observed through what the program would see: page faults
// when a grown block is written, the cache's counters, and what comes back to the OS. A block
// that grows takes cached pages instead of faulting in fresh ones; a burst of big blocks freed
// together stays cached (not unmapped while the program frees) until the idle purger gives it
// back; a cached mapping that could not be grown for a request is kept, not thrown away; a
// mapping evicted while the purger runs is unmapped by it at once, not at its next deadline;
// nobody asking for large blocks empties it after the idle delay, and trim empties it at once.
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "large/config.hpp"
#include "large/large.hpp"
#include "platform/os.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

// The purger these tests wait for starts only in a program with a thread of its own.
testing::Environment* const kThreadedProgram =
    testing::AddGlobalTestEnvironment(new tray_test::ThreadedProgram);

using tray_test::kMiB;

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

size_t cached_bytes() { return tray_test::stats_now().large.cached_bytes; }

void* touched_block(size_t bytes, int value) {
  void* p = tray_malloc(bytes);
  if (p != nullptr) std::memset(p, value, bytes);
  return p;
}

// A block that grows past its reservation while the cache holds a freed mapping with touched
// pages gets those pages (joined, or moved in by the kernel) for what it grew: writing the
// grown part faults in only the block's own untouched tail. Without it, every page of the
// grown part is a fresh page fault, and the cached pages sit beside it until evicted.
TEST(LargeCache, GrowingBlockTakesCachedPages) {
  if (tray_test::kSanitized)
    GTEST_SKIP() << "sanitizers fault in shadow pages; TSan builds copy instead of mremap";
  tray_trim();
  constexpr size_t kStart = 2 * kMiB;
  constexpr size_t kCached = 8 * kMiB - 64 * 1024;  // a reservation of two chunks
  constexpr size_t kGrown = 10 * kMiB;
  auto* block = static_cast<unsigned char*>(touched_block(kStart, 0x21));
  ASSERT_NE(block, nullptr);
  void* freed = touched_block(kCached, 0x42);
  ASSERT_NE(freed, nullptr);
  tray_free(freed);
  ASSERT_GE(cached_bytes(), kCached);

  block = static_cast<unsigned char*>(tray_realloc(block, kGrown));
  ASSERT_NE(block, nullptr);
  const long before = minor_faults();
  std::memset(block + kStart, 0x63, kGrown - kStart);
  const long faults = minor_faults() - before;

  // Faults count the kernel's pages, which a TRAY_TEST_PAGE_SIZE build's are not.
  const long grown_pages = long((kGrown - kStart) / size_t(sysconf(_SC_PAGESIZE)));
  EXPECT_LT(faults, grown_pages / 2) << "the grown part was faulted in afresh";
  EXPECT_LT(cached_bytes(), kCached) << "the cached pages stayed in the cache";
  for (size_t i = 0; i < kStart; i += 4096) ASSERT_EQ(block[i], 0x21) << "offset " << i;
  ASSERT_EQ(block[kStart - 1], 0x21);
  tray_free(block);
}

// Big blocks freed together, as at the end of a round of work: the cache keeps half of what was
// live a moment before (more than its floor), so the frees do not unmap while the program
// waits on them; the idle purger gives it all back after the cache delay.
TEST(LargeCache, BurstFreedTogetherStaysCachedThenGoesBack) {
  tray_trim();
  constexpr size_t kBlockBytes = 16 * kMiB;
  constexpr size_t kCount = 12;  // 192 MiB live: half of it is above the 64 MiB floor
  static_assert(kCount * kBlockBytes / 2 > tray::kLargeCacheFloorBytes + kBlockBytes);
  void* blocks[kCount];
  for (void*& p : blocks) {
    p = touched_block(kBlockBytes, 0x5a);
    ASSERT_NE(p, nullptr);
  }
  // This thread allocates only large blocks, so it holds no heap, and the purger ends after a
  // second with nothing to do; a free cannot start it (MEMORY.md, "When the program goes
  // quiet"). Under TSan the blocks above take about that long, so it could end between the
  // last malloc and the frees, and the burst would wait for the next allocation. A block freed
  // first gives the purger work that outlasts the frees.
  tray_free(tray_malloc(kBlockBytes));
  for (void* p : blocks) tray_free(p);
  EXPECT_GT(cached_bytes(), tray::kLargeCacheFloorBytes);
  EXPECT_LE(cached_bytes(), (kCount + 1) * kBlockBytes / 2 + kBlockBytes);

  EXPECT_TRUE(tray_test::given_back_while_idle(std::chrono::milliseconds(tray::kLargeCacheDelayMs * 3),
                                               [] { return cached_bytes() == 0; }))
      << "the idle purger kept the burst: " << cached_bytes() << " bytes";
  EXPECT_EQ(tray_test::stats_now().large.cached_blocks, 0u);
}

// When the kernel refuses to grow the cached mapping picked for a bigger request, the request
// gets a mapping of its own and the cached one stays for the next request.
TEST(LargeCache, MappingThatCannotGrowStaysCached) {
  if (tray_test::kThreadSanitizer) GTEST_SKIP() << "TSan builds never grow mappings with mremap";
  tray_trim();
  void* freed = touched_block(6 * kMiB, 0x11);
  ASSERT_NE(freed, nullptr);
  tray_free(freed);
  const size_t cached = cached_bytes();
  ASSERT_GE(cached, 6 * kMiB);

  tray::os::inject_faults(tray::os::kFaultMremap, 1, UINT64_MAX / 2);
  void* big = tray_malloc(20 * kMiB);
  const uint64_t refused = tray::os::faults_injected();
  tray::os::inject_faults(0, 0, 0);
  ASSERT_NE(big, nullptr);
  EXPECT_GT(refused, 0u) << "the request did not try to grow the cached mapping";
  EXPECT_EQ(cached_bytes(), cached) << "the cached mapping was thrown away";
  std::memset(big, 0x7e, 20 * kMiB);
  tray_free(big);
}

// A freed block that would push a bigger, older mapping out of a full cache is the one that
// goes: the cache keeps the more touched pages. Oldest first, the 40 MiB went for the 30 MiB
// (or, joined, both stayed over the limit).
TEST(LargeCache, FreedBlockDoesNotDisplaceMoreThanItBrings) {
  tray_trim();
  constexpr size_t kOlder = 40 * kMiB;
  constexpr size_t kNewer = 30 * kMiB;
  static_assert(kOlder + kNewer > tray::kLargeCacheFloorBytes && kOlder < tray::kLargeCacheFloorBytes);
  static_assert((kOlder + kNewer) / 100 * tray::kLargeCachePeakPercent < tray::kLargeCacheFloorBytes);
  void* older = touched_block(kOlder, 0x51);
  void* newer = touched_block(kNewer, 0x52);
  ASSERT_NE(older, nullptr);
  ASSERT_NE(newer, nullptr);
  tray_free(older);
  const size_t cached = cached_bytes();
  ASSERT_GE(cached, kOlder);
  tray_free(newer);
  EXPECT_EQ(cached_bytes(), cached) << "the older, bigger mapping was not the one kept";
}

// Address space the large blocks hold, live or cached or on their way back (the address alone
// would not tell: the kernel may hand the range to anyone once it is unmapped).
size_t large_mapped_bytes() { return tray_test::stats_now().large.mapped_bytes; }

// A block too big for the cache, freed by `free_block` (on this thread or another): with the
// purger running, the free hands the unmap to it, which does it at once, long before the
// deadline it sleeps towards (a cached mapping's idle delay). Without the purger (sanitizer and
// debug builds) the free unmaps it itself.
void expect_evicted_block_unmapped_soon(void (*free_block)(void*)) {
  tray_trim();
  // A cached mapping gives the purger a deadline to sleep towards; the allocation started it.
  tray_free(touched_block(8 * kMiB, 0x01));
  constexpr size_t kBytes = 160 * kMiB;  // over half of itself, the most the cache would keep
  static_assert(kBytes <= tray::kLargeUnmapDeferBytes);
  void* big = touched_block(kBytes, 0x3c);
  ASSERT_NE(big, nullptr);
  free_block(big);
  const auto start = std::chrono::steady_clock::now();
  while (large_mapped_bytes() >= kBytes &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_LT(large_mapped_bytes(), kBytes) << "the evicted mapping was never unmapped";
  // Sanitizers make the unmap itself slow (their shadow of the range goes with it).
  if (!tray_test::kSanitized) {
    EXPECT_LT(waited, std::chrono::milliseconds(tray::kLargeCacheIdleMs / 2))
        << "the evicted mapping waited for the purger's next deadline";
  }
  EXPECT_LT(cached_bytes(), 16 * kMiB);
}

TEST(LargeCache, EvictedMappingUnmappedAtOnce) {
  expect_evicted_block_unmapped_soon([](void* p) { tray_free(p); });
}

TEST(LargeCache, EvictedMappingFreedByAnotherThreadUnmappedAtOnce) {
  expect_evicted_block_unmapped_soon([](void* p) { std::thread([p] { tray_free(p); }).join(); });
}

// A burst of big blocks freed at once is held for reuse for a while, and all of it goes back
// at trim.
TEST(LargeCache, TrimEmptiesTheCache) {
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(tray_malloc(8 * kMiB));
    ASSERT_NE(blocks.back(), nullptr);
    std::memset(blocks.back(), 1, 8 * kMiB);
  }
  for (void* p : blocks) tray_free(p);
  EXPECT_GT(tray_test::stats_now().large.cached_bytes, 0u);
  tray_trim();
  EXPECT_EQ(tray_test::stats_now().large.cached_bytes, 0u);
}

// Big blocks freed while nobody asks for another (a program whose large blocks went out of
// use) leave the cache kLargeCacheIdleMs after the last request, long before kLargeCacheDelayMs.
TEST(LargeCache, UnrequestedCacheEmptiesAfterTheIdleDelay) {
  static_assert(2 * tray::kLargeCacheIdleMs < tray::kLargeCacheDelayMs);
  tray_trim();
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(tray_malloc(2 * kMiB));
    ASSERT_NE(blocks.back(), nullptr);
    std::memset(blocks.back(), 1, 2 * kMiB);
  }
  const uint64_t freed_ms = tray::os::now_ms();
  for (void* p : blocks) tray_free(p);
  EXPECT_GT(tray_test::stats_now().large.cached_bytes, 0u);
  // The cache's clock moved on past the idle delay (with slack for the frees themselves), still
  // short of the full delay. On a loaded machine the idle purger may have got there first.
  tray::large_purge_expired(freed_ms + 2 * tray::kLargeCacheIdleMs);
  EXPECT_EQ(tray_test::stats_now().large.cached_bytes, 0u);
}

}  // namespace
