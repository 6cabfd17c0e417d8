// Statistics through the prefixed API: counters that reconcile under known single- and
// multi-threaded workloads, and dumps that parse back.
#include <pthread.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support.hpp"

namespace {

// The class that serves `size`: the smallest block size that holds it.
const tray_class_stats& class_for(const tray_stats& stats, size_t size) {
  for (unsigned c = 0; c < stats.class_count; ++c)
    if (stats.classes[c].block_bytes >= size) return stats.classes[c];
  ADD_FAILURE() << "no class for " << size;
  return stats.classes[0];
}

void expect_reconciled(const tray_stats& stats) {
  uint64_t reserved = 0;
  for (unsigned c = 0; c < stats.class_count; ++c) {
    const tray_class_stats& entry = stats.classes[c];
    EXPECT_EQ(entry.allocations - entry.frees, entry.live_blocks) << "class " << entry.block_bytes;
    EXPECT_LE(entry.live_blocks, entry.pages * entry.blocks_per_page) << "class " << entry.block_bytes;
    EXPECT_GE(entry.peak_live_blocks, entry.live_blocks);
    EXPECT_GE(entry.peak_pages, entry.pages);
    reserved += entry.pages * entry.page_bytes;
  }
  EXPECT_LE(reserved, stats.committed_bytes);
  EXPECT_LE(stats.committed_bytes, stats.mapped_bytes);
  EXPECT_EQ(stats.large.allocations - stats.large.frees, stats.large.live_blocks);
}

TEST(Stats, BlocksHeldShowUpInTheirClass) {
  constexpr size_t kCount = 3000;
  constexpr size_t kSize = 200;
  const tray_stats before = tray_test::stats_now();
  std::vector<void*> blocks;
  for (size_t i = 0; i < kCount; ++i) blocks.push_back(tray_malloc(kSize));
  const tray_stats during = tray_test::stats_now();
  const tray_class_stats& was = class_for(before, kSize);
  const tray_class_stats& now = class_for(during, kSize);
  EXPECT_EQ(now.block_bytes, 224u);
  EXPECT_EQ(now.live_blocks, was.live_blocks + kCount);
  EXPECT_EQ(now.allocations, was.allocations + kCount);
  EXPECT_EQ(now.requested_bytes, was.requested_bytes + kCount * kSize);
  EXPECT_GE(now.pages * now.blocks_per_page, now.live_blocks);
  // The peak is sampled whenever the class takes a page, so it trails by less than a page.
  EXPECT_GE(now.peak_live_blocks + now.blocks_per_page, was.live_blocks + kCount);
  expect_reconciled(during);
  for (void* p : blocks) tray_free(p);
  const tray_stats after = tray_test::stats_now();
  EXPECT_EQ(class_for(after, kSize).live_blocks, was.live_blocks);
  EXPECT_EQ(class_for(after, kSize).frees, was.frees + kCount);
  expect_reconciled(after);
}

TEST(Stats, ThreadsAndRemoteFreesReconcileOnceQuiet) {
  const tray_stats before = tray_test::stats_now();
  constexpr int kThreads = 4;
  constexpr int kBlocks = 20000;
  std::vector<std::vector<void*>> made(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kBlocks; ++i) made[t].push_back(tray_malloc(size_t(8 + (i * 7) % 900)));
    });
  }
  for (auto& thread : threads) thread.join();
  threads.clear();
  // Each thread frees the blocks of the next one: every free is a remote free.
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (void* p : made[(t + 1) % kThreads]) tray_free(p);
    });
  }
  for (auto& thread : threads) thread.join();
  const tray_stats after = tray_test::stats_now();
  expect_reconciled(after);
  uint64_t allocations = 0, frees = 0;
  for (unsigned c = 0; c < after.class_count; ++c) {
    allocations += after.classes[c].allocations - before.classes[c].allocations;
    frees += after.classes[c].frees - before.classes[c].frees;
  }
  EXPECT_EQ(allocations, uint64_t(kThreads) * kBlocks);
  EXPECT_EQ(frees, uint64_t(kThreads) * kBlocks);
  // A freeing thread may adopt the parked heap that owns what it frees, and free locally.
  EXPECT_LE(after.remote_frees - before.remote_frees, uint64_t(kThreads) * kBlocks);
  // The freeing threads never allocated, but got heaps to gather their remote frees in.
  EXPECT_EQ(after.threads_exited - before.threads_exited, uint64_t(kThreads) * 2);
}

TEST(Stats, OsCallsAndMemoryAreCounted) {
  void* big = tray_malloc(size_t{8} << 20);
  void* small = tray_malloc(64);
  ASSERT_NE(big, nullptr);
  const tray_stats stats = tray_test::stats_now();
  EXPECT_GT(stats.os_mmap, 0u);
  EXPECT_GE(stats.mapped_bytes, size_t{8} << 20);
  EXPECT_GT(stats.resident_bytes, 0u);
  EXPECT_GT(stats.metadata_bytes, 0u);
  EXPECT_GE(stats.segments, 1u);
  EXPECT_GE(stats.large.peak_bytes, size_t{8} << 20);
  tray_free(big);
  tray_free(small);
}

std::string print(unsigned flags) {
  std::string out;
  auto append = [](void* context, const char* text, size_t length) {
    static_cast<std::string*>(context)->append(text, length);
  };
  EXPECT_EQ(tray_stats_print(append, &out, flags), 0);
  return out;
}

