#include <algorithm>

#include "events/events.hpp"
#include "heap/heap.hpp"
#include "large/large.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "purge/config.hpp"
#include "purge/purge.hpp"
#include "report/report.hpp"
#include "segment/segment.hpp"

namespace tray {

namespace {

#if defined(TRAY_TSAN)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif

std::atomic<bool> g_stop{false};      // purger_stop asks the thread to end
std::atomic<int> g_thread_tid{0};     // the last thread started, 0 until it runs
uint64_t g_next_dump_ms = 0;          // the thread's own; 0 while no interval is set

// The next periodic dump, writing the one that is due.
uint64_t stats_due(uint64_t now) {
  const int64_t seconds = option(Option::kStatsInterval);
  if (seconds <= 0) {
    g_next_dump_ms = 0;
    return kNeverMs;
  }
  const uint64_t period = uint64_t(seconds) * 1000;
  if (g_next_dump_ms == 0) {
    g_next_dump_ms = now + period;
  } else if (now >= g_next_dump_ms) {
    stats_dump_as_configured("interval");
    // Keep to the schedule, but do not catch up on dumps missed while the machine slept.
    g_next_dump_ms = std::max(g_next_dump_ms + period, now + 1);
  }
  return g_next_dump_ms;
}

// One pass over the memory that waits on a delay, oldest deadlines first out: the next
// deadline, kNeverMs if nothing waits. Parked heaps go first: the pages they give back wait in
// the pool like any other. Safe beside another thread's pass (app threads run parts of it).
uint64_t purge_pass(uint64_t now) {
  uint64_t due = heap_collect_idle();
  due = std::min(due, segment_purge_expired(now));
  return std::min(due, large_purge_expired(now));
}

// Ends the thread (true) after kPurgerIdleExitMs with nothing to do and no thread of the
// program holding a heap. Linux ends a process when its last thread ends, not when main's
// does: a helper that slept on would keep alive, and deaf to the signals it blocks, a program
// whose own threads have all ended (main leaving through pthread_exit, a child forked by a
// thread ending that thread). A notifier that saw the thread running did not mark it wanted,
// and its work may have come after the last pass: one more pass after the state changes sees
// it, and the thread stays, unless a new one is wanted already.
bool retire() {
  g_purger_state.store(PurgerState::kNone, std::memory_order_seq_cst);
  // A notifier that wins this exchange is waking the thread for work it left. The last pass
  // may run beside a new thread's first: it leaves the dump schedule, that thread's, alone.
  bool stay = !g_purger_sleeping.exchange(false, std::memory_order_seq_cst);
  if (!stay) stay = purge_pass(os::now_ms()) != kNeverMs || option(Option::kStatsInterval) > 0;
  if (!stay) return true;
  PurgerState expected = PurgerState::kNone;
  return !g_purger_state.compare_exchange_strong(expected, PurgerState::kRunning,
                                                 std::memory_order_acq_rel);
}

// Passes, each followed by a sleep until the next deadline, or until purger_notify if nothing
// waits. While a thread of the program holds a heap, the thread stays: a free cannot start
// it, so one that ended would leave what the program frees from then on, before it goes
// quiet, to its next allocation slow path, which may never come. A thread whose first request
// is large gets a heap too, so the same holds for threads that use only large blocks.
// purge_thread=0, set while it runs, ends it when it next wakes, for good.
void purger_main() {
  tls_in_purger = true;
  g_thread_tid.store(os::thread_id(), std::memory_order_release);
  uint64_t idle_since_ms = kNeverMs;
  for (;;) {
    g_purger_sleeping.store(true, std::memory_order_relaxed);
    // Pairs with the fence in purger_notify: either this pass sees what the notifier left,
    // or the notifier sees g_purger_sleeping and bumps g_purger_wake, which ends the wait below. Acquire
    // pairs with purger_wake: the last heap's detach is seen, or it ends the wait.
    purger_fence();
    const uint32_t seen = g_purger_wake.load(std::memory_order_acquire);
    if (option(Option::kPurgeThread) == 0) {
      g_purger_state.store(PurgerState::kOff, std::memory_order_relaxed);
      return;
    }
    if (g_stop.load(std::memory_order_seq_cst)) {
      g_purger_state.store(PurgerState::kStopped, std::memory_order_seq_cst);
      // A purger_stop that gave up waiting has withdrawn its request, and may have looked at
      // the state before this store: the next slow path starts a thread again.
      PurgerState stopped = PurgerState::kStopped;
      if (!g_stop.load(std::memory_order_seq_cst))
        g_purger_state.compare_exchange_strong(stopped, PurgerState::kWanted, std::memory_order_seq_cst);
      return;
    }
    const uint64_t now = os::now_ms();
    const uint64_t due = std::min(purge_pass(now), stats_due(now));
    uint64_t timeout_ms = kPurgerIdleExitMs;
    if (due != kNeverMs) {
      g_purger_sleeping.store(false, std::memory_order_relaxed);
      idle_since_ms = kNeverMs;
      // The clock is coarse: waking a little late is better than waking before the deadline
      // and finding nothing due yet.
      timeout_ms = (due > now ? due - now : 0) + kPurgerLateMs;
    } else if (heap_threads_attached()) {
      idle_since_ms = kNeverMs;
      timeout_ms = 0;  // no limit: until purger_notify or purger_wake
    } else if (idle_since_ms == kNeverMs) {
      idle_since_ms = now;
    } else if (now - idle_since_ms >= kPurgerIdleExitMs) {
      if (retire()) return;
      idle_since_ms = kNeverMs;
      continue;
    }
    os::wait_on(g_purger_wake, seen, timeout_ms);
  }
}

}  // namespace

bool purger_stop() {
  const uint64_t deadline = os::now_ms() + kPurgerStopWaitMs;
  const auto started = [] {
    const PurgerState state = g_purger_state.load(std::memory_order_acquire);
    return state == PurgerState::kStarting || state == PurgerState::kRunning;
  };
  int tid = g_thread_tid.load(std::memory_order_acquire);
  while (tid == 0 && started() && os::now_ms() < deadline) {
    os::yield_thread();  // created, not yet in purger_main: the kernel counts it already
    tid = g_thread_tid.load(std::memory_order_acquire);
  }
  if (tid == 0 || !os::thread_exists(tid)) return false;
  // Running, or on its way out by itself (retire, purge_thread=0): either way, until it is gone.
  g_stop.store(true, std::memory_order_seq_cst);
  purger_wake();
  while (os::thread_exists(tid) && os::now_ms() < deadline) os::yield_thread();
  g_stop.store(false, std::memory_order_seq_cst);
  PurgerState stopped = PurgerState::kStopped;  // the next allocation slow path starts it again
  g_purger_state.compare_exchange_strong(stopped, PurgerState::kWanted, std::memory_order_seq_cst);
  if (os::thread_exists(tid)) return false;
  // Its id may go to a thread of the program's later, which a later call must not wait for.
  g_thread_tid.compare_exchange_strong(tid, 0, std::memory_order_acq_rel);
  return true;
}

void purger_after_thread_attached() {
  if (g_purger_state.load(std::memory_order_relaxed) != PurgerState::kAwaitingThreads ||
      os::process_single_threaded())
    return;
  PurgerState expected = PurgerState::kAwaitingThreads;
  g_purger_state.compare_exchange_strong(expected, PurgerState::kWanted, std::memory_order_relaxed);
}

// The child of a fork has only the thread that forked. ThreadSanitizer kills a child that
// starts a thread after a multi-threaded fork, so under it the child does without (its memory
// goes back on its own calls, as with purge_thread=0).
void purger_after_fork_child() {
  const PurgerState state = g_purger_state.load(std::memory_order_relaxed);
  if (kTsan)
    g_purger_state.store(PurgerState::kOff, std::memory_order_relaxed);
  else if (state == PurgerState::kRunning || state == PurgerState::kStarting ||
           state == PurgerState::kStopped)
    g_purger_state.store(PurgerState::kWanted, std::memory_order_relaxed);
  g_purger_sleeping.store(false, std::memory_order_relaxed);
  g_thread_tid.store(0, std::memory_order_relaxed);
  g_next_dump_ms = 0;
}

void purger_start(bool allowed) {
  PurgerState expected = PurgerState::kWanted;
  if (!g_purger_state.compare_exchange_strong(expected, PurgerState::kStarting,
                                              std::memory_order_acquire))
    return;
  // Creating a thread allocates: the calls that re-enter malloc from here find the state
  // kStarting and leave it alone.
  // Nor in memcheck and ASan builds, which exist to find a program's bugs: the thread's own
  // start-up allocation (libc's thread descriptor) would stand in every leak summary.
  if (!allowed || option(Option::kPurgeThread) == 0 || TRAY_TRACK) {
    g_purger_state.store(PurgerState::kOff, std::memory_order_relaxed);
    return;
  }
  // Nor, unless a stats_interval needs it, in a program that has not created a thread: the
  // C library would count the process as multi-threaded from then on, for good. Its fork
  // would then take locks that a fork from a signal handler waits for (crash handlers do
  // that), and its stdio would lock every call. Such a program's memory goes back on its own
  // calls, as with purge_thread=0, until it starts a thread.
  if (os::process_single_threaded() && option(Option::kStatsInterval) == 0) {
    g_purger_state.store(PurgerState::kAwaitingThreads, std::memory_order_relaxed);
    return;
  }
  SamplingPause pause;  // what libc allocates for the thread is not the program's
  g_thread_tid.store(0, std::memory_order_relaxed);  // until the new thread runs
  const bool started = os::start_thread(purger_main);
  // Unless the new thread has ended already (purger_stop, purge_thread=0) and said what next.
  expected = PurgerState::kStarting;
  g_purger_state.compare_exchange_strong(expected, started ? PurgerState::kRunning : PurgerState::kOff,
                                         std::memory_order_acq_rel);
}

}  // namespace tray
