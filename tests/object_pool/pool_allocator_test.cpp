// tray::PoolAllocator: node containers work on it, their nodes come from the pools, and
// copies, rebinds and the propagate traits behave as the Allocator requirements say.
#include "tray/pool_allocator.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

namespace {

template <class T>
using PoolList = std::list<T, tray::PoolAllocator<T>>;
using PoolMap = std::map<int, std::string, std::less<int>,
                         tray::PoolAllocator<std::pair<const int, std::string>>>;
using PoolHashMap = std::unordered_map<int, int, std::hash<int>, std::equal_to<int>,
                                       tray::PoolAllocator<std::pair<const int, int>>>;

struct alignas(64) Aligned64 {
  int value;
};

TEST(PoolAllocator, MeetsTheAllocatorRequirementsThatContainersUse) {
  using Alloc = tray::PoolAllocator<int>;
  using Traits = std::allocator_traits<Alloc>;
  static_assert(std::is_same_v<Traits::rebind_alloc<double>, tray::PoolAllocator<double>>);
  static_assert(Traits::propagate_on_container_swap::value);
  static_assert(!Traits::is_always_equal::value);
  static_assert(std::is_nothrow_copy_constructible_v<Alloc>);

  Alloc a;
  Alloc copy = a;
  tray::PoolAllocator<double> rebound(a);
  EXPECT_EQ(a, copy);
  EXPECT_TRUE(rebound == a);
  EXPECT_EQ(Alloc(rebound), a);
  EXPECT_NE(a, Alloc());  // a new pool set

  Alloc moved_to = std::move(copy);
  EXPECT_EQ(moved_to, a);
  EXPECT_EQ(copy, a);  // moving copies: the source still works
}

TEST(PoolAllocator, ListNodesComeFromThePoolAndAreReused) {
  tray::PoolAllocator<int> alloc;
  PoolList<int> list(alloc);
  for (int i = 0; i < 1000; ++i) list.push_back(i);
  EXPECT_EQ(alloc.live_nodes(), 1000u);
  int expected = 0;
  for (int v : list) EXPECT_EQ(v, expected++);

  const int* front_node = &list.front();
  list.pop_front();
  EXPECT_EQ(alloc.live_nodes(), 999u);
  list.push_back(-1);
  EXPECT_EQ(&list.back(), front_node);  // the freed node's slot was the next one handed out

  list.clear();
  EXPECT_EQ(alloc.live_nodes(), 0u);
}

TEST(PoolAllocator, MapNodesComeFromThePool) {
  tray::PoolAllocator<std::pair<const int, std::string>> alloc(16);
  PoolMap map(alloc);
  for (int i = 0; i < 500; ++i) map.emplace(i, "value " + std::to_string(i));
  EXPECT_EQ(alloc.live_nodes(), 500u);
  for (int i = 0; i < 500; i += 2) map.erase(i);
  EXPECT_EQ(alloc.live_nodes(), 250u);
  EXPECT_EQ(map.at(301), "value 301");
  EXPECT_EQ(map.count(300), 0u);
}

TEST(PoolAllocator, UnorderedMapPoolsNodesAndNotBuckets) {
  tray::PoolAllocator<std::pair<const int, int>> alloc;
  PoolHashMap map(alloc);
  for (int i = 0; i < 5000; ++i) map.emplace(i, i * i);  // rehashes several times
  EXPECT_GT(map.bucket_count(), 1u);
  EXPECT_EQ(alloc.live_nodes(), map.size());
  for (int i = 0; i < 5000; i += 97) EXPECT_EQ(map.at(i), i * i);
  map.clear();
  EXPECT_EQ(alloc.live_nodes(), 0u);
}

TEST(PoolAllocator, ArraysAreNotPooled) {
  tray::PoolAllocator<uint64_t> alloc;
  uint64_t* array = alloc.allocate(10);
  for (int i = 0; i < 10; ++i) array[i] = uint64_t(i);
  EXPECT_EQ(array[9], 9u);
  EXPECT_EQ(alloc.live_nodes(), 0u);
  alloc.deallocate(array, 10);
}

TEST(PoolAllocator, OverAlignedNodesAreAligned) {
  PoolList<Aligned64> list;
  for (int i = 0; i < 100; ++i) list.push_back({i});
  for (const Aligned64& item : list) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(&item) % 64, 0u) << item.value;
  }
}

TEST(PoolAllocator, CopiedContainersShareThePoolSet) {
  tray::PoolAllocator<int> alloc;
  PoolList<int> original(alloc);
  original.assign({1, 2, 3});
  PoolList<int> copy(original);
  EXPECT_EQ(copy.get_allocator(), alloc);
  EXPECT_EQ(alloc.live_nodes(), 6u);
}

TEST(PoolAllocator, SwapAndMoveCarryTheAllocatorAlong) {
  tray::PoolAllocator<int> alloc_a;
  tray::PoolAllocator<int> alloc_b;
  PoolList<int> a(alloc_a);
  PoolList<int> b(alloc_b);
  a.assign({1, 2, 3});
  b.assign({4});

  a.swap(b);
  EXPECT_EQ(a.get_allocator(), alloc_b);
  EXPECT_EQ(b.get_allocator(), alloc_a);
  b.push_back(5);  // into alloc_a's pools, where b's nodes live
  EXPECT_EQ(alloc_a.live_nodes(), 4u);
  EXPECT_EQ(alloc_b.live_nodes(), 1u);

  a = std::move(b);
  EXPECT_EQ(a.get_allocator(), alloc_a);
  EXPECT_EQ(alloc_b.live_nodes(), 0u);  // a's old node went back to alloc_b's pools
  b.push_back(6);  // a moved-from container still has a working allocator
  EXPECT_EQ(b.back(), 6);
}

TEST(PoolAllocator, PoolSetOutlivesTheAllocatorThatMadeIt) {
  PoolList<std::string> list;
  {
    tray::PoolAllocator<std::string> temporary(8);
    list = PoolList<std::string>(temporary);  // move assignment takes the allocator along
  }
  for (int i = 0; i < 50; ++i) list.push_back(std::string(40, char('a' + i % 26)));
  EXPECT_EQ(list.get_allocator().live_nodes(), 50u);
}

}  // namespace
