// Span chunks' free pages go back to the OS (span_purge.cpp): at trim, after a burst once the
// purge delay runs out, at once when the program has stopped asking for big blocks, beside
// threads that keep allocating; and empty chunks and pool segments change sides with their
// resident memory. Each test starts from a trim (span_fixture.hpp).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "core/core.hpp"
#include "segment/config.hpp"
#include "span/config.hpp"
#include "span_fixture.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

// The purger these tests wait for starts only in a program with a thread of its own.
testing::Environment* const kThreadedProgram =
    testing::AddGlobalTestEnvironment(new tray_test::ThreadedProgram);

using namespace tray_span_test;

// Of the OS pages of [p, p + size), the share that is resident, in percent.
size_t resident_percent(const void* p, size_t size) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{4095};
  const size_t pages = (reinterpret_cast<uintptr_t>(p) + size - first + 4095) / 4096;
  std::vector<unsigned char> in_core(pages);
  if (mincore(reinterpret_cast<void*>(first), pages * 4096, in_core.data()) != 0) return 0;
  size_t resident = 0;
  for (unsigned char page : in_core) resident += page & 1;
  return resident * 100 / pages;
}

TEST_F(Span, TrimGivesBackFreeRunsAndEmptyChunks) {
  std::vector<char*> blocks;
  // Under the dirty floor, in three chunks.
  for (int i = 0; i < 8; ++i) blocks.push_back(alloc_filled(1 * kMiB, uint8_t(i)));
  const auto live = tray_test::stats_now();
  for (char* p : blocks) tray_free(p);
  const auto freed = tray_test::stats_now();
  EXPECT_GE(freed.large.cached_bytes, 8 * kMiB) << "freed runs stay resident for reuse";
  ASSERT_EQ(tray_trim(), 1);
  const auto trimmed = tray_test::stats_now();
  EXPECT_EQ(trimmed.large.cached_bytes, 0u);
  EXPECT_LE(trimmed.large.mapped_bytes + 3 * tray::kSegmentBytes, live.large.mapped_bytes)
      << "the empty chunks are unmapped";
}

