// Frees from other threads: blocks gathered per owner on the freeing side, sent in batches,
// taken in by the owner on its slow path, or by whoever collects parked heaps. Every block must
// come home exactly once: a block lost in transit leaves its page in use for good (visible in
// the class's page count after a trim), a block delivered twice is handed out twice (visible
// as a broken fill pattern).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "heap/heap.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::Block;

// 6000 B requests take the 6 KiB class. After a trim, its page count is the number of pages
// holding live blocks: a block stranded on its way home keeps one more.
constexpr size_t kProbeBytes = 6000;

unsigned long long probe_class_pages() {
  const unsigned c = tray::size_class_of(kProbeBytes);
  return tray_test::stats_now().classes[c].pages;
}

std::vector<Block> allocate_probe_blocks(size_t count) {
  std::vector<Block> blocks;
  for (size_t i = 0; i < count; ++i) blocks.push_back(tray_test::allocate_filled(kProbeBytes));
  return blocks;
}

// Several threads free, interleaved, blocks of one owner that keeps allocating and freeing
// its own blocks meanwhile, so its slow path takes batches in while more arrive.
TEST(RemoteFree, ManySendersToOneOwner) {
  constexpr unsigned kSenders = 4;
  const size_t blocks_per_sender = tray_test::scaled(20000);
  tray_test::Rng rng(3);
  std::vector<std::vector<Block>> outgoing(kSenders);
  // Large blocks are not remote frees: they belong to no heap. A block of a big class may be
  // one (a class the owner asks for seldom, heap/tails.cpp): told by where it lies.
  size_t small_blocks = 0;
  for (size_t i = 0; i < blocks_per_sender * kSenders; ++i) {
    const Block block = tray_test::allocate_filled(tray_test::mixed_size(rng));
    ASSERT_NE(block.ptr, nullptr);
    outgoing[i % kSenders].push_back(block);
    if (tray::chunk_kind(block.ptr) == tray::kChunkSegment) ++small_blocks;
  }
  const unsigned long long remote_before = tray_test::stats_now().remote_frees;
  std::atomic<size_t> corrupt{0};
  std::atomic<unsigned> senders_done{0};
  std::vector<std::thread> senders;
  for (unsigned s = 0; s < kSenders; ++s) {
    senders.emplace_back([&, s] {
      tray_free(tray_malloc(16));  // a heap of its own: batches, not single blocks
      for (const Block& block : outgoing[s])
        if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
      senders_done.fetch_add(1);
    });
  }
  // The owner churns its own blocks while the batches land.
  std::vector<Block> own;
  while (senders_done.load() < kSenders) {
    for (int i = 0; i < 64; ++i) own.push_back(tray_test::allocate_filled(tray_test::mixed_size(rng)));
    for (const Block& block : own) EXPECT_TRUE(tray_test::free_checked(block));
    own.clear();
  }
  for (std::thread& sender : senders) sender.join();
  EXPECT_EQ(corrupt.load(), 0u);
  EXPECT_EQ(tray_test::stats_now().remote_frees - remote_before, small_blocks);
  // Every block came back: the memory serves the owner again without corruption.
  for (size_t i = 0; i < blocks_per_sender; ++i) {
    const Block block = tray_test::allocate_filled(tray_test::mixed_size(rng));
    ASSERT_NE(block.ptr, nullptr);
    own.push_back(block);
  }
  for (const Block& block : own) EXPECT_TRUE(tray_test::free_checked(block));
}

// A thread frees a few blocks of another heap (too few to fill a batch) and exits: its
// gathered batch must still reach the owner.
TEST(RemoteFree, SenderExitsWithBlocksInTransit) {
  tray_trim();
  const unsigned long long pages_before = probe_class_pages();
  std::vector<Block> blocks = allocate_probe_blocks(5);
  std::atomic<size_t> corrupt{0};
  std::thread([&] {
    tray_free(tray_malloc(16));
    for (const Block& block : blocks)
      if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
  }).join();
  EXPECT_EQ(corrupt.load(), 0u);
  tray_trim();  // takes the remote frees in and gives empty pages back
  EXPECT_EQ(probe_class_pages(), pages_before) << "blocks stranded in the exited sender";
}

