// A checked heap (HeapUse::kChecked, what debug mode asks for) as the heap layer treats it:
// the thread's fast paths stay off, and pages it empties stay in their class with their free
// lists, past the limit a heap for the fast paths keeps. Each case runs on a thread of its own,
// which parks its heap when it ends.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "heap/heap.hpp"
#include "size_classes/size_classes.hpp"

namespace {

using tray::Heap;
using tray::HeapUse;

constexpr size_t kSize = 4000;

// Fills then empties enough pages of one class to hold twice what a heap may retain; returns
// the bytes of empty pages the heap kept.
size_t retained_after_emptying(Heap* heap) {
  const unsigned size_class = unsigned(tray::size_class_of(kSize));
  const size_t count = 2 * tray::kHeapRetainedBytes / tray::class_size(size_class);
  std::vector<void*> blocks;
  for (size_t i = 0; i < count; ++i) {
    void* p = tray::heap_alloc_from(heap, size_class, kSize);
    EXPECT_NE(p, nullptr);
    blocks.push_back(p);
  }
  const size_t before = heap->retained_bytes;
  for (void* p : blocks)
    tray::heap_free_block(heap, tray::unit_page_of(p), static_cast<tray::Block*>(p));
  return heap->retained_bytes - before;
}

TEST(CheckedHeap, LeavesTheFastPathsOff) {
  std::thread([] {
    Heap* heap = tray::heap_attach_thread(HeapUse::kChecked);
    ASSERT_NE(heap, nullptr);
    EXPECT_TRUE(heap->checked);
    EXPECT_EQ(tray::tls_own_heap, heap);
    EXPECT_EQ(tray::tls_heap, &tray::g_empty_heap);
  }).join();
}

TEST(CheckedHeap, KeepsEveryPageItEmpties) {
  std::thread([] {
    Heap* heap = tray::heap_attach_thread(HeapUse::kChecked);
    ASSERT_NE(heap, nullptr);
    EXPECT_GT(retained_after_emptying(heap), tray::kHeapRetainedBytes * 3 / 2);
  }).join();
}

TEST(CheckedHeap, AHeapForTheFastPathsKeepsItsLimit) {
  std::thread([] {
    Heap* heap = tray::heap_attach_thread(HeapUse::kFastPaths);
    ASSERT_NE(heap, nullptr);
    EXPECT_FALSE(heap->checked);
    EXPECT_EQ(tray::tls_heap, heap);
    retained_after_emptying(heap);
    EXPECT_LE(heap->retained_bytes, tray::kHeapRetainedBytes);
  }).join();
}

}  // namespace
