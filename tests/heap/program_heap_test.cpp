// Program heaps (tray_heap_*) through the prefixed API: blocks stay in their heap, a reset or
// destroy frees every block and gives the memory back, many threads allocate into one heap,
// a default heap applies to its thread alone, and frees from other threads before a destroy
// cannot reach the pages after it.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::kMiB;

// Small blocks of every class up to 4 KiB, and a few large ones.
size_t size_of(size_t i) { return i % 97 == 0 ? 200 * 1024 + i : 16 + (i * 37) % 4000; }

std::vector<void*> fill(tray_heap_t* heap, size_t count) {
  std::vector<void*> blocks;
  for (size_t i = 0; i < count; ++i) {
    void* p = tray_heap_malloc(heap, size_of(i));
    EXPECT_NE(p, nullptr);
    std::memset(p, int(i), 16);
    blocks.push_back(p);
  }
  return blocks;
}

unsigned long long live_small() {
  const tray_stats s = tray_test::stats_now();
  unsigned long long live = 0;
  for (unsigned c = 0; c < s.class_count; ++c) live += s.classes[c].live_blocks;
  return live;
}

TEST(ProgramHeap, BlocksBelongToTheirHeap) {
  tray_heap_t* a = tray_heap_new();
  tray_heap_t* b = tray_heap_new();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<void*> in_a = fill(a, 3000);
  std::vector<void*> in_b = fill(b, 3000);
  for (void* p : in_a) EXPECT_EQ(tray_heap_of(p), a);
  for (void* p : in_b) EXPECT_EQ(tray_heap_of(p), b);
  void* plain = tray_malloc(64);
  EXPECT_EQ(tray_heap_of(plain), nullptr);
  tray_free(plain);
  // The small blocks a frees, b never hands out: a keeps their pages, which still hold a's
  // other blocks. (A freed large block's memory is anybody's, as an emptied page is.)
  std::set<void*> freed;
  for (size_t i = 0; i < in_a.size(); i += 2) {
    if (size_of(i) <= 4096) freed.insert(in_a[i]);
    tray_free(in_a[i]);
  }
  for (void* p : fill(b, 3000)) EXPECT_EQ(freed.count(p), 0u) << p << " came from heap a";
  tray_heap_destroy(a);
  tray_heap_destroy(b);
}

TEST(ProgramHeap, ResetFreesEveryBlockAndGivesThePagesBack) {
  tray_heap_t* heap = tray_heap_new();
  const unsigned long long live_before = live_small();
  const tray_stats before = tray_test::stats_now();
  fill(heap, 200000);
  // Large blocks, which a reset frees one by one (the fill's blocks of 200 KiB are those of a
  // big class, but for the first few: heap/tails.cpp).
  for (size_t i = 0; i < 16; ++i) ASSERT_NE(tray_heap_malloc(heap, (size_t{3} << 20) + i), nullptr);
  const tray_stats full = tray_test::stats_now();
  EXPECT_GT(live_small(), live_before + 190000);
  EXPECT_GE(full.large.live_blocks, before.large.live_blocks + 16);
  tray_heap_reset(heap);
  const tray_stats after = tray_test::stats_now();
  EXPECT_LE(live_small(), live_before + 16);
  EXPECT_EQ(after.large.live_blocks, before.large.live_blocks);
  unsigned long long pages_full = 0, pages_after = 0;
  for (unsigned c = 0; c < full.class_count; ++c) {
    pages_full += full.classes[c].pages;
    pages_after += after.classes[c].pages;
  }
  // A reset keeps at most what a thread heap keeps (1 MiB: 16 pages of one unit).
  EXPECT_LT(pages_after + 200, pages_full);
  // The heap is usable again, and its memory went to the pool, where tray_trim finds it.
  for (void* p : fill(heap, 1000)) EXPECT_EQ(tray_heap_of(p), heap);
  tray_heap_destroy(heap);
  tray_trim();
  EXPECT_LT(tray_test::stats_now().committed_bytes, full.committed_bytes - 100 * kMiB);
}