// A sender frees, in turn, blocks of more owners than it has buckets, so that owners share a
// bucket and each free may find it gathering for another: the free of a foreign block tests
// only the bucket's target (remote.cpp), and every other case must leave through the general
// path and still get each block home once. Pages name their owner's bucket for the sender.
TEST(RemoteFree, OneSenderFreesInTurnToMoreOwnersThanBuckets) {
  constexpr unsigned kOwners = tray::kRemoteBuckets + 4;
  constexpr size_t kPerOwner = 40;
  tray_trim();
  const unsigned long long pages_before = probe_class_pages();
  std::vector<std::vector<Block>> owned(kOwners);
  std::atomic<unsigned> allocated{0};
  std::vector<std::thread> owners;
  for (unsigned o = 0; o < kOwners; ++o) {
    owners.emplace_back([&, o] {
      owned[o] = allocate_probe_blocks(kPerOwner);
      allocated.fetch_add(1);
      // Alive until all have allocated: each owner a heap of its own.
      while (allocated.load() < kOwners) std::this_thread::yield();
    });
  }
  for (std::thread& owner : owners) owner.join();
  std::vector<bool> bucket_taken(tray::kRemoteBuckets, false);
  bool shared = false;
  for (const std::vector<Block>& blocks : owned) {
    ASSERT_EQ(blocks.size(), kPerOwner);
    const tray::Page* page = tray::unit_page_of(blocks[0].ptr);
    ASSERT_NE(page->heap, nullptr);
    EXPECT_EQ(page->heap_bucket, tray::remote_bucket_of(page->heap));
    shared |= bucket_taken[page->heap_bucket];
    bucket_taken[page->heap_bucket] = true;
  }
  EXPECT_TRUE(shared) << "no two owners share a bucket";
  std::atomic<size_t> corrupt{0};
  std::thread([&] {
    tray_free(tray_malloc(16));  // a heap of its own: buckets
    for (size_t i = 0; i < kPerOwner; ++i)
      for (const std::vector<Block>& blocks : owned)
        if (!tray_test::free_checked(blocks[i])) corrupt.fetch_add(1);
  }).join();
  EXPECT_EQ(corrupt.load(), 0u);
  tray_trim();
  EXPECT_EQ(probe_class_pages(), pages_before) << "blocks lost between owners sharing a bucket";
}

// Blocks of a thread that has exited are freed by another: they land in a parked heap, which
// a trim (or a later thread) collects; a thread started afterwards adopts that heap and works.
TEST(RemoteFree, FreesIntoTheHeapOfAnExitedThread) {
  tray_trim();
  const unsigned long long pages_before = probe_class_pages();
  std::vector<Block> blocks;
  std::thread([&] { blocks = allocate_probe_blocks(300); }).join();
  ASSERT_EQ(blocks.size(), 300u);
  for (const Block& block : blocks) {
    ASSERT_NE(block.ptr, nullptr);
    EXPECT_TRUE(tray_test::free_checked(block));
  }
  tray_trim();
  EXPECT_EQ(probe_class_pages(), pages_before) << "pages of the parked heap not given back";
  std::atomic<size_t> corrupt{0};
  std::thread([&] {
    std::vector<Block> again = allocate_probe_blocks(300);
    for (const Block& block : again)
      if (block.ptr == nullptr || !tray_test::free_checked(block)) corrupt.fetch_add(1);
  }).join();
  EXPECT_EQ(corrupt.load(), 0u);
}

unsigned long long class_pages(size_t bytes) {
  return tray_test::stats_now().classes[tray::size_class_of(bytes)].pages;
}

