// tray::ObjectPool: policies, slot reuse, object lifetimes, alignment, iteration and reset.
#include "tray/object_pool.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <stdexcept>
#include <vector>

namespace {

// Counts constructions and destructions, so a test can see that every object created was
// destroyed exactly once.
struct Counted {
  static inline int constructed = 0;
  static inline int destroyed = 0;
  static void reset_counts() { constructed = destroyed = 0; }

  explicit Counted(int v) : value(v) { ++constructed; }
  ~Counted() { ++destroyed; }
  int value;
};

struct alignas(64) CacheLine {
  uint64_t words[3];
};

struct alignas(256) Wide {
  char bytes[40];
};

struct ThrowsOnNegative {
  explicit ThrowsOnNegative(int v) : value(v) {
    if (v < 0) throw std::invalid_argument("negative");
  }
  int value;
};

TEST(ObjectPool, FailPolicyReturnsNullWhenFullAndRecoversAfterDestroy) {
  tray::ObjectPool<int> pool(4);
  std::vector<int*> objects;
  for (int i = 0; i < 4; ++i) objects.push_back(pool.create(i));
  for (int* p : objects) ASSERT_NE(p, nullptr);

  EXPECT_EQ(pool.create(99), nullptr);
  EXPECT_EQ(pool.size(), 4u);
  EXPECT_EQ(pool.capacity(), 4u);

  pool.destroy(objects[2]);
  int* again = pool.create(7);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(*again, 7);
  EXPECT_EQ(pool.create(8), nullptr);
}

TEST(ObjectPool, GrowPolicyDoublesCapacityAndNeverMovesObjects) {
  tray::ObjectPool<int> pool(4, tray::PoolPolicy::grow);
  std::vector<int*> objects;
  for (int i = 0; i < 4; ++i) objects.push_back(pool.create(i));
  EXPECT_EQ(pool.capacity(), 4u);

  objects.push_back(pool.create(4));
  ASSERT_NE(objects.back(), nullptr);
  EXPECT_EQ(pool.capacity(), 8u);

  for (int i = 5; i < 100; ++i) objects.push_back(pool.create(i));
  EXPECT_EQ(pool.capacity(), 128u);  // 4, 8, 16, 32, 64, 128
  EXPECT_EQ(pool.size(), 100u);
  for (int i = 0; i < 100; ++i) {
    ASSERT_NE(objects[i], nullptr);
    EXPECT_EQ(*objects[i], i) << "object " << i << " moved or was overwritten";
  }
}

TEST(ObjectPool, DestroyedSlotIsTheNextOneReused) {
  tray::ObjectPool<int> pool(16);
  int* a = pool.create(1);
  int* b = pool.create(2);
  pool.destroy(a);
  EXPECT_EQ(pool.create(3), a);
  pool.destroy(b);
  EXPECT_EQ(pool.create(4), b);
  EXPECT_EQ(pool.size(), 2u);
}

TEST(ObjectPool, EveryConstructedObjectIsDestroyedOnce) {
  Counted::reset_counts();
  {
    tray::ObjectPool<Counted> pool(8, tray::PoolPolicy::grow);
    std::vector<Counted*> objects;
    for (int i = 0; i < 20; ++i) objects.push_back(pool.create(i));
    for (int i = 0; i < 20; i += 2) pool.destroy(objects[i]);
    EXPECT_EQ(Counted::constructed, 20);
    EXPECT_EQ(Counted::destroyed, 10);
    for (int i = 0; i < 5; ++i) ASSERT_NE(pool.create(100 + i), nullptr);
    EXPECT_EQ(Counted::constructed, 25);
  }  // the pool's destructor destroys the 15 still alive
  EXPECT_EQ(Counted::destroyed, 25);
}

TEST(ObjectPool, ThrowingConstructorLeavesTheSlotFree) {
  tray::ObjectPool<ThrowsOnNegative> pool(2);
  ThrowsOnNegative* first = pool.create(1);
  EXPECT_THROW((void)pool.create(-1), std::invalid_argument);
  EXPECT_EQ(pool.size(), 1u);
  ThrowsOnNegative* second = pool.create(2);
  ASSERT_NE(second, nullptr);
  EXPECT_NE(second, first);
  EXPECT_EQ(pool.create(3), nullptr);  // both slots are live: none was lost to the throw
}

template <class T>
void expect_aligned_across_chunks() {
  tray::ObjectPool<T> pool(3, tray::PoolPolicy::grow);
  for (int i = 0; i < 50; ++i) {
    T* object = pool.create();
    ASSERT_NE(object, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(object) % alignof(T), 0u) << "object " << i;
  }
  EXPECT_GT(pool.capacity(), 3u);
}

TEST(ObjectPool, OverAlignedTypesAreAlignedInEveryChunk) {
  expect_aligned_across_chunks<CacheLine>();
  expect_aligned_across_chunks<Wide>();
}

TEST(ObjectPool, ObjectsSmallerThanALinkGetWholeSlots) {
  tray::ObjectPool<char> pool(64);
  std::set<char*> seen;
  for (int i = 0; i < 64; ++i) {
    char* c = pool.create(char('a' + i % 26));
    ASSERT_NE(c, nullptr);
    seen.insert(c);
  }
  EXPECT_EQ(seen.size(), 64u);
  pool.for_each([](char& c) { EXPECT_GE(c, 'a'); });
}

TEST(ObjectPool, ForEachVisitsExactlyTheLiveObjects) {
  tray::ObjectPool<int> pool(10, tray::PoolPolicy::grow);
  std::vector<int*> objects;
  for (int i = 0; i < 300; ++i) objects.push_back(pool.create(i));
  std::set<int*> live;
  for (int i = 0; i < 300; ++i) {
    if (i % 3 == 0 || i % 7 == 0) {
      pool.destroy(objects[i]);
    } else {
      live.insert(objects[i]);
    }
  }

  std::set<int*> visited;
  pool.for_each([&](int& value) {
    EXPECT_TRUE(visited.insert(&value).second) << "visited twice: " << value;
  });
  EXPECT_EQ(visited, live);

  const auto& read_only = pool;
  size_t count = 0;
  read_only.for_each([&](const int&) { ++count; });
  EXPECT_EQ(count, live.size());
}

TEST(ObjectPool, ForEachMayDestroyTheObjectItVisits) {
  tray::ObjectPool<int> pool(64, tray::PoolPolicy::grow);
  for (int i = 0; i < 200; ++i) ASSERT_NE(pool.create(i), nullptr);
  pool.for_each([&](int& value) {
    if (value % 2 == 1) pool.destroy(&value);
  });
  EXPECT_EQ(pool.size(), 100u);
  pool.for_each([](int& value) { EXPECT_EQ(value % 2, 0); });
}

TEST(ObjectPool, ForEachSkipsObjectsDestroyedBeforeTheirTurn) {
  tray::ObjectPool<int> pool(8);
  int* first = pool.create(0);
  int* second = pool.create(1);
  ASSERT_LT(first, second);  // a fresh chunk hands slots out in address order
  int visits = 0;
  pool.for_each([&](int& value) {
    ++visits;
    if (&value == first) pool.destroy(second);
  });
  EXPECT_EQ(visits, 1);
}

TEST(ObjectPool, ForEachMayCreateObjectsEvenWhenThePoolGrows) {
  tray::ObjectPool<int> pool(4, tray::PoolPolicy::grow);
  for (int i = 0; i < 4; ++i) ASSERT_NE(pool.create(i), nullptr);
  pool.for_each([&](int& value) {
    if (value < 4) {
      ASSERT_NE(pool.create(value + 100), nullptr);
    }
  });
  EXPECT_EQ(pool.size(), 8u);
  int sum = 0;
  pool.for_each([&](int& value) { sum += value; });
  EXPECT_EQ(sum, 0 + 1 + 2 + 3 + 100 + 101 + 102 + 103);
}

TEST(ObjectPool, ClearDestroysEverythingAndKeepsCapacity) {
  Counted::reset_counts();
  tray::ObjectPool<Counted> pool(4, tray::PoolPolicy::grow);
  for (int i = 0; i < 10; ++i) ASSERT_NE(pool.create(i), nullptr);
  const size_t capacity = pool.capacity();

  pool.clear();
  EXPECT_EQ(Counted::destroyed, 10);
  EXPECT_EQ(pool.size(), 0u);
  EXPECT_EQ(pool.capacity(), capacity);
  EXPECT_EQ(pool.peak(), 10u);
  int visits = 0;
  pool.for_each([&](Counted&) { ++visits; });
  EXPECT_EQ(visits, 0);

  // All slots can be used again without growing.
  for (size_t i = 0; i < capacity; ++i) ASSERT_NE(pool.create(int(i)), nullptr);
  EXPECT_EQ(pool.capacity(), capacity);
}

// A tree node whose destructor destroys its children, as recursive structures in pools do.
struct TreeNode {
  tray::ObjectPool<TreeNode>* pool;
  TreeNode* left = nullptr;
  TreeNode* right = nullptr;
  static inline int destroyed = 0;
  explicit TreeNode(tray::ObjectPool<TreeNode>* owner) : pool(owner) {}
  ~TreeNode() {
    ++destroyed;
    pool->destroy(left);
    pool->destroy(right);
  }
};

TEST(ObjectPool, ClearCopesWithDestructorsThatDestroyOtherObjects) {
  TreeNode::destroyed = 0;
  tray::ObjectPool<TreeNode> pool(16);
  TreeNode* root = pool.create(&pool);
  root->left = pool.create(&pool);
  root->right = pool.create(&pool);
  root->left->left = pool.create(&pool);
  pool.clear();
  EXPECT_EQ(TreeNode::destroyed, 4);
  EXPECT_EQ(pool.size(), 0u);
}

TEST(ObjectPool, PeakIsTheHighWaterMark) {
  tray::ObjectPool<int> pool(8);
  std::vector<int*> objects;
  for (int i = 0; i < 6; ++i) objects.push_back(pool.create(i));
  for (int i = 0; i < 4; ++i) pool.destroy(objects[i]);
  ASSERT_NE(pool.create(0), nullptr);
  EXPECT_EQ(pool.size(), 3u);
  EXPECT_EQ(pool.peak(), 6u);
}

TEST(ObjectPool, ShrinkToFitReturnsEmptyChunksButKeepsTheFirst) {
  tray::ObjectPool<int> pool(4, tray::PoolPolicy::grow);
  std::vector<int*> objects;
  // Chunks of 4, 4 and 8 slots, filled in that order.
  for (int i = 0; i < 16; ++i) objects.push_back(pool.create(i));
  ASSERT_EQ(pool.capacity(), 16u);

  for (int i = 8; i < 16; ++i) pool.destroy(objects[i]);  // empties the 8-slot chunk
  pool.shrink_to_fit();
  EXPECT_EQ(pool.capacity(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(*objects[i], i);

  for (int i = 0; i < 8; ++i) pool.destroy(objects[i]);
  pool.shrink_to_fit();
  EXPECT_EQ(pool.capacity(), 4u);

  // The pool still works, and grows again from what is left.
  for (int i = 0; i < 5; ++i) ASSERT_NE(pool.create(i), nullptr);
  EXPECT_EQ(pool.capacity(), 8u);
}

TEST(ObjectPool, ShrinkToFitKeepsChunksWithOneLiveObject) {
  tray::ObjectPool<int> pool(2, tray::PoolPolicy::grow);
  std::vector<int*> objects;
  for (int i = 0; i < 8; ++i) objects.push_back(pool.create(i));  // chunks of 2, 2, 4
  for (int i = 0; i < 7; ++i) pool.destroy(objects[i]);
  pool.shrink_to_fit();
  EXPECT_EQ(pool.capacity(), 6u);  // the first chunk and the one holding objects[7]
  EXPECT_EQ(*objects[7], 7);

  // Free slots of the kept chunks are still handed out.
  for (int i = 0; i < 5; ++i) ASSERT_NE(pool.create(i), nullptr);
  EXPECT_EQ(pool.capacity(), 6u);
}

}  // namespace