TEST(ProgramHeap, ManyThreadsAllocateIntoOneHeap) {
  tray_heap_t* heap = tray_heap_new();
  constexpr unsigned kThreads = 8;
  std::vector<std::vector<void*>> kept(kThreads);
  std::atomic<unsigned> wrong{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < 20000; ++i) {
        void* p = tray_heap_malloc(heap, 16 + (i * 13 + t) % 700);
        if (tray_heap_of(p) != heap) wrong.fetch_add(1);
        if (i % 4 == 0) tray_free(p);  // freed by its own thread, another heap its default
        else kept[t].push_back(p);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0u);
  // Half of what each thread kept, freed by a thread that did not allocate it.
  std::thread([&] {
    for (auto& blocks : kept)
      for (size_t i = 0; i < blocks.size(); i += 2) tray_free(blocks[i]);
  }).join();
  const unsigned long long live_before_reset = live_small();
  tray_heap_reset(heap);
  EXPECT_GE(live_before_reset - live_small(), kThreads * 20000 * 3 / 8 - 16);
  tray_heap_destroy(heap);
}

TEST(ProgramHeap, DefaultHeapAppliesToItsThreadOnly) {
  tray_heap_t* heap = tray_heap_new();
  EXPECT_EQ(tray_heap_set_default(heap), nullptr);
  void* mine = tray_malloc(100);
  void* zeroed = tray_calloc(10, 10);
  void* aligned = tray_aligned_alloc(256, 256);
  void* large = tray_malloc(300000);
  void* other = nullptr;
  std::thread([&] { other = tray_malloc(100); }).join();
  EXPECT_EQ(tray_heap_set_default(nullptr), heap);
  void* after = tray_malloc(100);
  EXPECT_EQ(tray_heap_of(mine), heap);
  EXPECT_EQ(tray_heap_of(zeroed), heap);
  EXPECT_EQ(tray_heap_of(aligned), heap);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(aligned) % 256, 0u);
  EXPECT_EQ(tray_heap_of(large), heap);
  EXPECT_EQ(tray_heap_of(other), nullptr);
  EXPECT_EQ(tray_heap_of(after), nullptr);
  tray_free(other);
  tray_free(after);
  tray_free(mine);
  tray_heap_destroy(heap);  // zeroed, aligned and large go with it
}

TEST(ProgramHeap, DestroyingTheDefaultHeapGivesTheThreadItsOwnBack) {
  tray_heap_t* heap = tray_heap_new();
  tray_heap_set_default(heap);
  void* p = tray_malloc(64);
  EXPECT_EQ(tray_heap_of(p), heap);
  tray_heap_destroy(heap);
  void* q = tray_malloc(64);
  EXPECT_EQ(tray_heap_of(q), nullptr);
  EXPECT_EQ(tray_heap_set_default(nullptr), nullptr);
  tray_free(q);
}

TEST(ProgramHeap, ReallocKeepsABlockInItsHeapAndMovesOthersIn) {
  tray_heap_t* heap = tray_heap_new();
  auto* p = static_cast<char*>(tray_heap_malloc(heap, 100));
  std::memset(p, 7, 100);
  p = static_cast<char*>(tray_realloc(p, 5000));  // plain realloc: a block of the heap stays one
  EXPECT_EQ(tray_heap_of(p), heap);
  p = static_cast<char*>(tray_realloc(p, 2 * kMiB));
  EXPECT_EQ(tray_heap_of(p), heap);
  p = static_cast<char*>(tray_realloc(p, 8 * kMiB));  // moved by the kernel, still the heap's
  EXPECT_EQ(tray_heap_of(p), heap);
  EXPECT_EQ(p[99], 7);
  auto* q = static_cast<char*>(tray_malloc(100));
  std::memset(q, 9, 100);
  q = static_cast<char*>(tray_heap_realloc(heap, q, 100));  // fits where it is, moves anyway
  EXPECT_EQ(tray_heap_of(q), heap);
  EXPECT_EQ(q[99], 9);
  auto* r = static_cast<char*>(tray_heap_realloc(heap, nullptr, 10));
  EXPECT_EQ(tray_heap_of(r), heap);
  const tray_stats before = tray_test::stats_now();
  tray_heap_reset(heap);
  EXPECT_EQ(tray_test::stats_now().large.live_blocks, before.large.live_blocks - 1);
  tray_heap_destroy(heap);
}