// Blocks travel home as runs of one page (remote.cpp), and 16-byte blocks, too small to carry a
// run's header, alone. A sender frees whole pages of full (floating) 64-byte pages in order, so
// that runs span batches, with 16-byte blocks and blocks of a page further on slipped in
// between. A run cut wrong loses blocks (a page stays in use after the trim) or delivers some
// twice (the same address handed out twice, or a broken fill).
TEST(RemoteFree, RunsOfOnePageWithSingleBlocksBetween) {
  constexpr size_t kRunBytes = 64;
  constexpr size_t kLoneBytes = 16;
  tray_trim();
  const unsigned long long run_pages_before = class_pages(kRunBytes);
  const unsigned long long lone_pages_before = class_pages(kLoneBytes);
  const size_t per_page = tray::class_slab_bytes(tray::size_class_of(kRunBytes)) / kRunBytes;
  const size_t run_count = per_page * 4 + per_page / 3;
  std::vector<Block> runs, lone;
  for (size_t i = 0; i < run_count; ++i) runs.push_back(tray_test::allocate_filled(kRunBytes));
  for (size_t i = 0; i < run_count / 5; ++i) lone.push_back(tray_test::allocate_filled(kLoneBytes));
  std::vector<Block> order;
  size_t l = 0;
  for (size_t i = 0; i < run_count; ++i) {
    order.push_back(runs[i]);
    if (i % 5 == 2) order.push_back(lone[l++]);
    // A block of a page ahead, then one of this page again: the run must restart.
    if (i % 97 == 50 && i + per_page < run_count) {
      order.push_back(runs[i + per_page]);
      runs[i + per_page].ptr = nullptr;
    }
  }
  while (l < lone.size()) order.push_back(lone[l++]);
  std::atomic<size_t> corrupt{0};
  std::thread([&] {
    tray_free(tray_malloc(kRunBytes));  // a heap of its own: runs in buckets
    for (const Block& block : order)
      if (block.ptr != nullptr && !tray_test::free_checked(block)) corrupt.fetch_add(1);
  }).join();
  EXPECT_EQ(corrupt.load(), 0u);
  tray_trim();
  EXPECT_EQ(class_pages(kRunBytes), run_pages_before) << "a run lost blocks on its way home";
  EXPECT_EQ(class_pages(kLoneBytes), lone_pages_before);
  std::vector<Block> again;
  for (size_t i = 0; i < run_count; ++i) again.push_back(tray_test::allocate_filled(kRunBytes));
  std::vector<void*> addresses;
  for (const Block& block : again) addresses.push_back(block.ptr);
  std::sort(addresses.begin(), addresses.end());
  EXPECT_EQ(std::adjacent_find(addresses.begin(), addresses.end()), addresses.end())
      << "a block delivered twice was handed out twice";
  for (const Block& block : again) EXPECT_TRUE(tray_test::free_checked(block));
}

// A run's first block carries its header in the words after its link and free key, from 48
// bytes up the name of a run further down the chain, and from 112 bytes up, in a batch's newest
// run, the batch's newest runs (remote.cpp). A sender frees every other block of pages on
// either side of those sizes in random order, so that nearly every block starts a run of its
// own: a header written past the end of a block breaks the fill of the live block next to it,
// and a run cut wrong strands a page or hands a block out twice.
TEST(RemoteFree, RunHeadersStayInsideTheirBlocks) {
  tray_trim();
  for (const size_t bytes : {size_t{32}, size_t{48}, size_t{96}, size_t{112}}) {
    SCOPED_TRACE(bytes);
    const unsigned long long pages_before = class_pages(bytes);
    const size_t count = tray::class_slab_bytes(tray::size_class_of(bytes)) / bytes * 3;
    std::vector<Block> blocks, freed, kept;
    for (size_t i = 0; i < count; ++i) blocks.push_back(tray_test::allocate_filled(bytes));
    for (size_t i = 0; i < count; ++i) (i % 2 == 0 ? freed : kept).push_back(blocks[i]);
    tray_test::Rng rng(bytes);
    for (size_t i = freed.size() - 1; i > 0; --i) std::swap(freed[i], freed[rng.next() % (i + 1)]);
    std::atomic<size_t> corrupt{0};
    std::thread([&] {
      tray_free(tray_malloc(bytes));  // a heap of its own: runs in buckets
      for (const Block& block : freed)
        if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
    }).join();
    EXPECT_EQ(corrupt.load(), 0u);
    for (const Block& block : kept)
      EXPECT_TRUE(tray_test::pattern_intact(block.ptr, block.size)) << "a header overran its block";
    std::vector<Block> again;
    for (size_t i = 0; i < freed.size(); ++i) again.push_back(tray_test::allocate_filled(bytes));
    std::vector<void*> addresses;
    for (const Block& block : again) addresses.push_back(block.ptr);
    for (const Block& block : kept) addresses.push_back(block.ptr);
    std::sort(addresses.begin(), addresses.end());
    EXPECT_EQ(std::adjacent_find(addresses.begin(), addresses.end()), addresses.end())
        << "a block delivered twice was handed out twice";
    for (const Block& block : again) EXPECT_TRUE(tray_test::free_checked(block));
    for (const Block& block : kept) EXPECT_TRUE(tray_test::free_checked(block));
    tray_trim();
    EXPECT_EQ(class_pages(bytes), pages_before) << "a run lost blocks on its way home";
  }
}

