// When the idle purger starts: only on allocation slow paths, never inside a free. glibc frees
// a finished thread's TLS while it holds the lock on its stack cache (in pthread_join), and
// pthread_create takes that lock too: a free that started the purger there would wait on
// itself for good. A large allocation marks the purger wanted and starts it, so a program that
// frees its large blocks and then goes quiet still has it.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "large/config.hpp"
#include "purge/config.hpp"
#include "purge/purge.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

// The purger these tests wait for starts only in a program with a thread of its own.
testing::Environment* const kThreadedProgram =
    testing::AddGlobalTestEnvironment(new tray_test::ThreadedProgram);

using tray::g_purger_state;
using tray::PurgerState;
using tray_test::kMiB;

PurgerState purger_state() { return g_purger_state.load(std::memory_order_acquire); }

// Exit codes of the child below: which expectation failed.
enum ChildResult { kChildOk = 0, kChildNotWanted = 1, kFreeStartedIt = 2, kMallocDidNot = 3 };

TEST(Purger, FreesNeverStartItAndTheNextLargeAllocationDoes) {
  void* large = tray_malloc(8 * kMiB);  // marks the purger wanted and starts it
  ASSERT_NE(large, nullptr);
  if (purger_state() == PurgerState::kOff)
    GTEST_SKIP() << "no purger thread in this build (debug mode, memcheck or ASan)";
  ASSERT_EQ(purger_state(), PurgerState::kRunning) << "a large allocation did not start it";
  // Small blocks enough to fill pages beyond a heap's retained budget, freed in the child: the
  // pages going back to the pool is where a free used to start the purger.
  constexpr int kSmallCount = 4096;
  static void* small[kSmallCount];
  for (void*& p : small) p = tray_malloc(2048);

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child has no purger thread; it is wanted again (ThreadSanitizer's children do without).
    if (purger_state() == PurgerState::kOff) _exit(kChildOk);
    if (purger_state() != PurgerState::kWanted) _exit(kChildNotWanted);
    for (void* p : small) tray_free(p);
    tray_free(large);
    if (purger_state() != PurgerState::kWanted) _exit(kFreeStartedIt);
    void* again = tray_malloc(6 * kMiB);
    if (again == nullptr || purger_state() != PurgerState::kRunning) _exit(kMallocDidNot);
    tray_free(again);
    _exit(kChildOk);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  EXPECT_NE(WEXITSTATUS(status), kChildNotWanted) << "the child did not want a purger";
  EXPECT_NE(WEXITSTATUS(status), kFreeStartedIt) << "a free started the purger";
  EXPECT_NE(WEXITSTATUS(status), kMallocDidNot) << "a large allocation did not start the purger";
  for (void* p : small) tray_free(p);
  tray_free(large);
}

// A thread that holds a heap keeps the purger running: a free cannot start it, so a purger that
// ended after a second with nothing to do left what the program freed later, just before going
// quiet, to an allocation slow path that might never come. Here the program stays idle for
// longer than that second, then frees a large block and goes quiet again.
TEST(Purger, StaysWhileAThreadHoldsAHeapSoALateFreeStillGoesBack) {
  tray_free(tray_malloc(64));  // this thread holds a heap from here on
  constexpr size_t kLargeBytes = 8 * kMiB;
  void* large = tray_malloc(kLargeBytes);
  ASSERT_NE(large, nullptr);
  if (purger_state() == PurgerState::kOff)
    GTEST_SKIP() << "no purger thread in this build (debug mode, memcheck or ASan)";
  std::memset(large, 0x3c, kLargeBytes);
  tray_trim();  // nothing waits for the purger from here on
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * tray::kPurgerIdleExitMs));
  EXPECT_EQ(purger_state(), PurgerState::kRunning) << "the purger ended while a thread held a heap";
  tray_free(large);
  auto cached_blocks = [] { return tray_test::stats_now().large.cached_blocks; };
  ASSERT_GT(cached_blocks(), 0u) << "the block was not cached: nothing left for the purger";
  const auto wait = std::chrono::milliseconds(2 * tray::kLargeCacheDelayMs);
  EXPECT_TRUE(tray_test::given_back_while_idle(wait, [&] { return cached_blocks() == 0; }))
      << "a block freed after a quiet second stayed cached while the program was idle";
}

// purge_thread=0 set while the thread runs ends it at its next wake, for good: from then on
// freed memory waits for the allocator's next call, as the option says.
TEST(Purger, TurnedOffWhileRunningEndsAtItsNextWake) {
  constexpr size_t kLargeBytes = 8 * kMiB;
  void* large = tray_malloc(kLargeBytes);
  ASSERT_NE(large, nullptr);
  if (purger_state() == PurgerState::kOff)
    GTEST_SKIP() << "no purger thread in this build (debug mode, memcheck or ASan)";
  ASSERT_EQ(purger_state(), PurgerState::kRunning);
  std::memset(large, 0x5e, kLargeBytes);
  ASSERT_EQ(tray_option_set("purge_thread", "0"), 0);
  tray_free(large);  // leaves the purger work, and wakes it
  const auto deadline = std::chrono::steady_clock::now() + tray_test::kIdleWaitLoaded;
  while (purger_state() != PurgerState::kOff && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(purger_state(), PurgerState::kOff) << "the purger still runs with purge_thread=0";
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * tray::kLargeCacheDelayMs));
  EXPECT_GT(tray_test::stats_now().large.cached_blocks, 0u)
      << "something gave the cached block back with no purger and no call";
  ASSERT_EQ(tray_option_set("purge_thread", "1"), 0);
}

}  // namespace
