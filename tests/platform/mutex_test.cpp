// os::Mutex, the futex lock behind the pool, the heaps list, the span arenas and the profile:
// threads that contend for it long enough that waiters sleep still each get it alone, and a
// holder's unlock wakes a sleeper (a lost wake-up would hang the test).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "platform/os.hpp"

namespace {

TEST(Mutex, ContendedThreadsEachHoldItAlone) {
  tray::os::Mutex mutex;
  constexpr int kThreads = 4;
  constexpr int kRounds = 20000;
  uint64_t counter = 0;  // plain: only the lock orders the threads' updates
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        const tray::os::LockGuard guard(mutex);
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        ++counter;
        if (i % 1000 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));  // waiters sleep
        inside.fetch_sub(1);
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(counter, uint64_t{kThreads} * kRounds);
  EXPECT_TRUE(mutex.try_lock()) << "left held";
  mutex.unlock();
}

TEST(Mutex, TryLockFailsWhileHeld) {
  tray::os::Mutex mutex;
  ASSERT_TRUE(mutex.try_lock());
  std::thread([&] { EXPECT_FALSE(mutex.try_lock()); }).join();
  mutex.unlock();
  std::thread([&] {
    EXPECT_TRUE(mutex.try_lock());
    mutex.unlock();
  }).join();
}

}  // namespace