// Pages whose blocks another thread freed in random order, and which went empty, hand their
// blocks out in address order again (page_recarve): kept as they came home, in runs spliced
// in the order the sender's batches and the owner's drain cut them, a producer whose consumer
// frees blocks in the order it was handed them saw that order turn random over the rounds.
TEST(RemoteFree, PagesEmptiedByAnotherThreadHandOutAscendingAddressesAgain) {
  constexpr size_t kBytes = 448;  // a class the test framework's own allocations seldom use
  const unsigned c = tray::size_class_of(kBytes);
  const size_t per_page = tray::class_blocks_per_page(c);
  const size_t block_bytes = tray::class_size(c);
  std::vector<void*> blocks;
  for (size_t i = 0; i < 3 * per_page; ++i) blocks.push_back(tray_malloc(kBytes));
  // The first two pages' worth, freed at random by a thread with buckets of its own.
  std::vector<void*> freed(blocks.begin(), blocks.begin() + 2 * per_page);
  tray_test::Rng rng(7);
  for (size_t i = freed.size() - 1; i > 0; --i) std::swap(freed[i], freed[rng.next() % (i + 1)]);
  std::thread([&] {
    tray_free(tray_malloc(kBytes));
    for (void* p : freed) tray_free(p);
  }).join();
  // A large allocation takes the thread's remote frees in: the pages they filled go empty.
  tray_free(tray_malloc(1 << 20));
  std::sort(freed.begin(), freed.end());
  std::vector<void*> again, reused;
  for (size_t i = 0; i < 3 * per_page; ++i) {
    again.push_back(tray_malloc(kBytes));
    if (std::binary_search(freed.begin(), freed.end(), again.back())) reused.push_back(again.back());
  }
  ASSERT_GE(reused.size(), per_page) << "the emptied pages were not allocated from again";
  size_t in_order = 0;
  for (size_t i = 1; i < reused.size(); ++i)
    in_order += static_cast<char*>(reused[i]) - static_cast<char*>(reused[i - 1]) == ptrdiff_t(block_bytes);
  EXPECT_GE(in_order * 10, (reused.size() - 1) * 9) << in_order << " of " << reused.size() - 1
                                                     << " blocks came right after the one before";
  for (void* p : again) tray_free(p);
  for (size_t i = 2 * per_page; i < blocks.size(); ++i) tray_free(blocks[i]);
}

// A consumer: a thread that never allocates, and only frees blocks other threads made. It gets
// a heap at its first such free, so that its frees travel in batches; when it exits, what its
// buckets still hold must reach the owner.
TEST(RemoteFree, ConsumerThatNeverAllocatedSendsEverythingHome) {
  tray_trim();
  const unsigned long long pages_before = probe_class_pages();
  const unsigned long long exited_before = tray_test::stats_now().threads_exited;
  std::vector<Block> blocks = allocate_probe_blocks(tray::kRemoteBatchBlocks * 3 + 7);
  std::atomic<size_t> corrupt{0};
  std::thread([&] {
    for (const Block& block : blocks)
      if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
  }).join();
  EXPECT_EQ(corrupt.load(), 0u);
  EXPECT_EQ(tray_test::stats_now().threads_exited - exited_before, 1u)
      << "the consumer got no heap of its own";
  tray_trim();
  EXPECT_EQ(probe_class_pages(), pages_before) << "blocks stranded in the exited consumer";
}