TEST(ProgramHeap, DestroyAfterFreesFromOtherThreads) {
  for (int round = 0; round < 20; ++round) {
    tray_heap_t* heap = tray_heap_new();
    std::vector<void*> blocks = fill(heap, 5000);
    // Freed by threads that go on allocating and freeing their own blocks: no bucket of
    // theirs may still hold one of the heap's blocks when its pages change hands.
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        for (size_t i = t; i < blocks.size(); i += 4) tray_free(blocks[i]);
      });
    }
    for (std::thread& thread : threads) thread.join();
    tray_heap_destroy(heap);
    // The pages went to the pool; others take them now, and must find them whole.
    std::vector<tray_test::Block> others;
    for (size_t i = 0; i < 5000; ++i) others.push_back(tray_test::allocate_filled(16 + i % 2000));
    for (const tray_test::Block& block : others) ASSERT_TRUE(tray_test::free_checked(block));
  }
}

TEST(ProgramHeap, APartOutlivesItsThread) {
  tray_heap_t* heap = tray_heap_new();
  std::vector<void*> blocks;
  for (int t = 0; t < 50; ++t) {
    std::thread([&] {
      for (int i = 0; i < 100; ++i) blocks.push_back(tray_heap_malloc(heap, 48));
    }).join();
  }
  for (void* p : blocks) ASSERT_EQ(tray_heap_of(p), heap);
  // Threads that ended left their parts to the next; the heap's count says how many are bound.
  const tray_stats s = tray_test::stats_now();
  EXPECT_LT(s.heaps_created, 200u);
  for (size_t i = 0; i < blocks.size(); i += 3) tray_free(blocks[i]);
  tray_heap_destroy(heap);
}

TEST(ProgramHeap, ADestroyedHeapsPagesServeTheThreadsNextHeap) {
  std::thread([] {
    // A class no other test here allocates from, so that nothing else moves its page count.
    constexpr size_t kSize = 100000;
    auto pages_of_class = [] {
      const tray_stats s = tray_test::stats_now();
      for (unsigned c = 0; c < s.class_count; ++c)
        if (s.classes[c].block_bytes >= kSize) return s.classes[c].pages;
      return 0ull;
    };
    tray_heap_t* first = tray_heap_new();
    void* p = tray_heap_malloc(first, kSize);
    const unsigned long long pages = pages_of_class();
    tray_heap_destroy(first);
    EXPECT_EQ(pages_of_class(), pages);  // kept for the thread's next heap, not in the pool
    tray_heap_t* next = tray_heap_new();
    EXPECT_EQ(tray_heap_malloc(next, kSize), p);  // the same page, carved afresh
    tray_heap_destroy(next);
    // What the thread keeps for its next heap goes back with a trim (and when it ends).
    tray_trim();
    EXPECT_EQ(pages_of_class(), pages - 1);
  }).join();
}

// A destroy gives what it freed back to the OS at once, not after the purge delay: whether or
// not a purger thread runs (this test's process may have one from earlier tests, the fresh
// thread's heap is destroyed by another thread).
TEST(ProgramHeap, ADestroyGivesItsMemoryBackAtOnce) {
  if (!tray_test::kResidentBoundsHold) GTEST_SKIP() << "resident sizes mean nothing here";
  for (const bool from_another_thread : {false, true}) {
    SCOPED_TRACE(from_another_thread ? "filled by another thread" : "filled by this thread");
    const size_t before = tray_test::resident_bytes();
    tray_heap_t* heap = tray_heap_new();
    ASSERT_NE(heap, nullptr);
    auto fill_it = [heap] {
      for (size_t i = 0, bytes = 0; bytes < 96 * kMiB; ++i) {
        const size_t size = size_of(i);
        void* p = tray_heap_malloc(heap, size);
        ASSERT_NE(p, nullptr);
        std::memset(p, 0x5a, size);
        bytes += size;
      }
    };
    if (from_another_thread) std::thread(fill_it).join();
    else fill_it();
    ASSERT_GE(tray_test::resident_bytes(), before + 80 * kMiB);
    tray_heap_destroy(heap);
    EXPECT_LE(tray_test::resident_bytes(), before + tray_test::rss_slack(before))
        << "resident before " << before / kMiB << " MiB, after the destroy "
        << tray_test::resident_bytes() / kMiB << " MiB";
  }
}

