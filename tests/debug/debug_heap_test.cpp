// Program heaps in debug mode: what a reset or destroy frees is freed memory like any other,
// filled with the freed pattern (small blocks) or inaccessible (large ones), and freeing it
// again is a double free. The binary turns debug mode on before its first allocation.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>

#include "support.hpp"
#include "traymalloc.h"

namespace {

const bool g_debug_on = tray_option_set("debug", "1") == 0;

uint32_t word_at(const void* p, size_t offset) {
  uint32_t word;
  std::memcpy(&word, static_cast<const char*>(p) + offset, sizeof word);
  return word;
}

class DebugHeap : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(g_debug_on) << "debug mode could not be set before the first allocation";
  }
};

class DebugHeapDeath : public DebugHeap {
 protected:
  void SetUp() override {
    DebugHeap::SetUp();
    if (tray_test::kThreadSanitizer) GTEST_SKIP() << "death tests fork, which TSan does not support";
  }
};

// tray_heap_malloc is declared like malloc: the compiler may assume that nothing but the
// program writes a block it returned until the block escapes. A reset writes it.
void* escaped(void* p) {
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

// Past the list link and the free key that a block on a free list holds.
constexpr size_t kFirstFilledWord = 16;

TEST_F(DebugHeap, ResetFillsEveryBlockWithTheFreedPattern) {
  tray_heap_t* heap = tray_heap_new();
  char* blocks[100];
  for (int i = 0; i < 100; ++i) {
    blocks[i] = static_cast<char*>(tray_heap_malloc(heap, 100));
    std::memset(blocks[i], 0x5a, 100);
  }
  std::thread([&] { tray_free(blocks[1]); }).join();  // one freed earlier, by another thread
  tray_heap_reset(heap);
  for (int i = 0; i < 100; ++i)
    for (size_t offset = kFirstFilledWord; offset + 4 <= 96; offset += 4)
      ASSERT_EQ(word_at(blocks[i], offset), TRAY_FREED_PATTERN) << i << " " << offset;
  // The heap hands its blocks out again, checked as any reused block is.
  for (int i = 0; i < 200; ++i) ASSERT_EQ(tray_heap_of(tray_heap_malloc(heap, 100)), heap);
  tray_heap_destroy(heap);
}

TEST_F(DebugHeap, BlocksOfADestroyedHeapHoldTheFreedPattern) {
  tray_heap_t* heap = tray_heap_new();
  void* p = escaped(tray_heap_malloc(heap, 64));
  std::memset(p, 0, 64);
  tray_heap_destroy(heap);
  EXPECT_EQ(word_at(p, 32), TRAY_FREED_PATTERN);
}

TEST_F(DebugHeapDeath, FreeAfterResetIsADoubleFree) {
  tray_heap_t* heap = tray_heap_new();
  void* p = tray_heap_malloc(heap, 64);
  tray_heap_reset(heap);
  EXPECT_DEATH(tray_free(p), "double free");
}

TEST_F(DebugHeapDeath, FreeOfALargeBlockAfterDestroyIsADoubleFree) {
  tray_heap_t* heap = tray_heap_new();
  void* p = tray_heap_malloc(heap, 3 << 20);
  tray_heap_destroy(heap);
  EXPECT_DEATH(tray_free(p), "double free");
}

TEST_F(DebugHeapDeath, ALargeBlockOfAResetHeapIsInaccessible) {
  tray_heap_t* heap = tray_heap_new();
  auto* p = static_cast<volatile char*>(tray_heap_malloc(heap, 3 << 20));
  p[100] = 1;
  tray_heap_reset(heap);
  EXPECT_DEATH(p[100] = 2, "");
}

}  // namespace