// An owner that stops allocating (larson_server's main thread fills the tables, then only
// joins its workers) takes in what others freed into its heap when it frees a block of
// another heap: that is one of its own slow paths. Before, those blocks, and the pages they
// kept in use, waited on its remote stack until the thread allocated again or exited.
TEST(RemoteFree, OwnerThatOnlyFreesTakesItsStackInOnAForeignFree) {
  tray_trim();
  const unsigned long long pages_before = probe_class_pages();
  // 600 blocks of 6 KiB: pages well past the 1 MiB of empty pages a heap may keep.
  std::vector<Block> blocks = allocate_probe_blocks(600);
  Block foreign{};
  std::atomic<size_t> corrupt{0};
  std::thread([&] {
    foreign = tray_test::allocate_filled(64);
    for (const Block& block : blocks)
      if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
  }).join();  // its exit sends its buckets: every block now waits on this thread's stack
  EXPECT_EQ(corrupt.load(), 0u);
  const unsigned long long in_transit = probe_class_pages();
  ASSERT_GE(in_transit, pages_before + 50) << "the blocks were taken in before the test looked";
  ASSERT_NE(foreign.ptr, nullptr);
  EXPECT_TRUE(tray_test::free_checked(foreign));  // this thread allocates nothing in between
  EXPECT_LE(probe_class_pages(), pages_before + (in_transit - pages_before) / 2)
      << "the remote stack was not taken in on the foreign free";
}

// Allocates blocks of `bytes` until the class takes a page from the pool: the slow path that
// sends the thread's buckets and looks at the owners it sends to. Returns the blocks.
std::vector<Block> allocate_until_a_page_is_taken(size_t bytes) {
  const unsigned c = tray::size_class_of(bytes);
  const unsigned long long pages = tray_test::stats_now().classes[c].pages;
  std::vector<Block> blocks;
  while (tray_test::stats_now().classes[c].pages == pages && blocks.size() < 100000)
    blocks.push_back(tray_test::allocate_filled(bytes));
  return blocks;
}

// An owner that stopped taking its stack in (here: blocked in join, as larson_server's main
// thread is) held the pages whose every block others freed until it ran again. A sender about
// to take a page looks at the owners it sends to, and after kRemoteReclaimIdleMs without a
// take-in by one of them gives that owner's pages whose blocks all wait on its stack to the
// pool; runs of the pages that still hold a live block go back to the owner.
TEST(RemoteFree, PagesOfAnIdleOwnerWhoseBlocksAllCameBackGoToThePool) {
  tray_trim();
  const unsigned long long pages_before = probe_class_pages();
  std::vector<Block> blocks = allocate_probe_blocks(600);  // floating pages, and a head page
  const Block kept = tray_test::allocate_filled(kProbeBytes);
  const unsigned long long pages_full = probe_class_pages();
  ASSERT_GE(pages_full, pages_before + 50);
  std::atomic<size_t> corrupt{0};
  unsigned long long pages_after_look = 0;
  std::thread([&] {
    for (const Block& block : blocks)
      if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
    // 4 KiB blocks: a class of its own, nowhere near the probe's.
    std::vector<Block> own = allocate_until_a_page_is_taken(4000);  // the first look
    std::this_thread::sleep_for(std::chrono::milliseconds(4 * tray::kRemoteReclaimIdleMs + 5));
    for (const Block& block : allocate_until_a_page_is_taken(4000)) own.push_back(block);
    pages_after_look = probe_class_pages();
    for (const Block& block : own)
      if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
  }).join();
  EXPECT_EQ(corrupt.load(), 0u);
  EXPECT_LE(pages_after_look, pages_before + 2)
      << "the idle owner kept pages whose blocks were all freed (" << pages_full << " before)";
  // The owner's own block, and the page it lives on, are untouched.
  EXPECT_TRUE(tray_test::free_checked(kept));
  tray_trim();
  EXPECT_EQ(probe_class_pages(), pages_before);
}

