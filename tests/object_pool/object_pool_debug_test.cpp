// Debug mode of the pool headers: TRAY_OPTIONS parsing, the 0x1deadb0b fill of destroyed
// slots and dropped arena memory, and the check that catches writes after destroy.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <string>
#include <vector>

#include "tray/frame_arena.hpp"
#include "tray/object_pool.hpp"
#include "tray/pool_allocator.hpp"

namespace {

using tray::pool_detail::debug_option;

static_assert(debug_option("debug=1") == true);
static_assert(debug_option("debug=0") == false);
static_assert(!debug_option("").has_value());
static_assert(!debug_option("verbose=1,debug=yes").has_value());
static_assert(debug_option("verbose=1,debug=1,purge_delay=0") == true);
static_assert(debug_option("debug=1,debug=0") == false);  // the last one wins
static_assert(!debug_option("xdebug=1").has_value());

struct Record {
  uint64_t id;
  double values[5];
};
static_assert(sizeof(Record) == 48);

std::string hex(const void* address) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", address);
  return text;
}

// The 32-bit words of [from, to) of an object's bytes.
std::vector<uint32_t> words_of(const void* object, size_t from, size_t to) {
  std::vector<uint32_t> words((to - from) / 4);
  std::memcpy(words.data(), static_cast<const char*>(object) + from, words.size() * 4);
  return words;
}

TEST(PoolDebug, TrayOptionsTurnedDebugOn) { EXPECT_TRUE(tray::pool_debug_enabled()); }

TEST(PoolDebug, DestroyedSlotHoldsTheFillAfterTheLink) {
  tray::ObjectPool<Record> pool(4);
  Record* record = pool.create(Record{42, {1, 2, 3, 4, 5}});
  pool.destroy(record);
  // The pool's memory stays mapped, so reading the dead slot is safe here.
  for (uint32_t word : words_of(record, sizeof(void*), sizeof(Record))) {
    EXPECT_EQ(word, tray::kDestroyedFill);
  }
}

TEST(PoolDebug, ClearFillsEverySlotItEmpties) {
  tray::ObjectPool<Record> pool(4);
  Record* a = pool.create(Record{1, {}});
  Record* b = pool.create(Record{2, {}});
  pool.clear();
  for (const Record* dead : {a, b}) {
    for (uint32_t word : words_of(dead, sizeof(void*), sizeof(Record))) {
      EXPECT_EQ(word, tray::kDestroyedFill);
    }
  }
}

TEST(PoolDebug, ReuseOfAnIntactSlotIsAllowed) {
  tray::ObjectPool<Record> pool(4);
  Record* record = pool.create();
  pool.destroy(record);
  Record* again = pool.create(Record{7, {}});
  EXPECT_EQ(again, record);
  EXPECT_EQ(again->id, 7u);
}

TEST(PoolDebugDeathTest, WriteAfterDestroyIsCaughtWhenTheSlotIsReused) {
  tray::ObjectPool<Record> pool(4);
  Record* record = pool.create();
  pool.destroy(record);
  record->values[2] = 3.5;  // through a stale pointer
  EXPECT_DEATH((void)pool.create(),
               "tray::ObjectPool \\(sizeof\\(T\\) = 48\\): " + hex(record) +
                   " was written after it was destroyed");
}

TEST(PoolDebugDeathTest, ContainerNodeFreedTwiceIsCaught) {
  tray::PoolAllocator<int> alloc;
  int* node = alloc.allocate(1);
  alloc.deallocate(node, 1);
  EXPECT_DEATH(alloc.deallocate(node, 1), "double destroy of " + hex(node));
}

TEST(PoolDebug, ContainersRunCleanlyOverPoisonedNodes) {
  std::list<std::string, tray::PoolAllocator<std::string>> list;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 100; ++i) list.emplace_back(30, char('a' + i % 26));
    for (int i = 0; i < 60; ++i) list.pop_front();
  }
  EXPECT_EQ(list.size(), 120u);
  EXPECT_EQ(list.get_allocator().live_nodes(), 120u);
}

TEST(PoolDebug, ArenaResetFillsTheDroppedBytes) {
  tray::FrameArena arena(1024);
  auto* bytes = static_cast<unsigned char*>(arena.allocate(64, 16));
  std::memset(bytes, 0, 64);
  arena.reset();
  for (uint32_t word : words_of(bytes, 0, 64)) EXPECT_EQ(word, tray::kDestroyedFill);
}

}  // namespace

int main(int argc, char** argv) {
  // The headers read TRAY_OPTIONS once, when the first pool or arena is made: set it first.
  setenv("TRAY_OPTIONS", "debug=1", 1);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
