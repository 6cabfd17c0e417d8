// Large blocks that fit in a chunk are runs of pages in shared span chunks (span.cpp): a freed
// run serves the next block that fits, runs are split and joined again, realloc grows into the
// free pages after a block, and threads spread over arenas. How the free pages go back to the
// OS is span_purge_test.cpp's. Each test starts from a trim, which unmaps every empty chunk, so
// the blocks it allocates are laid out from the start of a fresh chunk (span_fixture.hpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "span/config.hpp"
#include "span/span.hpp"
#include "span/span_arena.hpp"
#include "span_fixture.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using namespace tray_span_test;

// What a span block of `size` bytes takes where a run of its rounded length is free: its
// 64-byte header and the block, in whole pages, rounded up to a multiple of an eighth of the
// power of two below, unless they are a power of two and one page (span_run_pages).
size_t run_bytes(size_t size) {
  const size_t pages = (64 + size + 4095) / 4096;
  size_t power = 1;
  while (power * 2 <= pages - 1) power *= 2;
  if (pages <= 9 || power == pages - 1) return pages * 4096;
  const size_t step = power / 8;
  return (pages + step - 1) / step * step * 4096;
}
// The size of the block that takes the rest of a fresh chunk after blocks of `taken` bytes (in
// runs), so that the only free runs are those a test frees.
size_t rest_of_chunk(size_t taken) { return tray::kSpanMaxBytes - taken - 64; }

// Every length a block can have: its run is never shorter, at most an eighth longer, never
// more than a chunk holds, and a run's length is its own run; a power of two and one page (the
// header's) is not rounded; and no doubling has more than nine lengths.
TEST(SpanRunPages, NineLengthsPerDoublingAndPowersOfTwoExact) {
  for (size_t pages = 1; pages < tray::kSpanChunkOsPages; ++pages) {
    const size_t run = tray::span_run_pages(pages);
    ASSERT_GE(run, pages) << pages;
    ASSERT_LE(run - pages, (pages - 1) / 8) << pages;
    ASSERT_LT(run, tray::kSpanChunkOsPages) << pages;
    ASSERT_EQ(tray::span_run_pages(run), run) << pages;
    ASSERT_GE(run, tray::span_run_pages(pages - 1)) << pages;
  }
  for (size_t power = 1; power + 1 < tray::kSpanChunkOsPages; power *= 2) {
    EXPECT_EQ(tray::span_run_pages(power + 1), power + 1) << power;
    std::set<size_t> lengths;
    for (size_t p = power + 1; p <= 2 * power && p < tray::kSpanChunkOsPages; ++p) lengths.insert(tray::span_run_pages(p));
    EXPECT_LE(lengths.size(), 9u) << power;
  }
}

