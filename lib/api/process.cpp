// The process as a whole: the handlers of the events lower layers raise (events/events.hpp),
// the set-up done once per process, what happens when a thread with a heap ends, and fork.
// This file is the one place that knows every lock of the allocator and their order.
//
// The global lock order, outermost first. A thread that holds one of these may take only the
// ones after it; fork's prepare handler takes them all in this order, after stdio's list lock
// (see fork_prepare), and both of its release handlers let them go in the reverse order:
//   1. the heap profile's lock       (sample/prof.cpp: it refills its heap under the lock)
//   2. the guarded slots' lock       (sample/guard.cpp)
//   3. the program heaps: their list, each heap's lock, the spare parts (heap/program.cpp)
//   4. the parked heaps' collection, then the heaps' list (heap/heap.cpp)
//   5. the large cache: its deferred unmaps, then the cache itself (large/large_cache.cpp);
//      a program heap's large blocks (large/large_owner.cpp) are a leaf beside them
//   6. the span arenas, in index order (span/span.cpp)
//   7. the segment pool              (segment/segment.cpp)
// The set-up lock below is a leaf: nothing is taken under it.

#include "api/api.hpp"
#include "events/events.hpp"
#include "heap/heap.hpp"
#include "large/large.hpp"
#include "platform/platform.hpp"
#include "purge/purge.hpp"
#include "report/report.hpp"
#include "sample/sample.hpp"
#include "segment/segment.hpp"
#include "span/span.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

pthread_key_t g_exit_key;
std::atomic<bool> g_process_ready{false};

void on_thread_exit(void* value) {
  [[maybe_unused]] TrackScope scope;  // the remote frees' links lie in free blocks
  heap_detach_thread(static_cast<Heap*>(value));
}

// Whether the fork in progress took the locks: only where another thread may hold one. In a
// process the C library counts as single-threaded no other thread exists, and the one that
// forks may hold a lock only if fork was called from a signal handler that interrupted the
// allocator: waiting for it would never end (glibc's fork takes none of its locks there
// either). A fork from a handler that interrupted the prepare step finds the flag as that
// step left it, and both forks agree.
bool g_fork_locked = false;

// stdio's list lock first, as glibc's fork takes it before its own malloc's locks: a thread
// in fflush(NULL) holds it while it waits for a stream's lock, whose holder may be in
// getline's realloc, waiting for one of ours.
void fork_prepare() {
  g_fork_locked = !os::process_single_threaded();
  if (!g_fork_locked) return;
  os::lock_stdio_for_fork();
  prof_lock_for_fork();
  guard_lock_for_fork();
  program_lock_for_fork();
  heap_lock_for_fork();
  large_lock_for_fork();
  span_lock_for_fork();
  segment_lock_for_fork();
}

// The same in parent and child: the thread that forked holds the locks in both, and is the
// child's only thread.
void fork_release() {
  segment_unlock_after_fork();
  span_unlock_after_fork();
  large_unlock_after_fork();
  heap_unlock_after_fork();
  program_unlock_after_fork();
  guard_unlock_after_fork();
  prof_unlock_after_fork();
}

void fork_release_parent() {
  if (!g_fork_locked) return;
  fork_release();
  os::unlock_stdio_after_fork();
}

void fork_release_child() {
  g_totals.threads_attached.store(tls_own_heap != nullptr ? 1 : 0, std::memory_order_relaxed);
  purger_after_fork_child();
  report_after_fork_child();
  if (!g_fork_locked) return;
  // The parent's other threads are gone, and the child's new threads may get their thread
  // pointers: their heaps' pages must not let those threads' fast paths in.
  heap_forget_threads_after_fork(os::thread_pointer());
  segment_forget_owner_threads(os::thread_pointer());
  fork_release();
  os::reset_stdio_after_fork_child();
}

// Once per process, outside every lock: both calls may allocate, which re-enters malloc
// through the heap the calling thread has just been given.
void process_setup() {
  static os::Mutex setup_lock;
  os::LockGuard guard(setup_lock);
  if (g_process_ready.load(std::memory_order_relaxed)) return;
  if (os::thread_key_create(&g_exit_key, on_thread_exit) != 0)
    fatal("cannot create the thread-exit key (pthread_key_create failed)");
  os::register_atfork(fork_prepare, fork_release_parent, fork_release_child);
  g_process_ready.store(true, std::memory_order_release);
}

// The calling thread now holds `heap`: it is parked again when the thread ends.
void on_heap_attached(Heap* heap) {
  if (!g_process_ready.load(std::memory_order_acquire)) process_setup();
  os::thread_key_set(g_exit_key, heap);
  purger_after_thread_attached();
}

// The memory limit is reached: all that can go goes, the heaps' sparse pages included.
void reclaim_memory() { trim_all(); }

void* big_block_alloc(size_t size) { return alloc_large_block(size); }

// Debug mode runs no purger: its checked heaps give back no page they empty.
void start_purger() { purger_start(!debug_mode()); }

}  // namespace

extern constinit const EventHandlers g_events = {
    .start_purger = start_purger,
    .sampled_alloc = sample_alloc,
    .heap_attached = on_heap_attached,
    .reclaim_memory = reclaim_memory,
    .big_block_alloc = big_block_alloc,
};

}  // namespace tray