TEST(Stats, TextDumpHasARowPerUsedClass) {
  std::vector<void*> blocks;
  for (int i = 0; i < 500; ++i) blocks.push_back(tray_malloc(3000));  // class 3 KiB
  const std::string text = print(TRAY_STATS_TEXT);
  EXPECT_EQ(text.rfind("traymalloc: stats: pid=", 0), 0u) << text;
  bool found = false;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    char unit[8];
    unsigned long long block = 0, per_page = 0, live = 0;
    if (std::sscanf(line.c_str(), " %llu %7s %llu %llu", &block, unit, &per_page, &live) == 4 &&
        std::strcmp(unit, "KiB") == 0 && block == 3) {
      found = true;
      EXPECT_EQ(per_page, 21u);
      EXPECT_GE(live, 500u);
    }
  }
  EXPECT_TRUE(found) << text;
  EXPECT_NE(text.find("\n  memory: mapped "), std::string::npos);
  for (void* p : blocks) tray_free(p);
  EXPECT_EQ(tray_stats_print(nullptr, nullptr, 7), EINVAL);
}

// A strict JSON reader, enough to prove that the dump is well-formed (the format test with
// Python's json module runs under ctest label preload).
class JsonChecker {
 public:
  explicit JsonChecker(const std::string& text) : s_(text) {}
  bool document() { return value() && (skip(), i_ == s_.size()); }
  int objects = 0;

 private:
  void skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  bool string() {
    if (!eat('"')) return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\' || static_cast<unsigned char>(s_[i_]) < 0x20) return false;
      ++i_;
    }
    return eat('"');
  }
  bool number() {
    skip();
    const size_t start = i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.')) ++i_;
    return i_ > start && std::isdigit(static_cast<unsigned char>(s_[start]));
  }
  bool value() {
    skip();
    if (i_ >= s_.size()) return false;
    if (s_[i_] == '{') {
      ++i_, ++objects;
      if (eat('}')) return true;
      do {
        if (!string() || !eat(':') || !value()) return false;
      } while (eat(','));
      return eat('}');
    }
    if (s_[i_] == '[') {
      ++i_;
      if (eat(']')) return true;
      do {
        if (!value()) return false;
      } while (eat(','));
      return eat(']');
    }
    if (s_[i_] == '"') return string();
    return number();
  }
  const std::string& s_;
  size_t i_ = 0;
};

TEST(Stats, JsonDumpIsOneWellFormedLine) {
  const std::string json = print(TRAY_STATS_JSON);
  ASSERT_FALSE(json.empty());
  EXPECT_EQ(json.back(), '\n');
  EXPECT_EQ(json.find('\n'), json.size() - 1) << "one dump, one line";
  JsonChecker checker(json);
  EXPECT_TRUE(checker.document()) << json;
  // the dump, its classes, large/process/memory_limit/huge_pages/os_calls
  EXPECT_EQ(checker.objects, 1 + 64 + 5);
  EXPECT_NE(json.find("\"huge_pages\":{\"thp\":\""), std::string::npos);
  EXPECT_EQ(json.rfind("{\"traymalloc_stats\":2,", 0), 0u);
  EXPECT_NE(json.find("\"block_bytes\":131072,"), std::string::npos);
}

// stats_interval=1: a JSON dump a second in the stats file, written by the purger's thread
// while the program sleeps (one allocation after setting it starts that thread).
TEST(Stats, IntervalAppendsDumpsWhileIdle) {
  char path[] = "/tmp/tray_stats_interval_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(tray_option_set("stats_file", path), 0);
  ASSERT_EQ(tray_option_set("stats_format", "json"), 0);
  ASSERT_EQ(tray_option_set("stats_interval", "1"), 0);
  tray_free(tray_malloc(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(2600));
  ASSERT_EQ(tray_option_set("stats_interval", "0"), 0);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path);
  size_t dumps = 0;
  for (size_t at = text.str().find("\"reason\":\"interval\""); at != std::string::npos;
       at = text.str().find("\"reason\":\"interval\"", at + 1))
    ++dumps;
  EXPECT_GE(dumps, 2u) << text.str().substr(0, 200);
  EXPECT_LE(dumps, 3u);
}

// Seconds are whole and not negative.
TEST(Stats, IntervalRejectsBadValues) {
  EXPECT_EQ(tray_option_set("stats_interval", "-1"), EINVAL);
  EXPECT_EQ(tray_option_set("stats_interval", "1.5"), EINVAL);
  EXPECT_EQ(tray_option_set("stats_interval", ""), EINVAL);
  EXPECT_EQ(tray_option_set("stats_interval", "30"), 0);
  EXPECT_EQ(tray_option_set("stats_interval", "0"), 0);
}

// A thread cancelled while it dumps (a write to stderr is a cancellation point) must not leave
// the dump in progress for good: every later dump would wait for it. The dump holds
// cancellation off, as glibc's malloc_stats does; the thread is cancelled after it.
TEST(Stats, ACancelledDumpLeavesNoDumpInProgress) {
  EXPECT_EXIT(
      {
        alarm(10);  // a dump left in progress makes the second one spin: fail, do not hang
        pthread_t thread;
        const auto cancelled_dump = [](void*) -> void* {
          pthread_cancel(pthread_self());  // pending: it acts at the first cancellation point
          tray_stats_print(nullptr, nullptr, TRAY_STATS_TEXT);
          pthread_testcancel();
          return nullptr;
        };
        if (pthread_create(&thread, nullptr, cancelled_dump, nullptr) != 0) _exit(3);
        void* result = nullptr;
        pthread_join(thread, &result);
        if (result != PTHREAD_CANCELED) _exit(4);  // it was cancelled, after the dump
        std::string text;
        const auto append = [](void* out, const char* data, size_t length) {
          static_cast<std::string*>(out)->append(data, length);
        };
        _exit(tray_stats_print(append, &text, TRAY_STATS_TEXT) == 0 && !text.empty() ? 0 : 5);
      },
      testing::ExitedWithCode(0), "");
}

}  // namespace