TEST_F(Span, AFreedRunIsReusedAndBlocksShareAChunk) {
  char* a = alloc_filled(300 * kKiB, 1);
  char* b = alloc_filled(300 * kKiB, 2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(chunk_of(a), chunk_of(b)) << "blocks under a chunk are packed together";
  EXPECT_EQ(b, a + run_bytes(300 * kKiB));
  tray_free(a);
  tray_trim();  // gives back the freed blocks the arena keeps whole (see below)
  const auto before = tray_test::stats_now();
  char* again = alloc_filled(250 * kKiB, 3);
  EXPECT_EQ(again, a) << "the freed run serves the next block that fits";
  EXPECT_EQ(tray_test::stats_now().large.mapped_bytes, before.large.mapped_bytes);
  EXPECT_TRUE(tray_test::sequence_intact(b, 300 * kKiB, 2));
  tray_free(again);
  tray_free(b);
}

// A freed block is kept whole for the next request whose rounded run it holds, up to one
// rounding step longer; a shorter request takes a run of its own; and once the chunk holds
// no live block, the kept one goes back to it, so that the empty chunk is whole again.
TEST_F(Span, AFreedBlockIsKeptWholeForTheNextRequestOfAboutItsLength) {
  char* a = alloc_filled(300 * kKiB, 1);  // a run of 80 pages
  char* b = alloc_filled(300 * kKiB, 2);
  ASSERT_EQ(b, a + run_bytes(300 * kKiB));
  tray_free(a);
  char* same = alloc_filled(290 * kKiB, 3);  // 80 pages too
  EXPECT_EQ(same, a);
  tray_free(same);
  char* step_shorter = alloc_filled(260 * kKiB, 4);  // 72 pages: 80 is one step more
  EXPECT_EQ(step_shorter, a);
  // Whole: its last pages are its own, where a run cut to 72 pages would have left them free.
  const void* chunk = reinterpret_cast<const void*>(chunk_of(a));
  EXPECT_EQ(tray::span_block_of(chunk, a + 76 * 4096), tray::span_block_of(chunk, a));
  tray_free(step_shorter);
  // Handed out again to calloc, the whole of what the block touched is zeroed.
  auto* zeroed = static_cast<char*>(tray_calloc(1, 300 * kKiB));
  ASSERT_EQ(zeroed, a);
  for (size_t i = 0; i < 300 * kKiB; i += 8) ASSERT_EQ(zeroed[i], 0) << "at " << i;
  tray_free(zeroed);
  const auto kept = tray_test::stats_now();
  EXPECT_GE(kept.large.cached_blocks, 1u);
  EXPECT_GE(kept.large.cached_bytes, 4096u) << "a kept block counts as cached";
  char* shorter = alloc_filled(200 * kKiB, 5);  // 52 pages: takes a run of its own
  EXPECT_NE(shorter, a);
  EXPECT_TRUE(tray_test::sequence_intact(b, 300 * kKiB, 2));
  tray_free(shorter);
  tray_free(b);
  // Nothing live in the chunk: every page is free again, kept blocks' too (an empty chunk is
  // what the pool takes when it needs memory), so a block of the whole chunk fits.
  EXPECT_EQ(tray::span_block_of(chunk, shorter), nullptr) << "a kept block holds on to an idle chunk";
  char* whole = alloc_filled(rest_of_chunk(0), 6);
  EXPECT_EQ(whole, a) << "a kept block held on to a chunk with nothing live";
  tray_free(whole);
}

TEST_F(Span, NeighbouringFreeRunsJoinAndABigRunIsSplit) {
  const size_t size = 1 * kMiB;
  char* a = alloc_filled(size, 1);
  char* b = alloc_filled(size, 2);
  const size_t c_size = rest_of_chunk(2 * run_bytes(size));
  char* c = alloc_filled(c_size, 3);
  ASSERT_EQ(b, a + run_bytes(size));
  ASSERT_EQ(c, b + run_bytes(size));
  tray_free(a);
  tray_free(b);
  // The two runs, joined, are the only free pages of the chunk.
  char* joined = alloc_filled(2 * size, 4);
  EXPECT_EQ(joined, a);
  tray_free(joined);
  // The joined run is split: the smallest free run that fits serves each block.
  char* first = alloc_filled(200 * kKiB, 5);
  char* second = alloc_filled(200 * kKiB, 6);
  EXPECT_EQ(first, a);
  EXPECT_EQ(second, a + run_bytes(200 * kKiB));
  EXPECT_TRUE(tray_test::sequence_intact(c, c_size, 3));
  EXPECT_TRUE(tray_test::sequence_intact(first, 200 * kKiB, 5));
  tray_free(first);
  tray_free(second);
  tray_free(c);
}

// The same, for a thread that finds its arena's lock held (here by the test; in CI's TSan run by
// the purger's pass) and moves to the next arena: the blocks it kept whole in the arena it left
// are given back there and serve it, rather than a new chunk beside them.
TEST_F(Span, BlocksKeptInTheArenaAThreadLeftServeIt) {
  const size_t size = 1 * kMiB;
  char* a = alloc_filled(size, 1);
  char* b = alloc_filled(size, 2);
  char* c = alloc_filled(rest_of_chunk(2 * run_bytes(size)), 3);
  ASSERT_EQ(b, a + run_bytes(size));
  tray_free(a);
  tray_free(b);
  tray::SpanArena& left = tray::span_arena_of(reinterpret_cast<tray::SpanChunk*>(chunk_of(a)));
  std::atomic<bool> held{false};
  std::thread holder([&] {
    left.lock.lock();
    held.store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    left.lock.unlock();
  });
  while (!held.load()) std::this_thread::yield();
  char* joined = alloc_filled(2 * size, 4);
  holder.join();
  EXPECT_EQ(joined, a) << "a new chunk beside the blocks kept in the arena the thread left";
  tray_free(joined);
  tray_free(c);
}

// A run whose first page never held a header (what a shorter block left of a freed one,
// joined to the next freed block) gives the next block the page where a block started
// before, if the pages it skips are at most an eighth of the block: that page is resident,
// so the block's first write does not fault. A longer skip would split the run for it.
TEST_F(Span, ABlockStartsWhereABlockStartedIfItSkipsLittle) {
  const auto pages = [](size_t n) { return n * 4096 - 64; };
  char* a = alloc_filled(pages(96), 1);
  char* b = alloc_filled(pages(80), 2);
  const size_t c_size = rest_of_chunk(run_bytes(pages(96)) + run_bytes(pages(80)));
  char* c = alloc_filled(c_size, 3);
  ASSERT_EQ(b, a + 96 * 4096);
  ASSERT_EQ(c, b + 80 * 4096);
  tray_free(a);
  tray::span_stash_flush_all();  // a's run is free, not a block kept whole
  char* d = alloc_filled(pages(88), 4);  // leaves 8 pages of a's run that no block started on
  ASSERT_EQ(d, a);
  tray_free(b);  // the free run: those 8 pages, then b's 80
  tray::span_stash_flush_all();
  char* e = alloc_filled(pages(80), 5);
  EXPECT_EQ(e, b) << "started " << (e - a) / 4096 << " pages into a's run, not on b's first page";
  EXPECT_TRUE(tray_test::sequence_intact(d, pages(88), 4));
  EXPECT_TRUE(tray_test::sequence_intact(c, c_size, 3));
  tray_free(e);
  tray_free(d);
  tray_free(c);
}

// A pointer anywhere in a block's run finds the block's header (frees of the block, and debug
// mode's "lies inside a large block"); one into free pages, into what a shrink gave back or
// into the chunk's header page finds none, and freeing it changes nothing.
TEST_F(Span, APointerIntoABlockFindsItAndOneIntoFreePagesFindsNone) {
  char* a = alloc_filled(300 * kKiB, 1);
  char* b = alloc_filled(300 * kKiB, 2);
  char* c = alloc_filled(300 * kKiB, 3);
  ASSERT_EQ(b, a + run_bytes(300 * kKiB));
  ASSERT_EQ(c, b + run_bytes(300 * kKiB));
  const auto* chunk = reinterpret_cast<const void*>(chunk_of(a));
  const auto block_of = [](const char* p) {
    return tray::span_block_of(reinterpret_cast<const void*>(chunk_of(p)), p);
  };
  ASSERT_NE(block_of(a), nullptr);
  EXPECT_EQ(block_of(a)->user, a);
  EXPECT_EQ(block_of(a + 200 * kKiB), block_of(a));
  EXPECT_EQ(block_of(a + 300 * kKiB - 1), block_of(a));
  EXPECT_EQ(block_of(c + 300 * kKiB - 1)->user, c);
  EXPECT_EQ(block_of(static_cast<const char*>(chunk) + 100), nullptr) << "the chunk's header page";
  tray_free(b);
  tray_trim();  // b was kept whole for the next request of its length: its pages go back
  EXPECT_EQ(block_of(b), nullptr);
  EXPECT_EQ(block_of(b + 200 * kKiB), nullptr) << "free pages after a live block";
  EXPECT_EQ(block_of(c)->user, c);
  ASSERT_EQ(tray_realloc(a, 200 * kKiB), a);
  EXPECT_EQ(block_of(a + 199 * kKiB)->user, a);
  EXPECT_EQ(block_of(a + 250 * kKiB), nullptr) << "what the shrink gave back";
  // A free of a pointer inside the block stops the program, naming the block.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(tray_free(c + 100 * kKiB),
               "free of invalid pointer 0x[0-9a-f]+: not the start of a block \\(102400 bytes "
               "into large block 0x[0-9a-f]+ of [0-9]+ bytes\\)");
  EXPECT_EQ(block_of(c)->user, c);
  EXPECT_TRUE(tray_test::sequence_intact(c, 300 * kKiB, 3));
  // A block aligned to a page starts a page past its header: its pointer lies on the second
  // page of its run.
  void* aligned = nullptr;
  ASSERT_EQ(tray_posix_memalign(&aligned, 4 * kKiB, 200 * kKiB), 0);
  ASSERT_EQ(chunk_of(aligned), chunk_of(a));
  EXPECT_EQ(block_of(static_cast<char*>(aligned))->user, aligned);
  EXPECT_EQ(reinterpret_cast<char*>(block_of(static_cast<char*>(aligned))), static_cast<char*>(aligned) - 4 * kKiB);
  tray_free(aligned);
  tray_free(c);
  tray_free(a);
}

