// The purger thread in a program that has no thread of its own: it does not start, since the C
// library would count the process as multi-threaded from then on (fork from a signal handler
// would wait on glibc's fork lock, stdio would lock every call). It starts once the program
// has a thread that allocates, or at once for a stats_interval, which only the thread serves.
// Each test runs in a process of its own (ctest), which has created no thread before it.
#include <sys/single_threaded.h>

#include <gtest/gtest.h>

#include <thread>

#include "purge/purge.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray::g_purger_state;
using tray::PurgerState;
using tray_test::kMiB;

PurgerState purger_state() { return g_purger_state.load(std::memory_order_acquire); }

// What starts the purger in a threaded program: a large block, freed (a cached block to give
// back), then the next allocation slow path.
void leave_work_for_the_purger() {
  void* large = tray_malloc(8 * kMiB);
  ASSERT_NE(large, nullptr);
  tray_free(large);
  tray_free(tray_malloc(8 * kMiB));
}

TEST(SingleThreadPurger, DoesNotStartInAProgramWithoutThreads) {
  ASSERT_TRUE(__libc_single_threaded) << "something started a thread before the test";
  ASSERT_NO_FATAL_FAILURE(leave_work_for_the_purger());
  if (purger_state() == PurgerState::kOff)
    GTEST_SKIP() << "no purger thread in this build (debug mode, memcheck or ASan)";
  EXPECT_EQ(purger_state(), PurgerState::kAwaitingThreads);
  EXPECT_TRUE(__libc_single_threaded) << "traymalloc made the program multi-threaded";
}

TEST(SingleThreadPurger, StartsOnceTheProgramHasAThreadThatAllocates) {
  ASSERT_NO_FATAL_FAILURE(leave_work_for_the_purger());
  if (purger_state() == PurgerState::kOff)
    GTEST_SKIP() << "no purger thread in this build (debug mode, memcheck or ASan)";
  ASSERT_EQ(purger_state(), PurgerState::kAwaitingThreads);
  std::thread([] { tray_free(tray_malloc(64)); }).join();  // its first slow path may start it
  EXPECT_NE(purger_state(), PurgerState::kAwaitingThreads);
  ASSERT_NO_FATAL_FAILURE(leave_work_for_the_purger());
  EXPECT_EQ(purger_state(), PurgerState::kRunning);
}

TEST(SingleThreadPurger, StartsForAStatsInterval) {
  ASSERT_NO_FATAL_FAILURE(leave_work_for_the_purger());
  if (purger_state() == PurgerState::kOff)
    GTEST_SKIP() << "no purger thread in this build (debug mode, memcheck or ASan)";
  ASSERT_EQ(purger_state(), PurgerState::kAwaitingThreads);
  ASSERT_EQ(tray_option_set("stats_file", "/dev/null"), 0);
  ASSERT_EQ(tray_option_set("stats_interval", "1000"), 0);
  ASSERT_NO_FATAL_FAILURE(leave_work_for_the_purger());
  EXPECT_EQ(purger_state(), PurgerState::kRunning);
}

}  // namespace