// A burst of blocks freed together, twice the dirty floor: it stays resident (it was live a
// moment ago, and a program that frees its blocks at the end of a round asks for them again in
// the next), and the idle purger gives it back once the delay is up, with no call into the
// allocator.
TEST_F(Span, ABurstStaysWarmAndIsGivenBackAfterTheDelay) {
  const size_t count = (tray::kSpanDirtyFloorBytes / kMiB) * 2;
  std::vector<char*> blocks;
  for (size_t i = 0; i < count; ++i) blocks.push_back(alloc_filled(1 * kMiB, uint8_t(i)));
  for (char* p : blocks) tray_free(p);
  const size_t cached = tray_test::stats_now().large.cached_bytes;
  // On a loaded machine the purger may have found the delay up already.
  if (cached != 0) {
    EXPECT_GE(cached, count * kMiB) << "freed together, the burst stays warm";
  }
  EXPECT_LE(cached, tray::kSpanDirtyFloorBytes + count * (kMiB + tray::kOsPageBytes))
      << "no more than was live a moment ago, past the floor";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (tray_test::stats_now().large.cached_bytes != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(tray_test::stats_now().large.cached_bytes, 0u);
}

// Free runs that the dirty limit let stay at the program's peak (holes that no request of the
// moment fits) stay while the blocks around them die a moment later: the limit's share of the
// live bytes is of the recent peak, as what was freed since is. A share of what is still live
// shrank as they died, and the runs went back a chunk at a time, to be faulted in again when
// the blocks came back.
TEST_F(Span, RunsKeptAtThePeakStayWhileTheBlocksDie) {
  // Three blocks fill a chunk but for 63 pages, so a hole left by one joins at most those; the
  // big blocks fit in no hole. At the peak, 48 MiB of big blocks beside 32 MiB of live small
  // ones and 32 MiB of holes (dirty), under the limit; then the big blocks die.
  const size_t small_bytes = kThirdOfAChunk;
  const size_t count = 3 * (tray::kSpanDirtyFloorBytes / kMiB);
  const size_t big_bytes = 2 * kMiB;
  const auto start = std::chrono::steady_clock::now();
  std::vector<void*> small;
  for (size_t i = 0; i < count; ++i) small.push_back(span_malloc(small_bytes));
  for (size_t i = 0; i < count; i += 2) {
    tray_free(small[i]);
    small[i] = nullptr;
  }
  std::vector<void*> big;
  for (size_t i = 0; i < count / 2; ++i) big.push_back(span_malloc(big_bytes));
  const size_t holes = tray_test::stats_now().large.cached_bytes;
  for (void* p : big) tray_free(p);
  const size_t after = tray_test::stats_now().large.cached_bytes;
  // Requests must have come within kSpanIdleMs, and no chunk may have been free for the
  // purge delay: on a machine too loaded for that, the limit is zero and nothing tells.
  const bool in_time = std::chrono::steady_clock::now() - start <
                       std::chrono::milliseconds(tray::kSpanIdleMs);
  for (void* p : small) tray_free(p);
  if (!in_time) GTEST_SKIP() << "the frees came more than " << tray::kSpanIdleMs << " ms late";
  ASSERT_GE(holes, count / 2 * small_bytes) << "the holes stayed at the peak";
  EXPECT_GE(after, holes + count / 2 * big_bytes)
      << "runs that stayed at the peak went back while the blocks around them died";
}

// Purges claim free runs under the lock and madvise them after letting go: blocks allocated,
// grown and freed by other threads meanwhile must keep their bytes, and a calloc must read
// zero whether its run was dirty, purged, or just given back by a purge.
TEST_F(Span, PurgesBesideAllocatingThreadsLeaveBlocksIntact) {
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  auto work = [&](uint32_t seed) {
    struct Live {
      char* p;
      size_t size;
      uint8_t seed;
    };
    std::vector<Live> live;
    for (int i = 0; i < 600; ++i) {
      seed = seed * 1103515245 + 12345;
      const size_t size = 128 * kKiB + (seed >> 8) % (900 * kKiB);
      if (i % 3 == 0) {
        auto* z = static_cast<char*>(tray_calloc(1, size));
        if (z == nullptr) bad.fetch_add(1);
        for (size_t j = 0; z != nullptr && j < size; j += 512)
          if (z[j] != 0) {
            bad.fetch_add(1);
            break;
          }
        tray_free(z);
      }
      live.push_back({alloc_filled(size, uint8_t(i)), size, uint8_t(i)});
      if (live.back().p == nullptr) bad.fetch_add(1);
      if (live.size() > 6) {
        const size_t k = (seed >> 4) % live.size();
        if (!tray_test::sequence_intact(live[k].p, live[k].size, live[k].seed)) bad.fetch_add(1);
        tray_free(live[k].p);
        live.erase(live.begin() + long(k));
      }
    }
    for (const Live& l : live) tray_free(l.p);
  };
  std::thread trimmer([&] {
    while (!stop.load()) tray_trim();
  });
  std::thread a(work, 1u), b(work, 2u);
  a.join();
  b.join();
  stop.store(true);
  trimmer.join();
  EXPECT_EQ(bad.load(), 0);
}

// A program whose big blocks went out of use frees them while it asks for none: they go back
// to the OS as they are freed, under the dirty floor and before the delay, while a block freed
// soon after a request stays resident for the next one.
TEST_F(Span, BlocksFreedAfterRequestsStoppedAreGivenBackAtOnce) {
  std::vector<char*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(alloc_filled(1 * kMiB, uint8_t(i)));
  tray_free(blocks.back());
  blocks.pop_back();
  EXPECT_GE(tray_test::stats_now().large.cached_bytes, 1 * kMiB) << "requests still come";
  ASSERT_EQ(tray_trim(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(tray::kSpanIdleMs + 50));
  for (char* p : blocks) {
    tray_free(p);
    EXPECT_EQ(tray_test::stats_now().large.cached_bytes, 0u) << "nothing asks for spans now";
  }
}

// The soak's mixed phase ends with 30-50 MiB of spans that die in the small phase's first
// 200 ms. A tenth of a second after the last request is long past reuse in a loop (a span per
// fraction of a millisecond), so what dies then goes back as it dies rather than for 150 ms.
TEST_F(Span, RequestsStoppedATenthOfASecondAgoKeepNothing) {
  char* a = alloc_filled(1 * kMiB, 1);
  char* b = alloc_filled(1 * kMiB, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  tray_free(a);
  EXPECT_EQ(tray_test::stats_now().large.cached_bytes, 0u);
  tray_free(b);
}

// The small blocks of a phase die and a big block comes: it is placed in a segment the pool
// just got back, on its resident units, rather than on new pages while the pool purges those.
TEST_F(Span, ABlockTakesAnEmptySegmentsResidentMemory) {
  const auto start = std::chrono::steady_clock::now();
  // 12 MiB of 8 KiB blocks fill three segments, two of them at least empty once freed (the
  // heap keeps 1 MiB of empty pages for itself).
  std::vector<char*> small;
  std::set<uintptr_t> segments;
  for (size_t i = 0; i < 12 * kMiB / (8 * kKiB); ++i) {
    small.push_back(alloc_filled(8 * kKiB, uint8_t(i)));
    segments.insert(chunk_of(small.back()));
  }
  for (char* p : small) tray_free(p);
  const size_t mapped = tray_test::stats_now().mapped_bytes;
  const size_t size = 2 * kMiB;
  auto* big = span_malloc(size);
  ASSERT_NE(big, nullptr);
  const size_t resident = resident_percent(big, size);
  const size_t mapped_after = tray_test::stats_now().mapped_bytes;
  tray_test::fill_sequence(big, size, 7);
  EXPECT_TRUE(tray_test::sequence_intact(big, size, 7));
  tray_free(big);
  // The purger gives dirty units back once they have been free for the delay.
  if (std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(tray::kPurgeDelayMs / 2))
    GTEST_SKIP() << "too slow to tell: the pool may have purged the units";
  EXPECT_EQ(segments.count(chunk_of(big)), 1u) << "the block went to a chunk the small ones did not use";
  // The spans' index may map its first page meanwhile: less than a chunk.
  EXPECT_LT(mapped_after, mapped + tray::kSegmentBytes / 2) << "a new chunk was mapped";
  if (tray_test::kResidentBoundsHold) {
    EXPECT_GE(resident, 90u) << "the block's pages were not resident before it was written";
  }
}

// The other way: the big blocks of a phase die and small ones come. The pool's next page is
// cut from an empty chunk that the spans just gave up, on its resident pages, before units of
// its own that would fault in (a block kept live makes sure it has some: its segment's other
// units, clean after the trim).
TEST_F(Span, APoolSegmentTakesAnEmptyChunksResidentMemory) {
  void* keep = tray_malloc(64);
  const auto start = std::chrono::steady_clock::now();
  const size_t third = kThirdOfAChunk;
  char* big[3];
  for (int i = 0; i < 3; ++i) big[i] = alloc_filled(third, uint8_t(i));
  const uintptr_t chunk = chunk_of(big[0]);
  ASSERT_EQ(chunk_of(big[2]), chunk) << "three such blocks fill one chunk";
  for (char* p : big) tray_free(p);
  // 32 KiB blocks until one lands in the chunk. A page of them holds 8; the first few may
  // come from the class's page of the moment.
  std::vector<void*> small;
  void* landed = nullptr;
  size_t resident = 0;
  for (size_t i = 0; i < 64 * kMiB / (32 * kKiB) && landed == nullptr; ++i) {
    small.push_back(tray_malloc(32 * kKiB));
    ASSERT_NE(small.back(), nullptr);
    if (chunk_of(small.back()) == chunk) {
      landed = small.back();
      resident = resident_percent(landed, 32 * kKiB);
    }
  }
  const size_t blocks_before = small.size() - 1;
  for (void* p : small) tray_free(p);
  tray_free(keep);
  // Spans nobody asks for go back kSpanIdleMs after the last request.
  if (std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(tray::kSpanIdleMs / 2))
    GTEST_SKIP() << "too slow to tell: the spans' free pages may have been purged";
  ASSERT_NE(landed, nullptr) << "the pool mapped new segments beside the empty chunk";
  EXPECT_LE(blocks_before, 16u) << "the pool cut pages from units that fault in first";
  if (tray_test::kResidentBoundsHold) {
    EXPECT_GE(resident, 90u) << "the block's pages were not resident before it was written";
  }
}

// Spans that are still busy (most of their recent high live) keep an empty chunk for their
// next blocks: the pool's next page is cut from its own clean units instead, and the spans
// reuse the chunk without mapping one.
TEST_F(Span, BusySpansKeepTheirEmptyChunk) {
  void* keep = tray_malloc(64);  // a segment with clean units for the pool
  const size_t third = kThirdOfAChunk;
  char* big[9];
  for (int i = 0; i < 9; ++i) big[i] = alloc_filled(third, uint8_t(i));
  const uintptr_t chunk = chunk_of(big[6]);
  ASSERT_EQ(chunk_of(big[8]), chunk) << "three such blocks fill one chunk";
  for (int i = 6; i < 9; ++i) tray_free(big[i]);  // two thirds of the high stay live
  std::vector<void*> small;
  for (int i = 0; i < 16; ++i) {
    small.push_back(tray_malloc(32 * kKiB));
    ASSERT_NE(small.back(), nullptr);
    EXPECT_NE(chunk_of(small.back()), chunk) << "the pool took the busy spans' empty chunk";
  }
  const size_t mapped = tray_test::stats_now().mapped_bytes;
  char* again = alloc_filled(third, 9);
  EXPECT_EQ(chunk_of(again), chunk);
  EXPECT_LT(tray_test::stats_now().mapped_bytes, mapped + tray::kSegmentBytes / 2)
      << "the spans mapped a new chunk";
  tray_free(again);
  for (void* p : small) tray_free(p);
  for (int i = 0; i < 6; ++i) tray_free(big[i]);
  tray_free(keep);
}

// Threads that switch between phases of small and big blocks at once, while a third trims:
// chunks go from the pool to the spans and back under them. Every block keeps its bytes, and
// a calloc'd span reads zero whether its pages were the pool's units or the chunk's own.
TEST_F(Span, ChunksChangingSidesUnderThreadsKeepEveryBlock) {
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  auto work = [&](uint8_t seed) {
    std::vector<char*> small(1024);
    for (size_t round = 0; round < tray_test::scaled(32); ++round) {
      for (size_t i = 0; i < small.size(); ++i) {
        small[i] = alloc_filled(8 * kKiB, uint8_t(seed + i));
        if (small[i] == nullptr) bad.fetch_add(1);
      }
      for (size_t i = 0; i < small.size(); ++i) {
        if (!tray_test::sequence_intact(small[i], 8 * kKiB, uint8_t(seed + i))) bad.fetch_add(1);
        tray_free(small[i]);
      }
      char* big[6];
      const size_t size = 1300 * kKiB;
      for (int k = 0; k < 6; ++k) {
        big[k] = static_cast<char*>(tray_calloc(1, size));
        if (big[k] == nullptr) {
          bad.fetch_add(1);
          continue;
        }
        for (size_t j = 0; j < size; j += 256)
          if (big[k][j] != 0) {
            bad.fetch_add(1);
            break;
          }
        tray_test::fill_sequence(big[k], size, uint8_t(seed + k));
      }
      for (int k = 0; k < 6; ++k) {
        if (big[k] != nullptr && !tray_test::sequence_intact(big[k], size, uint8_t(seed + k))) bad.fetch_add(1);
        tray_free(big[k]);
      }
    }
  };
  std::thread trimmer([&] {
    while (!stop.load()) {
      tray_trim();
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
  });
  std::thread a(work, 1), b(work, 100);
  a.join();
  b.join();
  stop.store(true);
  trimmer.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