TEST_F(Span, ReallocGrowsInPlaceIntoFreePagesAndMovesWhenTheyAreTaken) {
  char* p = alloc_filled(200 * kKiB, 7);
  ASSERT_NE(p, nullptr);
  char* grown = static_cast<char*>(tray_realloc(p, 1 * kMiB));
  EXPECT_EQ(grown, p) << "the pages after the block are free";
  EXPECT_TRUE(tray_test::sequence_intact(grown, 200 * kKiB, 7));
  tray_test::fill_sequence(grown, 1 * kMiB, 8);
  char* neighbour = alloc_filled(200 * kKiB, 9);
  EXPECT_EQ(neighbour, grown + run_bytes(1 * kMiB));
  char* moved = static_cast<char*>(tray_realloc(grown, 2 * kMiB));
  ASSERT_NE(moved, nullptr);
  EXPECT_NE(moved, grown);
  EXPECT_TRUE(tray_test::sequence_intact(moved, 1 * kMiB, 8));
  // Past a chunk the block becomes a mapping of its own, contents kept.
  char* big = static_cast<char*>(tray_realloc(moved, 6 * kMiB));
  ASSERT_NE(big, nullptr);
  EXPECT_TRUE(tray_test::sequence_intact(big, 1 * kMiB, 8));
  EXPECT_TRUE(tray_test::sequence_intact(neighbour, 200 * kKiB, 9));
  tray_free(big);
  tray_free(neighbour);
}