// A stack of more runs than one look walks (kRemoteReclaimRuns): each look chains what it
// walked into a run per page and puts the rest back behind it, so later looks reach the
// rest, and the pages still go once all their blocks wait.
TEST(RemoteFree, AnIdleOwnersStackLongerThanALookIsTakenInSeveralLooks) {
  constexpr size_t kBytes = 48;
  const unsigned c = tray::size_class_of(kBytes);
  const size_t count = 3 * tray::kRemoteReclaimRuns + 7 * tray::class_blocks_per_page(c);
  tray_trim();
  const unsigned long long pages_before = tray_test::stats_now().classes[c].pages;
  std::vector<Block> blocks;
  for (size_t i = 0; i < count; ++i) blocks.push_back(tray_test::allocate_filled(kBytes));
  std::atomic<size_t> corrupt{0};
  unsigned long long pages_after_looks = 0;
  std::thread([&] {
    // One block of each page in turn: consecutive frees never share a page, so every block
    // is a run of its own. (Pages of this class are one 64 KiB unit, aligned.)
    std::map<uintptr_t, std::vector<Block>> by_page;
    for (const Block& block : blocks) by_page[reinterpret_cast<uintptr_t>(block.ptr) >> 16].push_back(block);
    for (bool any = true; any;) {
      any = false;
      for (auto& [unit, page_blocks] : by_page) {
        if (page_blocks.empty()) continue;
        any = true;
        if (!tray_test::free_checked(page_blocks.back())) corrupt.fetch_add(1);
        page_blocks.pop_back();
      }
    }
    std::vector<Block> own;
    for (int look = 0; look < 12; ++look) {
      for (const Block& block : allocate_until_a_page_is_taken(4000)) own.push_back(block);
      std::this_thread::sleep_for(std::chrono::milliseconds(2 * tray::kRemoteReclaimIdleMs + 1));
    }
    pages_after_looks = tray_test::stats_now().classes[c].pages;
    for (const Block& block : own)
      if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
  }).join();
  EXPECT_EQ(corrupt.load(), 0u);
  EXPECT_LE(pages_after_looks, pages_before + 1) << "pages whose blocks all wait stayed";
  tray_trim();
  EXPECT_EQ(tray_test::stats_now().classes[c].pages, pages_before);
}

// Only floating pages (full, out of their queue) may change hands: the page a class allocates
// from is the owner's fast path's, even once every block of it waits on the stack.
TEST(RemoteFree, ThePageAClassAllocatesFromStaysWithItsOwner) {
  constexpr size_t kBytes = 8192;
  const unsigned c = tray::size_class_of(kBytes);
  std::vector<Block> blocks = allocate_until_a_page_is_taken(kBytes);
  const unsigned long long pages = tray_test::stats_now().classes[c].pages;
  Block first_of_page = blocks.back();
  blocks.pop_back();
  for (const Block& block : blocks) EXPECT_TRUE(tray_test::free_checked(block));
  blocks.assign(1, first_of_page);
  while (blocks.size() < tray::class_blocks_per_page(c)) blocks.push_back(tray_test::allocate_filled(kBytes));
  ASSERT_EQ(tray_test::stats_now().classes[c].pages, pages) << "the page is not dry yet";
  std::atomic<size_t> corrupt{0};
  unsigned long long pages_after_look = 0;
  std::thread([&] {
    for (const Block& block : blocks)
      if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
    std::vector<Block> own = allocate_until_a_page_is_taken(4000);
    std::this_thread::sleep_for(std::chrono::milliseconds(4 * tray::kRemoteReclaimIdleMs + 5));
    for (const Block& block : allocate_until_a_page_is_taken(4000)) own.push_back(block);
    pages_after_look = tray_test::stats_now().classes[c].pages;
    for (const Block& block : own)
      if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
  }).join();
  EXPECT_EQ(pages_after_look, pages);
  std::vector<Block> again;
  for (size_t i = 0; i < blocks.size(); ++i) again.push_back(tray_test::allocate_filled(kBytes));
  for (const Block& block : again) EXPECT_TRUE(tray_test::free_checked(block));
  EXPECT_EQ(corrupt.load(), 0u);
}

