// The heap profile through the prefixed API: what the profile holds after known allocations
// and frees (every allocation sampled with prof_sample=1), blocks freed by other threads,
// large, aligned, zeroed and reallocated sampled blocks, the unbiased estimate at a real rate,
// the reuse of freed sampled blocks, the peak profile, and dump errors.
#include <errno.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "traymalloc.h"

namespace {

struct Entry {
  uint64_t count, bytes, total_count, total_bytes;
  size_t frames;
};

struct Profile {
  uint64_t rate = 0;
  Entry total{};
  std::vector<Entry> entries;
  bool has_maps = false;
};

Profile read_profile(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  Profile profile;
  EXPECT_TRUE(std::getline(in, line)) << path;
  const auto parse = [](const std::string& text, Entry* entry) {
    unsigned long long c, b, tc, tb;
    if (std::sscanf(text.c_str(), "%llu: %llu [%llu: %llu]", &c, &b, &tc, &tb) != 4) return false;
    *entry = Entry{c, b, tc, tb, 0};
    return true;
  };
  const std::string header = "heap profile: ";
  EXPECT_EQ(line.compare(0, header.size(), header), 0) << line;
  EXPECT_TRUE(parse(line.substr(header.size()), &profile.total)) << line;
  const size_t at = line.find("@ heap_v2/");
  EXPECT_NE(at, std::string::npos) << line;
  if (at != std::string::npos) profile.rate = std::stoull(line.substr(at + 10));
  while (std::getline(in, line)) {
    if (line == "MAPPED_LIBRARIES:") {
      profile.has_maps = std::getline(in, line) && line.find('-') != std::string::npos;
      break;
    }
    Entry entry;
    if (!parse(line, &entry)) continue;
    std::istringstream frames(line.substr(line.find('@') + 1));
    std::string frame;
    while (frames >> frame) ++entry.frames;
    profile.entries.push_back(entry);
  }
  return profile;
}

class ProfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = "/tmp/tray_prof_test." + std::to_string(getpid()) + ".heap";
    ASSERT_EQ(tray_option_set("prof", "1"), 0);
    ASSERT_EQ(tray_option_set("prof_sample", "1"), 0);  // every allocation
  }
  void TearDown() override {
    tray_option_set("prof", "0");
    tray_option_set("prof_peak", "0");
    std::remove(path_.c_str());
  }
  // Runs `body` on a new thread: its heap picks up the options on its first allocation.
  template <typename Body>
  static void on_fresh_thread(Body body) {
    std::thread(body).join();
  }
  Profile dump() {
    EXPECT_EQ(tray_prof_dump(path_.c_str()), 0);
    return read_profile(path_);
  }
  // A large block that realloc grows where it lies (or whose pages the kernel moves) is a new
  // allocation to the profile too: one allocated before profiling began is in it afterwards,
  // with its new size, and its data stays. `bytes`: the first size, the grown one and the
  // shrunk one.
  void expect_resized_block_sampled_at_new_size(const size_t (&bytes)[3]) {
    on_fresh_thread([&] {
      tray_free(tray_malloc(8));  // the thread's heap, which samples large requests
      ASSERT_EQ(tray_option_set("prof", "0"), 0);
      auto* block = static_cast<unsigned char*>(tray_malloc(bytes[0]));
      ASSERT_NE(block, nullptr);
      std::memset(block, 7, bytes[0]);
      ASSERT_EQ(tray_option_set("prof", "1"), 0);
      tray_free(tray_malloc(8));  // the heap picks up the options on a slow path
      const Profile before = dump();
      block = static_cast<unsigned char*>(tray_realloc(block, bytes[1]));
      ASSERT_NE(block, nullptr);
      EXPECT_EQ(block[bytes[0] - 1], 7) << "realloc kept the data";
      const Profile grown = dump();
      EXPECT_EQ(grown.total.count - before.total.count, 1u);
      EXPECT_EQ(grown.total.bytes - before.total.bytes, uint64_t{bytes[1]});
      block = static_cast<unsigned char*>(tray_realloc(block, bytes[2]));  // sampled, resized again
      const Profile shrunk = dump();
      EXPECT_EQ(shrunk.total.count - before.total.count, 1u) << "the old size left the profile";
      EXPECT_EQ(shrunk.total.bytes - before.total.bytes, uint64_t{bytes[2]});
      tray_free(block);
      EXPECT_EQ(dump().total.bytes, before.total.bytes);
    });
  }
  std::string path_;
};