TEST_F(Span, ShrinkingGivesTheTailToTheNextBlock) {
  char* p = alloc_filled(2 * kMiB, 1);
  const size_t after_size = rest_of_chunk(run_bytes(2 * kMiB));
  char* after = alloc_filled(after_size, 2);
  ASSERT_EQ(after, p + run_bytes(2 * kMiB));
  ASSERT_EQ(tray_realloc(p, 1 * kMiB), p);
  EXPECT_TRUE(tray_test::sequence_intact(p, 1 * kMiB, 1));
  // The tail is the only free run of the chunk.
  char* tail = alloc_filled(512 * kKiB, 3);
  EXPECT_EQ(tail, p + run_bytes(1 * kMiB));
  EXPECT_TRUE(tray_test::sequence_intact(after, after_size, 2));
  tray_free(tail);
  tray_free(after);
  tray_free(p);
}

// Blocks of random sizes replaced one at a time start where blocks started before: a freed
// run is taken whole by a block of its rounded length, not split at a new page each time. With
// exact lengths the starts spread over the chunks, and each new one was a page to fault in
// for the header of a block that touches nothing more (large_slots: 65k faults in 200k steps).
TEST_F(Span, BlocksReplacedAtRandomReuseTheStartsOfEarlierOnes) {
  constexpr size_t kLive = 200;
  tray_test::Rng rng(32);
  std::vector<char*> live(kLive);
  std::set<uintptr_t> starts;
  const auto allocate = [&] {
    auto* p = span_malloc(rng.between(256 * kKiB, 512 * kKiB));
    if (p != nullptr) *p = 1;
    starts.insert(reinterpret_cast<uintptr_t>(p));
    return p;
  };
  for (char*& p : live) ASSERT_NE(p = allocate(), nullptr);
  for (int step = 0; step < 20000; ++step) {
    char*& p = live[rng.next() % kLive];
    tray_free(p);
    ASSERT_NE(p = allocate(), nullptr);
  }
  for (char* p : live) tray_free(p);
  // Rounded: 2,817 starts, 14 for each live block; with exact lengths: 7,286.
  EXPECT_LT(starts.size(), 25 * kLive) << "the blocks kept starting on new pages";
}

// More chunks than the index has room for at first (256 slots): it grows, and what it knew of
// the first chunks' free runs must come along, or their runs are lost to it (a new chunk per
// block below) and a search walks off the chunks it has.
TEST_F(Span, AnIndexGrownPastItsFirstRoomStillFindsEveryChunksRun) {
  constexpr size_t kChunks = 300;
  constexpr size_t kTwoThirdsOfAChunk = 640 * 4096 - 64;  // leaves a run that one third holds
  std::vector<void*> blocks;
  std::set<uintptr_t> chunks;
  for (size_t i = 0; i < kChunks; ++i) {
    blocks.push_back(span_malloc(kTwoThirdsOfAChunk));
    ASSERT_NE(blocks.back(), nullptr);
    chunks.insert(chunk_of(blocks.back()));
  }
  ASSERT_EQ(chunks.size(), kChunks) << "each block takes a chunk of its own";
  for (size_t i = 0; i < kChunks; ++i) {
    blocks.push_back(span_malloc(kThirdOfAChunk));
    ASSERT_NE(blocks.back(), nullptr);
    EXPECT_EQ(chunks.count(chunk_of(blocks.back())), 1u) << "block " << i << " took a new chunk";
  }
  for (void* p : blocks) tray_free(p);
}

