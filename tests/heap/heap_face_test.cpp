// tray/heap.hpp: Heap owns its heap (blocks belong to it while it lives, and go with it),
// moves hand the heap over, HeapAllocator puts containers' memory into its heap, and HeapScope
// makes malloc and new use a heap for a scope and puts the old default back after.
//
// Where malloc is traymalloc's (this program links libtraymalloc.so when it is built), the
// scope tests check where `new` lands; in a build with the C library's malloc (sanitizers) they
// skip, since a default heap cannot change what libc's malloc does.
#include "tray/heap.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "traymalloc.h"

namespace {

template <class T>
using HeapVector = std::vector<T, tray::HeapAllocator<T>>;
using HeapString = std::basic_string<char, std::char_traits<char>, tray::HeapAllocator<char>>;
using HeapMap = std::map<int, HeapString, std::less<int>,
                         tray::HeapAllocator<std::pair<const int, HeapString>>>;

struct alignas(256) Wide {
  unsigned char bytes[256];
};

bool is_aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// Whether plain malloc is traymalloc's in this process. calloc's block, since GCC takes a
// const void* argument for a read of the memory it points to, and malloc's bytes are unset.
bool malloc_is_traymalloc() {
  void* probe = std::calloc(1, 24);
  const bool ours = tray_owns(probe) != 0;
  std::free(probe);
  return ours;
}

// `new` through a call the optimizer cannot pair with its delete and drop.
int* new_int(int value) {
  int* volatile p = new int(value);
  return p;
}

TEST(Heap, BlocksBelongToTheHeapWhileItLives) {
  tray::Heap heap;
  ASSERT_NE(heap.get(), nullptr);
  EXPECT_TRUE(heap);
  void* a = heap.malloc(40);
  void* z = heap.calloc(10, 8);
  void* w = heap.aligned_alloc(128, 100);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(z, nullptr);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(tray_heap_of(a), heap.get());
  EXPECT_EQ(tray_heap_of(z), heap.get());
  EXPECT_EQ(tray_heap_of(w), heap.get());
  EXPECT_TRUE(heap.owns(a));
  EXPECT_TRUE(is_aligned(w, 128));
  for (size_t i = 0; i < 80; ++i) EXPECT_EQ(static_cast<unsigned char*>(z)[i], 0u);

  void* grown = heap.realloc(a, 4000);
  ASSERT_NE(grown, nullptr);
  EXPECT_EQ(tray_heap_of(grown), heap.get());
  tray_free(grown);  // one by one still works; z and w go with the heap

  void* outside = tray_malloc(40);
  EXPECT_EQ(tray_heap_of(outside), nullptr);
  EXPECT_FALSE(heap.owns(outside));
  EXPECT_FALSE(heap.owns(nullptr));
  tray_free(outside);
}

TEST(Heap, ReallocMovesABlockOfAnotherHeapIn) {
  tray::Heap first;
  tray::Heap second;
  void* p = first.malloc(64);
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5a, 64);
  void* q = second.realloc(p, 64);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(tray_heap_of(q), second.get());
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(static_cast<unsigned char*>(q)[i], 0x5a);
}

TEST(Heap, ResetEmptiesTheHeapAndKeepsIt) {
  tray::Heap heap;
  tray_heap_t* const raw = heap.get();
  for (int i = 0; i < 1000; ++i) ASSERT_NE(heap.malloc(size_t(16 + i % 500)), nullptr);
  heap.reset();
  EXPECT_EQ(heap.get(), raw);
  void* again = heap.malloc(32);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(tray_heap_of(again), raw);
}

// Small blocks live now, by the library's counters (0 everywhere in a build without them).
unsigned long long live_small_blocks() {
  tray_stats stats{};
  stats.version = TRAY_STATS_VERSION;
  if (tray_stats_get(&stats) != 0) return 0;
  unsigned long long live = 0;
  for (unsigned c = 0; c < stats.class_count; ++c) live += stats.classes[c].live_blocks;
  return live;
}

