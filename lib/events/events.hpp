// The seam between the layers. A lower layer sometimes has to set off work that belongs to a
// layer above it: a slow path of the heaps meets an allocation the samplers chose, the pool
// leaves memory that only the purger thread gives back in time. It cannot include that layer,
// so it raises the event here: through the purger's signal (a state word and a futex word,
// which the purger thread in purge/ waits on) or through g_events, a table of handlers that
// the api layer (api/process.cpp) defines. The table is constant-initialised, so it holds from
// the first instruction of the process: before main, and when the dynamic loader makes the
// first call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

struct Block;
struct Heap;

// What the layers above do for the ones below. Every handler is for a slow path.
struct EventHandlers {
  // Starts the purger thread (purge/); called by purger_poll when it is wanted.
  void (*start_purger)();
  // The samplers in `fired` (Sampler bits, heap/types.hpp) chose this allocation of `size`
  // bytes, which their countdown counted as `sampled_bytes` (a small request, its class's
  // block size): a block they place themselves, or nullptr to allocate as usual (sample/).
  void* (*sampled_alloc)(unsigned fired, size_t size, size_t sampled_bytes, size_t alignment, bool zero);
  // The calling thread now holds `heap` (heap_attach_thread, outside every lock): it is to be
  // detached when the thread ends; the first one also sets the process up (the thread-exit
  // key, the fork handlers: api/process.cpp).
  void (*heap_attached)(Heap* heap);
  // The memory limit is reached (stats/limit.hpp): give back to the OS all that can go, from
  // the caches, the pool, the heaps' empty and sparse pages (api/). Called where the allocator
  // is about to take memory from the OS, with none of its locks held.
  void (*reclaim_memory)();
  // A block of a big class of `size` bytes (heap/tails.cpp), which the calling thread's heap
  // uses too seldom for a page of its own: a large block (api/), or nullptr with errno set.
  // From an allocation slow path holding no allocator lock, the heap consistent.
  void* (*big_block_alloc)(size_t size);
};
extern const EventHandlers g_events;

// --- The purger's signal ---------------------------------------------------------------------
// The purger thread (purge/) gives freed memory back once its delay runs out. Whoever leaves
// something for it says so here; the thread itself starts lazily, from an allocation slow
// path (purger_poll), since creating a thread allocates.

// A deadline that never comes: nothing to wait for.
inline constexpr uint64_t kNeverMs = UINT64_MAX;

// kStopped: ended by purger_stop, which makes it kWanted once the thread is gone (an exiting
// thread that allocates must not start the next one while the kernel still counts it).
// kAwaitingThreads: wanted, in a program that has no thread of its own yet (purger_start); the
// first thread of the program that takes a heap makes it kWanted.
enum class PurgerState : uint32_t { kNone, kWanted, kStarting, kRunning, kStopped, kOff, kAwaitingThreads };
extern constinit std::atomic<PurgerState> g_purger_state;
// The futex word the thread sleeps on, bumped to end its sleep early; and whether it sleeps,
// or is about to, with no deadline. The signal functions below and the thread touch them.
extern constinit std::atomic<uint32_t> g_purger_wake;
extern constinit std::atomic<bool> g_purger_sleeping;

// The seq_cst fence that pairs purger_notify with the thread's going to sleep: each side
// stores, fences, then loads what the other stored. ThreadSanitizer does not model fences (GCC
// warns, -Wtsan); under it, a seq_cst read-modify-write of one word both sides share orders
// them as the fences do (the later one reads from the earlier), in a way it sees.
#if defined(TRAY_TSAN)
extern constinit std::atomic<uint32_t> g_purger_fence_word;
#endif
TRAY_INLINE void purger_fence() {
#if defined(TRAY_TSAN)
  g_purger_fence_word.fetch_add(0, std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// Something new may need the purger: memory to give back after a delay, or a new
// stats_interval. Wakes the thread if it sleeps without a deadline, or marks it wanted.
// Lock-free; safe under the allocator's locks.
void purger_notify();
// purger_notify for work that only the thread does (a stats_interval): wanted even in a
// program that has no thread of its own (PurgerState::kAwaitingThreads).
void purger_require();
// Ends the thread's sleep, deadline or not, for work that must not wait for its next deadline
// (mappings to unmap), or because the program's last thread with a heap has ended. One futex
// call; only while the thread runs.
void purger_wake();
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

// Starts the purger if it is wanted: only where re-entering malloc is safe (no allocator lock
// held, and the calling thread's heap consistent), so on allocation slow paths only, never in
// a free: glibc frees a finished thread's TLS while it holds the lock on its stack cache
// (pthread_join), which pthread_create takes too.
// True if it tried to start it (and so allocated).
TRAY_INLINE bool purger_poll() {
  if (TRAY_LIKELY(g_purger_state.load(std::memory_order_relaxed) != PurgerState::kWanted) ||
      tls_purger_holds != 0)
    return false;
  g_events.start_purger();
  return true;
}

}  // namespace tray