TEST(ProgramHeap, ManyHeapsComeAndGo) {
  const unsigned long long heaps_before = tray_test::stats_now().heaps_created;
  for (int i = 0; i < 2000; ++i) {
    tray_heap_t* heap = tray_heap_new();
    for (int j = 0; j < 50; ++j) ASSERT_NE(tray_heap_malloc(heap, 32 + j * 8), nullptr);
    if (i % 2 == 0) tray_heap_reset(heap);
    tray_heap_destroy(heap);
  }
  // Destroyed heaps' parts serve the next heaps.
  EXPECT_LE(tray_test::stats_now().heaps_created, heaps_before + 2);
}

TEST(ProgramHeap, StatisticsHaveALinePerLiveHeap) {
  tray_heap_t* heap = tray_heap_new();
  // 989 blocks of the classes up to 4 KiB and 11 large ones (above the classes).
  for (size_t i = 0; i < 989; ++i) ASSERT_NE(tray_heap_malloc(heap, 16 + (i * 37) % 4000), nullptr);
  for (size_t i = 0; i < 11; ++i) ASSERT_NE(tray_heap_malloc(heap, (size_t{3} << 20) + i), nullptr);
  std::string dump;
  tray_stats_print([](void* context, const char* text, size_t length) {
    static_cast<std::string*>(context)->append(text, length);
  }, &dump, TRAY_STATS_TEXT);
  EXPECT_NE(dump.find("heap #"), std::string::npos) << dump;
  // 1000 blocks, of which 11 are large.
  EXPECT_NE(dump.find("): 989 live blocks"), std::string::npos) << dump;
  EXPECT_NE(dump.find(", large 11 ("), std::string::npos) << dump;
  std::string json;
  tray_stats_print([](void* context, const char* text, size_t length) {
    static_cast<std::string*>(context)->append(text, length);
  }, &json, TRAY_STATS_JSON);
  EXPECT_NE(json.find("\"heaps\":[{\"serial\":"), std::string::npos) << json;
  tray_heap_destroy(heap);
  std::string after;
  tray_stats_print([](void* context, const char* text, size_t length) {
    static_cast<std::string*>(context)->append(text, length);
  }, &after, TRAY_STATS_TEXT);
  EXPECT_EQ(after.find("heap #"), std::string::npos) << after;
}

TEST(ProgramHeap, ForkWithALiveHeap) {
  if (tray_test::kThreadSanitizer) GTEST_SKIP() << "TSan does not follow fork";
  tray_heap_t* heap = tray_heap_new();
  std::vector<void*> blocks = fill(heap, 2000);
  // Another thread holds a part of the heap when the fork comes.
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop.load()) tray_free(tray_heap_malloc(heap, 64));
  });
  const pid_t pid = fork();
  if (pid == 0) {
    int status = 0;
    for (void* p : fill(heap, 2000)) status |= tray_heap_of(p) != heap;
    for (size_t i = 0; i < blocks.size(); i += 2) tray_free(blocks[i]);
    tray_heap_reset(heap);
    status |= tray_heap_of(tray_heap_malloc(heap, 10)) != heap;
    tray_heap_destroy(heap);
    _exit(status);
  }
  stop.store(true);
  busy.join();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  tray_heap_destroy(heap);
}