TEST_F(ProfTest, RecordsEveryLiveSampleAndForgetsItAtFree) {
  const Profile before = dump();
  std::vector<void*> blocks;
  on_fresh_thread([&] {
    for (int i = 0; i < 100; ++i) blocks.push_back(tray_malloc(100));
  });
  Profile live = dump();
  EXPECT_EQ(live.rate, 1u);
  EXPECT_TRUE(live.has_maps);
  EXPECT_EQ(live.total.count - before.total.count, 100u);
  // Small samples are recorded at their class's block size (112 B), the bytes the sampler
  // counted for them.
  EXPECT_EQ(live.total.bytes - before.total.bytes, 100u * tray_usable_size(blocks[0]));
  bool deep = false;
  for (const Entry& entry : live.entries) deep |= entry.frames >= 3;
  EXPECT_TRUE(deep) << "stacks reach past the allocator";
  for (void* p : blocks) {
    EXPECT_GE(tray_usable_size(p), 100u);
    EXPECT_TRUE(tray_owns(p));
    std::memset(p, 0xab, 100);
    tray_free(p);  // freed by another thread than the one that allocated
  }
  const Profile after = dump();
  EXPECT_EQ(after.total.count, before.total.count);
  EXPECT_EQ(after.total.bytes, before.total.bytes);
  EXPECT_EQ(after.total.total_count - before.total.total_count, 100u) << "allocations stay counted";
}

TEST_F(ProfTest, LargeBlocksAreRecordedAndReallocatedAsNewSamples) {
  const Profile before = dump();
  std::vector<void*> blocks;
  on_fresh_thread([&] {
    // Large requests are sampled by the thread's heap, which its first small one makes.
    tray_free(tray_malloc(8));
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(tray_malloc(1 << 20));
      std::memset(blocks.back(), i + 1, 1 << 20);
    }
    blocks[0] = tray_realloc(blocks[0], 2 << 20);
  });
  ASSERT_NE(blocks[0], nullptr);
  EXPECT_EQ(static_cast<unsigned char*>(blocks[0])[(1 << 20) - 1], 1) << "realloc kept the data";
  Profile live = dump();
  EXPECT_EQ(live.total.count - before.total.count, 3u);
  EXPECT_EQ(live.total.bytes - before.total.bytes, uint64_t{4} << 20);
  for (void* p : blocks) tray_free(p);
  EXPECT_EQ(dump().total.bytes, before.total.bytes);
}

TEST_F(ProfTest, LargeBlocksResizedWithoutCopyAreSampledAtTheirNewSize) {
  expect_resized_block_sampled_at_new_size({size_t{5} << 20, size_t{9} << 20, size_t{8} << 20});
}

// A block in a span chunk that grows into the free pages after it, then gives some back.
TEST_F(ProfTest, SpanBlocksResizedInPlaceAreSampledAtTheirNewSize) {
  tray_trim();  // a fresh chunk: the pages after the block are free
  expect_resized_block_sampled_at_new_size({size_t{512} << 10, size_t{1} << 20, size_t{768} << 10});
}

TEST_F(ProfTest, SampledBlocksKeepAlignmentAndZeroing) {
  on_fresh_thread([] {
    for (size_t alignment : {16, 64, 256, 4096, 65536, 1 << 22}) {
      void* p = tray_aligned_alloc(alignment, 100);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignment, 0u) << alignment;
      tray_free(p);
    }
    for (int round = 0; round < 4; ++round) {
      auto* dirty = static_cast<unsigned char*>(tray_malloc(200));
      std::memset(dirty, 0xff, 200);
      tray_free(dirty);
      auto* clean = static_cast<unsigned char*>(tray_calloc(1, 200));
      for (int i = 0; i < 200; ++i) ASSERT_EQ(clean[i], 0) << i;
      tray_free(clean);
    }
  });
}