// Owners that pause (sleep, as a thread waiting for work or for a core does) while senders
// free their blocks and take pages: the pages of a paused owner change hands under it, and
// when it runs again it must find its queues, its stack and every block it still holds as
// they should be. Blocks are checked by pattern; pages by count once everything is freed.
TEST(RemoteFree, PagesChangeHandsWhileTheirOwnersPause) {
  constexpr unsigned kOwners = 2;
  constexpr unsigned kSenders = 2;
  const size_t rounds = tray_test::scaled(400);
  tray_trim();
  const unsigned long long pages_before = probe_class_pages();
  std::vector<std::vector<Block>> mailbox(kOwners * kSenders);
  std::vector<std::atomic<bool>> full(kOwners * kSenders);
  std::atomic<unsigned> owners_done{0};
  std::atomic<size_t> corrupt{0};
  std::vector<std::thread> threads;
  for (unsigned o = 0; o < kOwners; ++o) {
    threads.emplace_back([&, o] {
      tray_test::Rng rng(o + 1);
      std::vector<Block> held;  // blocks the owner frees itself, later, in random order
      for (size_t round = 0; round < rounds; ++round) {
        for (unsigned s = 0; s < kSenders; ++s) {
          const unsigned box = o * kSenders + s;
          if (full[box].load(std::memory_order_acquire)) continue;
          for (int i = 0; i < 64; ++i) mailbox[box].push_back(tray_test::allocate_filled(kProbeBytes));
          full[box].store(true, std::memory_order_release);
        }
        for (int i = 0; i < 16; ++i) held.push_back(tray_test::allocate_filled(i % 2 ? 3000 : 100));
        while (held.size() > 48) {
          const size_t victim = rng.next() % held.size();
          if (!tray_test::free_checked(held[victim])) corrupt.fetch_add(1);
          held[victim] = held.back();
          held.pop_back();
        }
        if (round % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      }
      for (const Block& block : held)
        if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
      owners_done.fetch_add(1);
      // Park the heap only once the senders are done with its blocks: they free into it.
      while (owners_done.load() < kOwners + kSenders) std::this_thread::yield();
    });
  }
  for (unsigned s = 0; s < kSenders; ++s) {
    threads.emplace_back([&, s] {
      std::vector<Block> own;  // pages of a class of its own, taken now and then
      for (;;) {
        bool any = false;
        for (unsigned o = 0; o < kOwners; ++o) {
          const unsigned box = o * kSenders + s;
          if (!full[box].load(std::memory_order_acquire)) continue;
          any = true;
          for (const Block& block : mailbox[box])
            if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
          mailbox[box].clear();
          full[box].store(false, std::memory_order_release);
        }
        if (!any && owners_done.load() >= kOwners) break;
        // Between mailboxes, work of its own: it takes pages, and so looks at its owners.
        own.push_back(tray_test::allocate_filled(4000));
        if (own.size() == 512) {  // 2 MiB: past what a heap keeps of empty pages
          for (const Block& block : own)
            if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
          own.clear();
        }
      }
      for (const Block& block : own)
        if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
      owners_done.fetch_add(1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::vector<Block>& blocks : mailbox)
    for (const Block& block : blocks)
      if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
  EXPECT_EQ(corrupt.load(), 0u);
  tray_trim();
  EXPECT_EQ(probe_class_pages(), pages_before) << "a page lost its count, or a block its way";
}

// Owners and senders at once, both ways, with threads replaced while blocks are in flight
// (the pattern of a server handing requests between worker threads).
TEST(RemoteFree, ThreadsReplacedWhileBlocksMoveBothWays) {
  constexpr unsigned kPairs = 2;
  const size_t rounds = tray_test::scaled(40);
  std::vector<std::vector<Block>> mailbox(kPairs * 2);
  std::atomic<size_t> corrupt{0};
  for (size_t round = 0; round < rounds; ++round) {
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < kPairs * 2; ++t) {
      threads.emplace_back([&, t, round] {
        tray_test::Rng rng(round * 31 + t);
        // Free what the previous round's thread of the other side left here.
        for (const Block& block : mailbox[t])
          if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
        mailbox[t].clear();
        for (int i = 0; i < 500; ++i) mailbox[t].push_back(tray_test::allocate_filled(tray_test::mixed_size(rng)));
      });
    }
    for (std::thread& thread : threads) thread.join();
    // Swap the mailboxes so each thread of the next round frees blocks of an exited one.
    for (unsigned t = 0; t < kPairs; ++t) std::swap(mailbox[t], mailbox[t + kPairs]);
  }
  for (const std::vector<Block>& blocks : mailbox)
    for (const Block& block : blocks)
      if (!tray_test::free_checked(block)) corrupt.fetch_add(1);
  EXPECT_EQ(corrupt.load(), 0u);
}

}  // namespace
