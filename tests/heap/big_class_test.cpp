// The big classes (160 KiB .. 2 MiB, heap/tails.cpp): blocks of pages once a heap uses the
// class, frees that make no system call, the tails of free blocks given back, and the answers
// to bad input kept across every class boundary.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/core.hpp"
#include "heap/config.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::Block;
using tray_test::kKiB;
using tray_test::kMiB;

bool in_a_page(const void* p) { return tray::chunk_kind(p) == tray::kChunkSegment; }

unsigned long long os_calls(const tray_stats& s) {
  return s.os_mmap + s.os_munmap + s.os_madvise + s.os_mremap + s.os_mprotect;
}

// `count` blocks of `size` bytes from pages: the first few of a class a heap asks for seldom
// are large blocks, freed again here.
std::vector<Block> allocate_from_pages(size_t size, size_t count) {
  std::vector<Block> blocks;
  for (int tries = 0; tries < 100; ++tries) {
    blocks.push_back(tray_test::allocate_filled(size));
    EXPECT_NE(blocks.back().ptr, nullptr);
    if (in_a_page(blocks.back().ptr)) break;
    EXPECT_TRUE(tray_test::free_checked(blocks.back()));
    blocks.pop_back();
  }
  EXPECT_EQ(blocks.size(), 1u) << size << " B: still large blocks";
  for (size_t i = 1; i < count; ++i) {
    blocks.push_back(tray_test::allocate_filled(size));
    EXPECT_TRUE(in_a_page(blocks.back().ptr)) << size << " B, block " << i;
  }
  return blocks;
}

TEST(BigClass, EveryClassServesItsSizesFromPagesOnceUsed) {
  for (unsigned c = tray::kFirstBigClass; c < tray::kSizeClassCount; ++c) {
    const size_t size = tray::class_size(c);
    SCOPED_TRACE(testing::Message() << "class " << c << " (" << size << " B)");
    const unsigned long long live_before = tray_test::stats_now().classes[c].live_blocks;
    // The smallest size of the class and the class's own, as many as two pages hold.
    const size_t count = 2 * tray::class_blocks_per_page(c) + 1;
    std::vector<Block> blocks = allocate_from_pages(tray::class_size(c - 1) + 1, count);
    for (const Block& b : allocate_from_pages(size, count)) blocks.push_back(b);
    ASSERT_EQ(blocks.size(), 2 * count);
    for (const Block& b : blocks) {
      EXPECT_EQ(tray_usable_size(b.ptr), size);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.ptr) % 16, 0u);
    }
    EXPECT_EQ(tray_test::stats_now().classes[c].live_blocks, live_before + 2 * count);
    for (const Block& b : blocks) EXPECT_TRUE(tray_test::free_checked(b));
    EXPECT_EQ(tray_test::stats_now().classes[c].live_blocks, live_before);
  }
}

// Blocks replaced one by one, as a cache of buffers does: the frees (and the allocations, from
// the free blocks) make no system call, whatever the blocks' sizes.
TEST(BigClass, AFreeMakesNoSystemCall) {
  const size_t sizes[] = {160 * kKiB, 300 * kKiB, 1 * kMiB, 2 * kMiB};
  std::vector<Block> live;
  for (size_t size : sizes)
    for (const Block& b : allocate_from_pages(size, 24)) live.push_back(b);
  // A round of replacements first, so that every class has taken the pages it needs.
  tray_test::Rng rng(54);
  const auto replace = [&](size_t steps) {
    for (size_t step = 0; step < steps; ++step) {
      Block& victim = live[rng.between(0, live.size() - 1)];
      ASSERT_TRUE(tray_test::free_checked(victim));
      victim = tray_test::allocate_filled(victim.size);
      ASSERT_TRUE(in_a_page(victim.ptr));
    }
  };
  replace(live.size());
  // A heap whose thread did not reach a slow path for the purge delay (200 ms) gives its free
  // blocks' tails back at the next one, as it should: a machine busy enough to hold the test
  // off its core that long (a sanitizer build beside other tests) sees one such madvise. So
  // each attempt counts; one without a call passes, and a free that makes calls fails them all.
  std::string calls;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const tray_stats before = tray_test::stats_now();
    replace(tray_test::scaled(20000));
    const tray_stats after = tray_test::stats_now();
    if (os_calls(after) == os_calls(before)) {
      calls.clear();
      break;
    }
    calls += "mmap " + std::to_string(after.os_mmap - before.os_mmap) + ", munmap " +
             std::to_string(after.os_munmap - before.os_munmap) + ", madvise " +
             std::to_string(after.os_madvise - before.os_madvise) + "; ";
  }
  EXPECT_TRUE(calls.empty()) << "every attempt made system calls: " << calls;
  for (const Block& b : live) EXPECT_TRUE(tray_test::free_checked(b));
}