// At a real rate only some allocations are sampled; scaled the way pprof scales heap_v2
// profiles, the estimate must match what is live.
TEST_F(ProfTest, EstimateAtARealRateIsUnbiased) {
  ASSERT_EQ(tray_option_set("prof_sample", "4k"), 0);
  const Profile before = dump();
  constexpr int kBlocks = 200000;
  constexpr uint64_t kSize = 64;
  std::vector<void*> blocks(kBlocks);
  on_fresh_thread([&] {
    for (void*& p : blocks) p = tray_malloc(kSize);
  });
  const Profile live = dump();
  EXPECT_EQ(live.rate, 4096u);
  const double count = double(live.total.count - before.total.count);
  const double scale = 1 / -std::expm1(-double(kSize) / 4096);
  EXPECT_NEAR(count * scale, kBlocks, 0.1 * kBlocks);
  for (void* p : blocks) tray_free(p);
}

TEST_F(ProfTest, PeakProfileIsTheHighestLiveMoment) {
  ASSERT_EQ(tray_option_set("prof_peak", "1"), 0);
  std::vector<void*> blocks;
  on_fresh_thread([&] {
    for (int i = 0; i < 1000; ++i) blocks.push_back(tray_malloc(1000));
    for (void* p : blocks) tray_free(p);
    blocks.clear();
    for (int i = 0; i < 100; ++i) blocks.push_back(tray_malloc(1000));
  });
  ASSERT_EQ(tray_prof_dump_peak(path_.c_str()), 0);
  const Profile peak = read_profile(path_);
  // Copied each time the live estimate passes the last copy by 2%.
  EXPECT_GE(peak.total.count, 980u);
  EXPECT_LE(peak.total.count, 1000u + 100u);
  for (void* p : blocks) tray_free(p);
}

// Threads sample at once and free each other's sampled blocks, small and large (after a small
// one: large requests are sampled by the heap a small one gives the thread), while another
// thread dumps: the table ends empty and the counts add up.
TEST_F(ProfTest, ThreadsSampleAndFreeEachOthersBlocks) {
  const Profile before = dump();
  constexpr int kThreads = 4, kBlocks = 2000;
  std::vector<std::vector<void*>> blocks(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&blocks, t] {
      for (int i = 0; i < kBlocks; ++i) blocks[t].push_back(tray_malloc(i % 100 == 50 ? 200000 : 24 + i % 500));
    });
  }
  for (std::thread& thread : threads) thread.join();
  threads.clear();
  const Profile live = dump();
  EXPECT_EQ(live.total.count - before.total.count, uint64_t{kThreads} * kBlocks);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&blocks, t] {
      for (void* p : blocks[(t + 1) % kThreads]) tray_free(p);
    });
  }
  const std::string concurrent = path_ + ".concurrent";
  EXPECT_EQ(tray_prof_dump(concurrent.c_str()), 0);
  for (std::thread& thread : threads) thread.join();
  std::remove(concurrent.c_str());
  EXPECT_EQ(dump().total.count, before.total.count);
}

// A freed sampled block leaves the table at the next sample and only then goes back to be
// handed out again: rounds of allocating and freeing the same sizes reuse the blocks (none
// is kept for good), and the reused addresses are never recorded twice.
TEST_F(ProfTest, FreedSampledBlocksAreForgottenAndReused) {
  const Profile before = dump();
  constexpr int kRounds = 4, kBlocks = 300;
  std::vector<void*> first;
  size_t reused = 0;
  on_fresh_thread([&] {
    for (int round = 0; round < kRounds; ++round) {
      std::vector<void*> blocks;
      for (int i = 0; i < kBlocks; ++i) blocks.push_back(tray_malloc(48));
      if (round == 0) first = blocks;
      for (void* p : blocks) reused += std::find(first.begin(), first.end(), p) != first.end();
      for (void* p : blocks) tray_free(p);
    }
  });
  EXPECT_GE(reused - kBlocks, size_t{kBlocks} * (kRounds - 1) / 2) << "freed samples come back";
  const Profile after = dump();
  EXPECT_EQ(after.total.count, before.total.count);
  EXPECT_EQ(after.total.total_count - before.total.total_count, uint64_t{kRounds} * kBlocks);
}

TEST_F(ProfTest, DumpReportsTheFailedOpen) {
  EXPECT_EQ(tray_prof_dump("/nonexistent-directory/x.heap"), ENOENT);
}

}  // namespace
