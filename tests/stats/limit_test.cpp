// The memory limit through the prefixed API: the options, the fail action (NULL and ENOMEM,
// then allocations again after frees, nothing lost), the soft action (memory given back at
// once) and what the statistics say of it.
#include <errno.h>

#include <string>
#include <vector>

#include "platform/os.hpp"
#include "support.hpp"
#include "traymalloc.h"

#include "limit_blocks.hpp"

namespace {

using tray_test::kMiB;

tray_stats stats_now() {
  tray_stats s{};
  s.version = TRAY_STATS_VERSION;
  EXPECT_EQ(tray_stats_get(&s), 0);
  return s;
}

// Sets the limit for a test's scope, from a process that holds as little as it can.
struct Limit {
  Limit(const char* bytes, const char* action) {
    tray_trim();
    EXPECT_EQ(tray_option_set("memory_limit_action", action), 0);
    EXPECT_EQ(tray_option_set("memory_limit", bytes), 0);
  }
  ~Limit() {
    tray_option_set("memory_limit", "0");
    tray_option_set("memory_limit_action", "soft");
  }
};

using limit_blocks::Block;
using limit_blocks::fill;
using limit_blocks::intact;

// Sizes 1 KiB..1 MiB, the same for every run.
size_t next_size(uint64_t& seed) {
  seed = seed * 6364136223846793005ull + 1442695040888963407ull;
  return 1024 + size_t(seed >> 33) % ((1 << 20) - 1024 + 1);
}

TEST(MemoryLimit, OptionsTakeSizesAndActions) {
  {
    Limit limit("3g", "fail");
    const tray_stats s = stats_now();
    EXPECT_EQ(s.memory_limit_bytes, 3ull << 30);
    EXPECT_EQ(s.memory_limit_from_cgroup, 0u);
    EXPECT_EQ(s.memory_limit_fail, 1u);
  }
  EXPECT_EQ(tray_option_set("memory_limit", "12q"), EINVAL);
  EXPECT_EQ(tray_option_set("memory_limit_action", "hard"), EINVAL);
  EXPECT_EQ(stats_now().memory_limit_bytes, 0u);
}

TEST(MemoryLimit, FailReturnsNullThenWorksAfterFrees) {
  std::vector<Block> blocks;
  blocks.reserve(4096);  // libc's memory: the test's own list is not the allocator's to count
  const tray_stats before = stats_now();
  Limit limit("64m", "fail");
  uint64_t seed = 1;
  size_t live = 0;
  const int error = limit_blocks::allocate_until_null(
      blocks, live, [](size_t size) { return tray_malloc(size); }, [&seed] { return next_size(seed); },
      [](size_t bytes) { return bytes >= 256 * kMiB; });
  ASSERT_LT(live, 256 * kMiB) << "the limit never stopped an allocation";
  EXPECT_EQ(error, ENOMEM);
  EXPECT_GE(live, 48 * kMiB);
  EXPECT_LE(live, 64 * kMiB);
  EXPECT_LE(stats_now().committed_bytes, 64 * kMiB);
  // Half the blocks freed and allocated again, and one in eight freed for good: the same sizes
  // need not land as they did (a big class's first blocks are large blocks until the class
  // gets a page, which depends on the clock), so the eighth leaves room for that.
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i % 2 != 0 && i % 8 != 1) continue;
    tray_free(blocks[i].p);
    blocks[i].p = nullptr;
  }
  for (size_t i = 0; i < blocks.size(); i += 2) {
    blocks[i].p = static_cast<unsigned char*>(tray_malloc(blocks[i].size));
    ASSERT_NE(blocks[i].p, nullptr) << "block " << i << " of " << blocks[i].size << " bytes";
    fill(blocks[i], i);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].p != nullptr) {
      EXPECT_TRUE(intact(blocks[i], i)) << "block " << i;
    }
  }
  const tray_stats s = stats_now();
  EXPECT_GT(s.memory_limit_reached, before.memory_limit_reached);
  EXPECT_GT(s.memory_limit_failures, before.memory_limit_failures);
  for (const Block& b : blocks) tray_free(b.p);
}

// Under a soft limit every allocation succeeds, and memory goes back to the OS as soon as it is
// freed: committed bytes right after the frees are what a trim would leave, not the freed
// blocks kept for their delay as without a limit.
size_t committed_after_free(const char* bytes) {
  Limit limit(bytes, "soft");
  std::vector<void*> blocks;
  for (size_t i = 0; i < 160; ++i) {
    void* p = tray_malloc(i % 2 == 0 ? 256 << 10 : 16 << 10);
    EXPECT_NE(p, nullptr);
    memset(p, 1, i % 2 == 0 ? 256 << 10 : 16 << 10);
    blocks.push_back(p);
  }
  for (void* p : blocks) tray_free(p);
  return stats_now().committed_bytes;
}

TEST(MemoryLimit, SoftGivesBackAtOnce) {
  const size_t unlimited = committed_after_free("0");
  const tray_stats before = stats_now();
  const size_t limited = committed_after_free("16m");
  const tray_stats s = stats_now();
  EXPECT_GT(s.memory_limit_reached, before.memory_limit_reached);
  EXPECT_EQ(s.memory_limit_failures, before.memory_limit_failures);
  EXPECT_GT(unlimited, 16 * kMiB);
  EXPECT_LT(limited, 16 * kMiB);
}

// What was freed before the limit is reached, and kept for reuse (pages gone back to the
// pool, below the limit's margin), goes back to the OS when an allocation reaches it.
TEST(MemoryLimit, ReachingItGivesBackWhatIsKept) {
  Limit limit("16m", "soft");
  std::vector<void*> blocks;
  for (size_t i = 0; i < 160; ++i) {
    blocks.push_back(tray_malloc(64 << 10));
    ASSERT_NE(blocks.back(), nullptr);
    memset(blocks.back(), 1, 64 << 10);
  }
  for (void* p : blocks) tray_free(p);
  blocks.clear();
  const tray_stats before = stats_now();
  // Large blocks, which take none of the pool's units.
  for (size_t i = 0; i < 8 && stats_now().memory_limit_reached == before.memory_limit_reached; ++i) {
    blocks.push_back(tray_malloc(3 << 20));
    ASSERT_NE(blocks.back(), nullptr);
    memset(blocks.back(), 1, 3 << 20);
  }
  const tray_stats s = stats_now();
  for (void* p : blocks) tray_free(p);
  EXPECT_GT(s.memory_limit_reached, before.memory_limit_reached);
  EXPECT_GT(s.memory_limit_released_bytes, before.memory_limit_released_bytes);
}

// The dump names the limit, its action and where it came from.
TEST(MemoryLimit, DumpShowsTheLimit) {
  Limit limit("96m", "fail");
  std::string text;
  auto append = [](void* context, const char* piece, size_t length) {
    static_cast<std::string*>(context)->append(piece, length);
  };
  ASSERT_EQ(tray_stats_print(append, &text, TRAY_STATS_TEXT), 0);
  EXPECT_NE(text.find("memory limit: 96.0 MiB (fail, from memory_limit)"), std::string::npos) << text;
  std::string json;
  ASSERT_EQ(tray_stats_print(append, &json, TRAY_STATS_JSON), 0);
  EXPECT_NE(json.find("\"memory_limit\":{\"bytes\":100663296,\"source\":\"memory_limit\",\"action\":\"fail\""),
            std::string::npos)
      << json;
}

}  // namespace