TEST(Heap, DestructorDestroysTheHeap) {
  constexpr unsigned long long kBlocks = 5000;
  const unsigned long long before = live_small_blocks();
  tray_heap_t* raw = nullptr;
  {
    tray::Heap heap;
    raw = heap.get();
    for (unsigned long long i = 0; i < kBlocks; ++i) {
      void* p = heap.malloc(200);
      ASSERT_EQ(tray_heap_of(p), raw);
    }
    if (live_small_blocks() < before + kBlocks) GTEST_SKIP() << "no statistics counters";
  }
  // The blocks went with the heap, not one by one: nobody freed them but the destructor.
  EXPECT_LT(live_small_blocks(), before + kBlocks / 10);
  tray::Heap next;  // and heaps keep coming
  void* p = next.malloc(100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(tray_heap_of(p), next.get());
}

TEST(Heap, MovesHandTheHeapOver) {
  static_assert(!std::is_copy_constructible_v<tray::Heap>);
  static_assert(!std::is_copy_assignable_v<tray::Heap>);
  static_assert(std::is_nothrow_move_constructible_v<tray::Heap>);
  static_assert(std::is_nothrow_move_assignable_v<tray::Heap>);

  tray::Heap a;
  tray_heap_t* const raw = a.get();
  void* p = a.malloc(48);
  tray::Heap b = std::move(a);
  EXPECT_EQ(a.get(), nullptr);
  EXPECT_FALSE(a);
  EXPECT_EQ(b.get(), raw);
  EXPECT_EQ(tray_heap_of(p), raw);

  tray::Heap c;
  c = std::move(b);  // c's own heap is destroyed, b's moves in
  EXPECT_EQ(c.get(), raw);
  EXPECT_EQ(b.get(), nullptr);
  EXPECT_EQ(tray_heap_of(p), raw);
  a.reset();  // empty Heaps reset and destroy as nothing
}

TEST(Heap, ReleaseAndAdoptPassOwnership) {
  tray::Heap heap;
  tray_heap_t* const raw = heap.release();
  EXPECT_EQ(heap.get(), nullptr);
  void* p = tray_heap_malloc(raw, 64);
  EXPECT_EQ(tray_heap_of(p), raw);
  tray::Heap owner = tray::Heap::adopt(raw);
  EXPECT_EQ(owner.get(), raw);
  EXPECT_FALSE(tray::Heap::adopt(nullptr));
}

TEST(Heap, MakeConstructsInTheHeap) {
  struct Pair {
    int a;
    std::string b;
  };
  tray::Heap heap;
  Pair* pair = heap.make<Pair>(7, "a string too long for the small buffer");
  EXPECT_EQ(tray_heap_of(pair), heap.get());
  EXPECT_EQ(pair->a, 7);
  EXPECT_EQ(pair->b, "a string too long for the small buffer");
  tray::Heap::destroy_object(pair);

  Wide* wide = heap.make<Wide>();
  EXPECT_TRUE(is_aligned(wide, alignof(Wide)));
  EXPECT_EQ(tray_heap_of(wide), heap.get());
}

TEST(Heap, MakeFreesTheBlockWhenTheConstructorThrows) {
  struct Throws {
    Throws() { throw 42; }
  };
  tray::Heap heap;
  EXPECT_THROW((void)heap.make<Throws>(), int);
}

TEST(HeapAllocator, MeetsTheAllocatorRequirementsThatContainersUse) {
  using Alloc = tray::HeapAllocator<int>;
  using Traits = std::allocator_traits<Alloc>;
  static_assert(std::is_same_v<Traits::rebind_alloc<double>, tray::HeapAllocator<double>>);
  static_assert(Traits::propagate_on_container_copy_assignment::value);
  static_assert(Traits::propagate_on_container_move_assignment::value);
  static_assert(Traits::propagate_on_container_swap::value);
  static_assert(!Traits::is_always_equal::value);
  static_assert(!std::is_default_constructible_v<Alloc>);
  static_assert(std::is_nothrow_copy_constructible_v<Alloc>);

  tray::Heap one;
  tray::Heap two;
  Alloc a(one);
  Alloc copy = a;
  tray::HeapAllocator<double> rebound(a);
  EXPECT_EQ(a, copy);
  EXPECT_TRUE(rebound == a);
  EXPECT_EQ(Alloc(rebound).heap(), one.get());
  EXPECT_NE(a, Alloc(two));
}

TEST(HeapAllocator, VectorLivesInTheHeap) {
  tray::Heap heap;
  HeapVector<uint64_t> v{tray::HeapAllocator<uint64_t>(heap)};
  for (uint64_t i = 0; i < 10000; ++i) {
    v.push_back(i * 3);
    ASSERT_EQ(tray_heap_of(v.data()), heap.get());  // every reallocation stays in the heap
  }
  for (uint64_t i = 0; i < 10000; ++i) ASSERT_EQ(v[i], i * 3);
  v.clear();
  v.shrink_to_fit();
}

TEST(HeapAllocator, MapNodesAndStringsLiveInTheHeap) {
  tray::Heap heap;
  const tray::HeapAllocator<char> chars(heap);
  HeapMap map{tray::HeapAllocator<std::pair<const int, HeapString>>(heap)};
  for (int i = 0; i < 200; ++i) {
    HeapString text("value number " + std::to_string(i) + " which outgrows the small buffer",
                    chars);
    map.emplace(i, std::move(text));
  }
  for (const auto& [key, value] : map) {
    EXPECT_EQ(tray_heap_of(&value), heap.get()) << key;         // the node
    EXPECT_EQ(tray_heap_of(value.data()), heap.get()) << key;  // the string's characters
    EXPECT_EQ(value.get_allocator(), chars);
  }
  EXPECT_EQ(map.at(123), HeapString("value number 123 which outgrows the small buffer", chars));
}

TEST(HeapAllocator, AssignmentAndSwapCarryTheHeap) {
  tray::Heap one;
  tray::Heap two;
  HeapVector<int> a({1, 2, 3}, tray::HeapAllocator<int>(one));
  HeapVector<int> b({4, 5, 6, 7}, tray::HeapAllocator<int>(two));

  a.swap(b);
  EXPECT_EQ(a.get_allocator().heap(), two.get());
  EXPECT_EQ(tray_heap_of(a.data()), two.get());
  EXPECT_EQ(tray_heap_of(b.data()), one.get());

  HeapVector<int> c({9}, tray::HeapAllocator<int>(one));
  c = a;  // copy assignment takes a's heap along
  EXPECT_EQ(c.get_allocator().heap(), two.get());
  EXPECT_EQ(tray_heap_of(c.data()), two.get());

  HeapVector<int> d({8}, tray::HeapAllocator<int>(one));
  const int* moved = b.data();
  d = std::move(b);  // move assignment takes the block itself
  EXPECT_EQ(d.data(), moved);
  EXPECT_EQ(d.get_allocator().heap(), one.get());

  const HeapVector<int> e(c);  // copy construction shares the source's heap
  EXPECT_EQ(tray_heap_of(e.data()), two.get());
}

TEST(HeapAllocator, AbandonedContainersGoWithTheHeap) {
  tray::Heap heap;
  for (int round = 0; round < 3; ++round) {
    // Built in the heap and never destroyed: reset takes their memory.
    auto* v = heap.make<HeapVector<int>>(tray::HeapAllocator<int>(heap));
    for (int i = 0; i < 5000; ++i) v->push_back(i);
    EXPECT_EQ(tray_heap_of(v->data()), heap.get());
    heap.reset();
  }
}

TEST(HeapAllocator, OverAlignedTypesAreAligned) {
  tray::Heap heap;
  HeapVector<Wide> v{tray::HeapAllocator<Wide>(heap)};
  for (int i = 0; i < 100; ++i) {
    v.emplace_back();
    ASSERT_TRUE(is_aligned(v.data(), alignof(Wide)));
    ASSERT_EQ(tray_heap_of(v.data()), heap.get());
  }
  tray::HeapAllocator<Wide> alloc(heap);
  Wide* one = alloc.allocate(1);
  EXPECT_TRUE(is_aligned(one, alignof(Wide)));
  alloc.deallocate(one, 1);
}

TEST(HeapAllocator, ImpossibleSizesThrow) {
  tray::Heap heap;
  tray::HeapAllocator<uint64_t> alloc(heap);
  EXPECT_THROW((void)alloc.allocate(SIZE_MAX / 4), std::bad_array_new_length);
  EXPECT_THROW((void)alloc.allocate(SIZE_MAX / 16), std::bad_alloc);
}

// Inside a scope the tests only record what they see and check it after the scope ends: a
// failure message that gtest allocated into the heap would outlive it.
TEST(HeapScope, NewLandsInTheHeapAndTheDefaultComesBack) {
  if (!malloc_is_traymalloc()) GTEST_SKIP() << "malloc is not traymalloc's in this build";
  tray::Heap heap;
  int* inside = nullptr;
  tray_heap_t* previous = heap.get();
  tray_heap_t* of_new = nullptr;
  tray_heap_t* of_malloc = nullptr;
  tray_heap_t* of_vector = nullptr;
  {
    const tray::HeapScope scope(heap);
    previous = scope.previous();
    inside = new_int(1);
    of_new = tray_heap_of(inside);
    void* block = std::malloc(100);
    of_malloc = tray_heap_of(block);
    std::free(block);
    const std::vector<int> v(1000, 7);  // std::allocator goes the same way
    of_vector = tray_heap_of(v.data());
  }
  int* outside = new_int(2);
  EXPECT_EQ(previous, nullptr);
  EXPECT_EQ(of_new, heap.get());
  EXPECT_EQ(of_malloc, heap.get());
  EXPECT_EQ(of_vector, heap.get());
  EXPECT_EQ(tray_heap_of(outside), nullptr);
  EXPECT_EQ(*inside, 1);
  delete inside;  // a block of the heap, freed one by one after the scope
  delete outside;
}

TEST(HeapScope, NestedScopesRestoreInOrder) {
  if (!malloc_is_traymalloc()) GTEST_SKIP() << "malloc is not traymalloc's in this build";
  tray::Heap outer;
  tray::Heap inner;
  // Each step allocates with new, records the block's heap and frees the block.
  std::array<tray_heap_t*, 6> seen{};
  std::array<tray_heap_t*, 2> previous{};
  auto where = [] {
    int* p = new_int(0);
    tray_heap_t* heap = tray_heap_of(p);
    delete p;
    return heap;
  };
  {
    const tray::HeapScope first(outer);
    seen[0] = where();
    {
      const tray::HeapScope second(inner);
      previous[0] = second.previous();
      seen[1] = where();
      {
        const tray::HeapScope third(outer);
        previous[1] = third.previous();
        seen[2] = where();
      }
      seen[3] = where();
    }
    seen[4] = where();
  }
  seen[5] = where();
  EXPECT_EQ(previous[0], outer.get());
  EXPECT_EQ(previous[1], inner.get());
  EXPECT_EQ(seen[0], outer.get());
  EXPECT_EQ(seen[1], inner.get());
  EXPECT_EQ(seen[2], outer.get());
  EXPECT_EQ(seen[3], inner.get());
  EXPECT_EQ(seen[4], outer.get());
  EXPECT_EQ(seen[5], nullptr);
}

TEST(HeapScope, OtherThreadsKeepTheirDefault) {
  if (!malloc_is_traymalloc()) GTEST_SKIP() << "malloc is not traymalloc's in this build";
  tray::Heap heap;
  tray_heap_t* seen = heap.get();
  tray_heap_t* here = nullptr;
  std::thread other;
  {
    const tray::HeapScope scope(heap);
    other = std::thread([&seen] {
      int* p = new_int(3);
      seen = tray_heap_of(p);
      delete p;
    });
    other.join();
    int* p = new_int(4);
    here = tray_heap_of(p);
    delete p;
  }
  EXPECT_EQ(seen, nullptr);
  EXPECT_EQ(here, heap.get());
}

}  // namespace
