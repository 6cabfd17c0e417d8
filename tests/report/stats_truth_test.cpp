// The per-class statistics against counted truth. The fast paths count nothing: a heap counts
// the blocks of its slots' lists once handed out and its own frees when a slow path looks at
// their page, and a dump adds what the calling thread's heaps have not counted yet
// (lib/report/report.cpp). So a single-threaded program reads every column exactly, other
// threads' counts may trail while they run (never lead, never fall), and all is exact again
// once they end.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "support.hpp"

namespace {

// One request size per class, so that the requested bytes (an estimate that takes each
// refill's request as standing for its blocks) are exact.
constexpr size_t kSizes[] = {16, 40, 100, 200, 520, 1000, 3000, 12000, 40000};
constexpr unsigned kKinds = sizeof kSizes / sizeof kSizes[0];

unsigned class_index(const tray_stats& stats, size_t size) {
  for (unsigned c = 0; c < stats.class_count; ++c)
    if (stats.classes[c].block_bytes >= size) return c;
  ADD_FAILURE() << "no class for " << size;
  return 0;
}

struct Truth {
  uint64_t allocations[kKinds] = {};
  uint64_t frees[kKinds] = {};
  uint64_t peak_live[kKinds] = {};
  uint64_t live(unsigned k) const { return allocations[k] - frees[k]; }
};

// What a run of random mallocs and frees over kSizes did, counted by the caller.
class Workload {
 public:
  explicit Workload(uint64_t seed) : rng_(seed) {}
  void step(Truth& truth) {
    const unsigned k = unsigned(rng_() % kKinds);
    std::vector<void*>& held = held_[k];
    // Grow three times in four while a class holds few blocks, else shrink as often as grow:
    // live counts rise to new peaks, fall back, and pages fill, empty and go back.
    const bool grow = held.empty() || rng_() % 4 != 0 || (held.size() > 3000 && rng_() % 2 == 0);
    if (grow && held.size() < 6000) {
      void* p = tray_malloc(kSizes[k]);
      ASSERT_NE(p, nullptr);
      held.push_back(p);
      ++truth.allocations[k];
      truth.peak_live[k] = std::max(truth.peak_live[k], truth.live(k));
    } else if (!held.empty()) {
      const size_t i = rng_() % held.size();
      tray_free(held[i]);
      held[i] = held.back();
      held.pop_back();
      ++truth.frees[k];
    }
  }
  void free_all(Truth& truth) {
    for (unsigned k = 0; k < kKinds; ++k) {
      for (void* p : held_[k]) tray_free(p);
      truth.frees[k] += held_[k].size();
      held_[k].clear();
    }
  }

