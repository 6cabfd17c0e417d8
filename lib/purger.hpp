// The idle purger: a helper thread that gives freed memory back to the OS when its delay runs
// out, whether or not the program calls the allocator again, and writes the periodic
// statistics dumps (stats_interval). Without it, dirty units and cached large blocks wait for
// the next trip to the page pool, which a program that has gone quiet never makes.
//
// It starts lazily: whoever leaves something to purge (or sets stats_interval) marks it as
// wanted, and the next allocation slow path that holds no lock and has its heap in order starts
// it, since creating a thread allocates. Never a free: glibc frees a finished thread's TLS
// while it holds the lock on its stack cache (pthread_join), which pthread_create takes too, so
// a free that started a thread there would wait on itself for good. A large allocation marks
// it wanted at once, so that a program that frees its large blocks and goes quiet has it
// running. Option purge_thread=0 keeps it from ever starting.
// A forked child has no such thread; it is marked as wanted there and starts again the same way.
// Once started it stays while any thread of the program holds a heap, asleep without a
// deadline when nothing waits, so that frees (which cannot start it) always find it there.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/bits.hpp"

namespace tray {

// A deadline that never comes: nothing to wait for.
inline constexpr uint64_t kNeverMs = UINT64_MAX;

// kStopped: ended by purger_stop, which makes it kWanted once the thread is gone (an exiting
// thread that allocates must not start the next one while the kernel still counts it).
enum class PurgerState : uint32_t { kNone, kWanted, kStarting, kRunning, kStopped, kOff };
extern constinit std::atomic<PurgerState> g_purger_state;

// Something new may need the purger: memory to give back after a delay, or a new
// stats_interval. Wakes the thread if it sleeps without a deadline, or marks it wanted.
// Lock-free; safe under the allocator's locks.
void purger_notify();
// Ends the thread's sleep, deadline or not, for work that must not wait for its next deadline
// (mappings to unmap), or because the program's last thread with a heap has ended. One futex
// call; only while the thread runs.
void purger_wake();
// Starts the thread if it is wanted. Only where re-entering malloc is safe: no allocator lock
// held, and the calling thread's heap consistent.
void purger_start();
// Ends the thread, if it runs, and waits until the kernel no longer counts it, for the calls
// that fail in a process with more than one thread (unshare and setns of user and mount
// namespaces): the program may not know it has a second one. True if it ended a thread. It
// starts again at the next allocation slow path, as after a fork.
bool purger_stop();
// In the child of a fork (heap.cpp's fork handler, registered at the process's first
// allocation, whether or not the thread ever started): the thread is not there.
void purger_after_fork_child();
// Code that reaches the heap's slow paths while holding a lock that a nested malloc could
// take again (prof's, whose heap refills through them) holds the purger back meanwhile.
extern __thread unsigned tls_purger_holds;
// True on the purger thread: a heap it came to hold (through something libc allocates in it)
// does not count as a thread of the program's.
extern __thread bool tls_in_purger;
struct PurgerHold {
  PurgerHold() { ++tls_purger_holds; }
  ~PurgerHold() { --tls_purger_holds; }
  PurgerHold(const PurgerHold&) = delete;
  PurgerHold& operator=(const PurgerHold&) = delete;
};

// A large block exists: its free will leave memory to give back.
TRAY_INLINE void purger_expect() {
  PurgerState state = g_purger_state.load(std::memory_order_relaxed);
  if (state == PurgerState::kNone)
    g_purger_state.compare_exchange_strong(state, PurgerState::kWanted, std::memory_order_relaxed);
}

// Starts the purger if it is wanted: on allocation slow paths only (see above).
TRAY_INLINE void purger_poll() {
  if (TRAY_UNLIKELY(g_purger_state.load(std::memory_order_relaxed) == PurgerState::kWanted) &&
      tls_purger_holds == 0)
    purger_start();
}

}  // namespace tray