// Free blocks keep their first OS page (their link and free key) and give back the rest: at
// once on a trim, and after the purge delay once the heap's big classes went quiet (seen by the
// next slow path: here a large block's). Their pages stay, each holding a block.
TEST(BigClass, FreeBlocksGiveBackAllButTheirFirstOsPage) {
  if (!tray_test::kResidentBoundsHold) GTEST_SKIP() << "ThreadSanitizer keeps freed memory";
  const size_t size = 512 * kKiB;
  const size_t per_page = tray::class_blocks_per_page(tray::size_class_of(size));
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "trim" : "quiet");
    std::vector<Block> blocks = allocate_from_pages(size, 8 * per_page);
    // Before the frees: a free past the heap's budget gives tails back too.
    const size_t resident = tray_test::resident_bytes();
    std::vector<Block> kept;
    size_t freed = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (i % per_page == 0) {
        kept.push_back(blocks[i]);
      } else {
        EXPECT_TRUE(tray_test::free_checked(blocks[i]));
        ++freed;
      }
    }
    if (round == 0) {
      tray_trim();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(tray::kPurgeDelayMs + 50));
      tray_free(tray_malloc(3 * kMiB));
    }
    const size_t given_back = resident - std::min(resident, tray_test::resident_bytes());
    EXPECT_GE(given_back, freed * (size - 16 * kKiB) * 3 / 4)
        << freed << " blocks of " << size << " B freed";
    // Taken again, the blocks are whole: the first OS page kept its contents, the rest reads
    // zero, and every byte is writable.
    for (size_t i = 0; i < freed; ++i) {
      Block b = tray_test::allocate_filled(size);
      EXPECT_TRUE(in_a_page(b.ptr));
      kept.push_back(b);
    }
    for (const Block& b : kept) EXPECT_TRUE(tray_test::free_checked(b));
  }
}

// A thread frees the blocks another allocated: they go home, to the pages they came from, and
// serve the owner again.
TEST(BigClass, BlocksFreedByAnotherThreadServeTheirOwnerAgain) {
  const size_t size = 384 * kKiB;
  const unsigned c = tray::size_class_of(size);
  std::vector<Block> blocks = allocate_from_pages(size, 64);
  const unsigned long long pages = tray_test::stats_now().classes[c].pages;
  const unsigned long long remote_before = tray_test::stats_now().remote_frees;
  std::atomic<size_t> bad{0};
  std::thread([&] {
    tray_free(tray_malloc(16));  // a heap of its own: batches, not single blocks
    for (const Block& b : blocks)
      if (!tray_test::free_checked(b)) bad.fetch_add(1);
  }).join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GE(tray_test::stats_now().remote_frees - remote_before, 60u);
  std::vector<Block> again = allocate_from_pages(size, 64);
  EXPECT_LE(tray_test::stats_now().classes[c].pages, pages);
  for (const Block& b : again) EXPECT_TRUE(tray_test::free_checked(b));
}

// realloc across every class boundary, up to the large blocks past the top class and down
// again, keeps the contents.
TEST(BigClass, ReallocAcrossEveryClassBoundaryKeepsTheContents) {
  std::vector<size_t> up;
  for (unsigned c = 0; c < tray::kSizeClassCount; ++c) {
    up.push_back(tray::class_size(c));
    up.push_back(tray::class_size(c) + 1);
  }
  up.push_back(3 * kMiB);
  std::vector<size_t> down(up.rbegin(), up.rend());
  for (std::vector<size_t>* sizes : {&up, &down}) {
    size_t held = sizes->front();
    auto* p = static_cast<unsigned char*>(tray_malloc(held));
    ASSERT_NE(p, nullptr);
    tray_test::fill_sequence(p, held, 7);
    for (size_t next : *sizes) {
      p = static_cast<unsigned char*>(tray_realloc(p, next));
      ASSERT_NE(p, nullptr) << next;
      ASSERT_TRUE(tray_test::sequence_intact(p, std::min(held, next), 7)) << held << " -> " << next;
      held = next;
      tray_test::fill_sequence(p, held, 7);
    }
    tray_free(p);
  }
}

// Aligned requests up to the top class and past it get their alignment, whatever serves them.
TEST(BigClass, AlignedRequestsUpToTheTopClass) {
  for (size_t alignment = 16; alignment <= 4 * kMiB; alignment *= 4) {
    for (size_t size : {size_t{100}, 129 * kKiB, 200 * kKiB, 1 * kMiB, 2 * kMiB, 2 * kMiB + 1}) {
      void* p = tray_aligned_alloc(alignment, size);
      ASSERT_NE(p, nullptr) << alignment << " " << size;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignment, 0u) << alignment << " " << size;
      EXPECT_GE(tray_usable_size(p), size);
      std::memset(p, 1, size);
      tray_free(p);
    }
  }
}

// A program heap's blocks of big classes go with the heap.
TEST(BigClass, AResetGivesBackAProgramHeapsBigBlocks) {
  tray_heap_t* heap = tray_heap_new();
  const size_t size = 640 * kKiB;
  const unsigned c = tray::size_class_of(size);
  const unsigned long long live_before = tray_test::stats_now().classes[c].live_blocks;
  size_t in_pages = 0;
  for (int i = 0; i < 40; ++i) {
    void* p = tray_heap_malloc(heap, size);
    ASSERT_NE(p, nullptr);
    std::memset(p, i, size);
    EXPECT_EQ(tray_heap_of(p), heap);
    in_pages += in_a_page(p) ? 1 : 0;
  }
  EXPECT_GT(in_pages, 30u);
  EXPECT_GE(tray_test::stats_now().classes[c].live_blocks, live_before + in_pages);
  tray_heap_reset(heap);
  EXPECT_EQ(tray_test::stats_now().classes[c].live_blocks, live_before);
  tray_heap_destroy(heap);
}

}  // namespace