TEST_F(Span, CallocOfAReusedRunIsZero) {
  const size_t size = 700 * kKiB;
  auto* dirty = span_malloc(size);
  ASSERT_NE(dirty, nullptr);
  std::memset(dirty, 0xAB, size);
  tray_free(dirty);
  auto* zeroed = static_cast<char*>(tray_calloc(1, size));
  ASSERT_EQ(zeroed, dirty) << "the test needs the run reused";
  for (size_t i = 0; i < size; i += 512) ASSERT_EQ(zeroed[i], 0) << "at " << i;
  EXPECT_EQ(zeroed[size - 1], 0);
  tray_free(zeroed);
}

TEST_F(Span, ABlockFreedByAnotherThreadIsReused) {
  char* p = alloc_filled(400 * kKiB, 4);
  ASSERT_NE(p, nullptr);
  std::thread([p] {
    EXPECT_TRUE(tray_test::sequence_intact(p, 400 * kKiB, 4));
    tray_free(p);
  }).join();
  char* again = alloc_filled(400 * kKiB, 5);
  EXPECT_EQ(again, p);
  tray_free(again);
}

// Threads that allocate spans at once move to arenas of their own when they find one locked,
// and hand half their blocks to the next thread, which frees them into the arena of the thread
// that allocated them, grows or shrinks some first: every byte stays, and calloc reads zero.
// A ThreadSanitizer test of the arenas' locking as much as a check of the bytes.
TEST_F(Span, ThreadsSpreadOverArenasAndFreeIntoEachOthers) {
  constexpr int kThreads = 4;
  struct Handed {
    char* p;
    size_t size;
    uint8_t seed;
  };
  std::mutex lock;
  std::vector<Handed> inbox[kThreads];
  std::atomic<int> bad{0};
  auto work = [&](int self) {
    uint32_t seed = uint32_t(self) + 1;
    for (int i = 0; i < 400; ++i) {
      seed = seed * 1103515245 + 12345;
      const size_t size = 128 * kKiB + (seed >> 8) % (1500 * kKiB);
      const auto fill = uint8_t(seed >> 3);
      char* p = i % 5 == 0 ? static_cast<char*>(tray_calloc(1, size)) : alloc_filled(size, fill);
      if (p == nullptr) {
        bad.fetch_add(1);
        continue;
      }
      if (i % 5 == 0) {
        for (size_t j = 0; j < size; j += 4096) bad.fetch_add(p[j] != 0);
        tray_test::fill_sequence(p, size, fill);
      }
      if (i % 2 == 0) {
        const std::lock_guard<std::mutex> guard(lock);
        inbox[(self + 1) % kThreads].push_back({p, size, fill});
      } else if (!tray_test::sequence_intact(p, size, fill)) {
        bad.fetch_add(1);
        tray_free(p);
      } else {
        tray_free(p);
      }
      std::vector<Handed> mine;
      {
        const std::lock_guard<std::mutex> guard(lock);
        mine.swap(inbox[self]);
      }
      for (Handed& h : mine) {
        if (!tray_test::sequence_intact(h.p, h.size, h.seed)) bad.fetch_add(1);
        // Some grow or shrink in the arena of the thread that allocated them.
        const size_t resized = h.size % 3 == 0 ? h.size + 200 * kKiB : h.size * 3 / 4;
        if (h.size % 3 != 2) {
          char* q = static_cast<char*>(tray_realloc(h.p, resized));
          if (q == nullptr || !tray_test::sequence_intact(q, std::min(h.size, resized), h.seed)) bad.fetch_add(1);
          h.p = q;
        }
        tray_free(h.p);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (std::thread& t : threads) t.join();
  for (auto& box : inbox)
    for (const Handed& h : box) {
      if (!tray_test::sequence_intact(h.p, h.size, h.seed)) bad.fetch_add(1);
      tray_free(h.p);
    }
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