 private:
  std::mt19937_64 rng_;
  std::vector<void*> held_[kKinds];
};

// Every column of the classes of kSizes against the truth counted since `base`.
void expect_exact(const tray_stats& base, const tray_stats& now, const Truth& truth, const char* when) {
  for (unsigned k = 0; k < kKinds; ++k) {
    const unsigned c = class_index(now, kSizes[k]);
    const tray_class_stats& was = base.classes[c];
    const tray_class_stats& is = now.classes[c];
    SCOPED_TRACE(testing::Message() << when << ", requests of " << kSizes[k] << " B");
    EXPECT_EQ(is.allocations - was.allocations, truth.allocations[k]);
    EXPECT_EQ(is.frees - was.frees, truth.frees[k]);
    EXPECT_EQ(is.live_blocks - was.live_blocks, truth.live(k));
    EXPECT_EQ(is.requested_bytes - was.requested_bytes, truth.allocations[k] * kSizes[k]);
    // The peak is sampled when the class takes a page and at each dump: never above the
    // truth, and short of it by less than a page's blocks.
    EXPECT_LE(is.peak_live_blocks, was.live_blocks + truth.peak_live[k]);
    EXPECT_GE(is.peak_live_blocks + is.blocks_per_page, was.live_blocks + truth.peak_live[k]);
    EXPECT_GE(is.pages * is.blocks_per_page, is.live_blocks);
  }
}

TEST(StatsTruth, ASingleThreadReadsEveryColumnExactly) {
  const tray_stats base = tray_test::stats_now();
  Truth truth;
  Workload work(7);
  for (int round = 1; round <= 6; ++round) {
    for (int i = 0; i < 40000; ++i) {
      work.step(truth);
      if (testing::Test::HasFatalFailure()) return;
    }
    expect_exact(base, tray_test::stats_now(), truth, "mid-run");
    // A trim hands the slots' blocks back to their pages: the counts must not move.
    if (round == 3) {
      tray_trim();
      expect_exact(base, tray_test::stats_now(), truth, "after a trim");
    }
  }
  work.free_all(truth);
  expect_exact(base, tray_test::stats_now(), truth, "all freed");
}

// Counts that only a look at another thread's heap would see trail while it runs: by at most
// the blocks of the pages its heap holds in the class (those its slot may have handed out,
// and those its thread may have freed into them); never above the truth, never down from one
// dump to the next. Once it ends (its heap parked) they are exact.
TEST(StatsTruth, OtherThreadsTrailWithinTheirPagesAndNeverLead) {
  constexpr int kThreads = 3;
  const tray_stats base = tray_test::stats_now();
  std::vector<Truth> truths(kThreads);
  std::vector<Workload> works;
  for (int t = 0; t < kThreads; ++t) works.emplace_back(100 + t);
  std::barrier<> paused(kThreads + 1);
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!done.load()) {
        for (int i = 0; i < 20000; ++i) works[t].step(truths[t]);
        paused.arrive_and_wait();  // main reads the statistics while this thread is idle
        paused.arrive_and_wait();
      }
      works[t].free_all(truths[t]);
    });
  }
  tray_stats previous = base;
  for (int round = 0; round < 5; ++round) {
    paused.arrive_and_wait();
    const tray_stats now = tray_test::stats_now();
    for (unsigned k = 0; k < kKinds; ++k) {
      const unsigned c = class_index(now, kSizes[k]);
      const tray_class_stats& was = base.classes[c];
      const tray_class_stats& is = now.classes[c];
      uint64_t allocations = 0, frees = 0;
      for (const Truth& truth : truths) {
        allocations += truth.allocations[k];
        frees += truth.frees[k];
      }
      const uint64_t bound = is.pages * is.blocks_per_page;
      SCOPED_TRACE(testing::Message() << "round " << round << ", requests of " << kSizes[k] << " B");
      EXPECT_LE(is.allocations - was.allocations, allocations);
      EXPECT_LE(allocations - (is.allocations - was.allocations), bound);
      EXPECT_LE(is.frees - was.frees, frees);
      EXPECT_LE(frees - (is.frees - was.frees), bound);
      const int64_t live_error = int64_t(is.live_blocks - was.live_blocks) - int64_t(allocations - frees);
      EXPECT_LE(uint64_t(live_error < 0 ? -live_error : live_error), bound);
      EXPECT_GE(is.allocations, previous.classes[c].allocations);
      EXPECT_GE(is.frees, previous.classes[c].frees);
    }
    previous = now;
    if (round == 4) done.store(true);
    paused.arrive_and_wait();
  }
  for (auto& thread : threads) thread.join();
  Truth total;
  for (const Truth& truth : truths)
    for (unsigned k = 0; k < kKinds; ++k) {
      total.allocations[k] += truth.allocations[k];
      total.frees[k] += truth.frees[k];
    }
  const tray_stats after = tray_test::stats_now();
  for (unsigned k = 0; k < kKinds; ++k) {
    const unsigned c = class_index(after, kSizes[k]);
    SCOPED_TRACE(testing::Message() << "threads ended, requests of " << kSizes[k] << " B");
    EXPECT_EQ(after.classes[c].allocations - base.classes[c].allocations, total.allocations[k]);
    EXPECT_EQ(after.classes[c].frees - base.classes[c].frees, total.frees[k]);
    EXPECT_EQ(after.classes[c].live_blocks, base.classes[c].live_blocks);
    EXPECT_EQ(after.classes[c].requested_bytes - base.classes[c].requested_bytes,
              total.allocations[k] * kSizes[k]);
  }
}

// A thread reads its own heap's uncounted blocks; another does not. The counts a dump
// reports never fall, whichever thread dumps.
TEST(StatsTruth, CountsNeverFallWhicheverThreadDumps) {
  std::vector<void*> held;
  for (int i = 0; i < 300; ++i) held.push_back(tray_malloc(200));
  const tray_stats mine = tray_test::stats_now();
  tray_stats theirs;
  std::thread([&] { theirs = tray_test::stats_now(); }).join();
  const unsigned c = class_index(mine, 200);
  EXPECT_GE(theirs.classes[c].allocations, mine.classes[c].allocations);
  EXPECT_GE(theirs.classes[c].frees, mine.classes[c].frees);
  EXPECT_GE(theirs.classes[c].requested_bytes, mine.classes[c].requested_bytes);
  for (void* p : held) tray_free(p);
}

}  // namespace