// Rounds of a job system: workers fill a frame heap together (small and large blocks, some
// freed by other workers, some by realloc), a level heap lives across frames, and between
// frames, while the workers wait, the main thread checks every block, resets the frame heap,
// and now and then destroys the level heap and makes another.
TEST(ProgramHeap, FramesOfAJobSystem) {
  constexpr unsigned kWorkers = 4;
  constexpr int kFrames = 30;
  tray_heap_t* frame = tray_heap_new();
  tray_heap_t* level = tray_heap_new();
  struct Kept {
    unsigned char* p;
    size_t size;
    unsigned char fill;
    tray_heap_t* heap;
  };
  std::vector<std::vector<Kept>> kept(kWorkers);
  // Per frame parity, a block of the level heap per worker, freed by the next worker in the
  // next frame.
  std::vector<void*> handed[2] = {std::vector<void*>(kWorkers), std::vector<void*>(kWorkers)};
  std::atomic<int> frame_go{-1};
  std::atomic<unsigned> done{0};
  std::vector<std::thread> workers;
  for (unsigned w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      for (int f = 0; f < kFrames; ++f) {
        while (frame_go.load(std::memory_order_acquire) != f) std::this_thread::yield();
        tray_heap_t* previous = nullptr;
        if (w % 2 == 0) previous = tray_heap_set_default(frame);  // half use the default
        for (size_t i = 0; i < 3000; ++i) {
          const size_t size = i % 500 == 0 ? 150000 + i : 8 + (i * 7 + w) % 1500;
          tray_heap_t* into = i % 10 == 0 ? level : frame;
          auto* p = static_cast<unsigned char*>(w % 2 == 0 && into == frame ? tray_malloc(size)
                                                                            : tray_heap_malloc(into, size));
          const auto fill = static_cast<unsigned char>(w * 31 + i);
          std::memset(p, fill, size);
          if (i % 7 == 0) {
            p = static_cast<unsigned char*>(tray_realloc(p, size + 64));
            std::memset(p, fill, size + 64);
            kept[w].push_back({p, size + 64, fill, into});
          } else if (i % 5 == 0) {
            tray_free(p);
          } else {
            kept[w].push_back({p, size, fill, into});
          }
        }
        void*& older = handed[(f + 1) % 2][(w + 1) % kWorkers];
        if (older != nullptr) tray_free(older);
        older = nullptr;
        handed[f % 2][w] = tray_heap_malloc(level, 64);
        if (w % 2 == 0) tray_heap_set_default(previous);
        done.fetch_add(1, std::memory_order_acq_rel);
      }
    });
  }
  for (int f = 0; f < kFrames; ++f) {
    done.store(0);
    frame_go.store(f, std::memory_order_release);
    while (done.load(std::memory_order_acquire) != kWorkers) std::this_thread::yield();
    for (auto& blocks : kept) {
      for (const Kept& block : blocks) {
        ASSERT_EQ(tray_heap_of(block.p), block.heap);
        for (size_t i = 0; i < block.size; i += 61) ASSERT_EQ(block.p[i], block.fill);
      }
    }
    tray_heap_reset(frame);
    for (auto& blocks : kept) {
      std::erase_if(blocks, [&](const Kept& block) { return block.heap == frame; });
      if (f % 10 == 9) blocks.clear();
    }
    if (f % 10 == 9) {
      tray_heap_destroy(level);  // with the blocks handed on in this frame
      for (void*& p : handed[f % 2]) p = nullptr;
      level = tray_heap_new();
    }
  }
  for (std::thread& worker : workers) worker.join();
  tray_heap_destroy(frame);
  tray_heap_destroy(level);
}

using ProgramHeapDeath = ::testing::Test;

void* volatile g_kept;  // blocks allocated and kept, so that the heap's pages fill

TEST(ProgramHeapDeath, ADestroyedHandleStopsTheProgram) {
  if (tray_test::kThreadSanitizer) GTEST_SKIP() << "death tests fork, which TSan does not support";
  tray_heap_t* heap = tray_heap_new();
  tray_heap_destroy(heap);
  EXPECT_DEATH(tray_free(tray_heap_malloc(heap, 10)),
               "tray_heap_malloc of 0x[0-9a-f]+: not a live heap");
}

TEST(ProgramHeapDeath, AllocatingIntoADefaultThatAnotherThreadDestroyed) {
  if (tray_test::kThreadSanitizer) GTEST_SKIP() << "death tests fork, which TSan does not support";
  EXPECT_DEATH(
      {
        tray_heap_t* heap = tray_heap_new();
        tray_heap_set_default(heap);
        tray_free(tray_malloc(64));
        std::thread([heap] { tray_heap_destroy(heap); }).join();
        for (int i = 0; i < 100000; ++i) g_kept = tray_malloc(64);
      },
      "allocation into a destroyed heap");
}

}  // namespace
