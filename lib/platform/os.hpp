// The platform layer: every call into the operating system made by the allocator goes
// through here (os.cpp and os_process.cpp), so the rest of lib/ is portable C++ and a port
// touches this folder only.
// Nothing here allocates.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray::os {

// System calls that change the address space, counted for the statistics (relaxed: they are
// rare and a dump may read them while they move).
struct CallCounts {
  std::atomic<uint64_t> mmap{0};
  std::atomic<uint64_t> munmap{0};
  std::atomic<uint64_t> madvise{0};
  std::atomic<uint64_t> mremap{0};
  std::atomic<uint64_t> mprotect{0};
};
extern CallCounts g_calls;

// Anonymous read-write mapping of `bytes`, or nullptr.
void* map(size_t bytes);
// Anonymous read-only mapping of `bytes` (zeros, never charged to the commit limit), or nullptr.
void* map_read_only(size_t bytes);
// Read-write mapping whose start is a multiple of `alignment` (a power of two >= page size),
// charged to the commit limit (the kernel may refuse what it could never back).
void* map_aligned(size_t bytes, size_t alignment);
// Address space only (no access), aligned like map_aligned: a landing place for remap_to.
void* reserve_aligned(size_t bytes, size_t alignment);
void unmap(void* p, size_t bytes);
// Gives the pages back to the OS; the range stays mapped and reads as zero afterwards.
// false if the kernel refused: the pages then keep what they held.
bool purge(void* p, size_t bytes);
// Transparent huge pages for a mapped range (2 MiB aligned to matter): MADV_HUGEPAGE when
// `huge`, MADV_NOHUGEPAGE otherwise. The advice sticks to the range's mapping until it is
// unmapped; purges keep it. false if the kernel refused (no THP support, an old kernel).
bool advise_huge_pages(void* p, size_t bytes, bool huge);
// AnonHugePages of /proc/self/smaps_rollup: the process's anonymous memory that huge pages
// back, in bytes; -1 if unreadable. Reads the file with open/read/close into the stack (the
// kernel walks every mapping: for dumps and tests, not for the allocator's paths).
int64_t anon_huge_page_bytes();
// The kernel's THP mode, the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled:
// "always", "madvise", "never", or "unknown" if unreadable.
const char* thp_kernel_mode();
// A range for purge_ranges, and what became of it.
struct PurgeRange {
  void* start;
  size_t bytes;
  bool purged;  // out: purge's result for this range
};
// purge for many ranges: one system call per kPurgeListRanges of them where the kernel takes a
// list (process_madvise on the process itself), one madvise each elsewhere. Returns how many
// were purged. Fault injection (below) counts and fails ranges one at a time, as purge does.
inline constexpr size_t kPurgeListRanges = 32;  // 768 bytes of a slow path's stack
size_t purge_ranges(PurgeRange* ranges, size_t count);
// Makes the range inaccessible (any touch faults) and gives its pages back to the OS.
void protect_none(void* p, size_t bytes);
// Makes the range inaccessible and keeps its pages (cheaper than protect_none when they will be
// made accessible again soon).
void protect_no_access(void* p, size_t bytes);
// Makes the range readable and writable again (after reserve_aligned or protect_none).
bool protect_read_write(void* p, size_t bytes);
// Grows or shrinks a mapping without moving it; false if the neighbours are in the way.
bool remap_in_place(void* p, size_t old_bytes, size_t new_bytes);
// Moves a mapping onto `target` (a reservation of at least new_bytes), without copying.
bool remap_to(void* p, size_t old_bytes, size_t new_bytes, void* target);
// remap_to for a range the kernel holds as several mappings meeting at multiples of
// piece_bytes from p, which it will not move in one call: a piece at a time, the last one
// growing. False, with the range as it was (its bytes, not its pages: those already moved are
// copied back) and the target still mapped, if it refuses any piece or old_bytes is one piece.
bool remap_pieces_to(void* p, size_t old_bytes, size_t new_bytes, void* target, size_t piece_bytes);

// Fault injection, for tests of the out-of-memory paths: from this call on, the calls of the
// kinds in `kinds` are counted, and the `first`-th to the (first + count - 1)-th of them (from
// 1) fail as if the kernel had refused them with ENOMEM. count 0 disarms. A relaxed load on
// each of these system calls when disarmed; the allocation fast paths never reach them.
enum FaultKind : unsigned { kFaultMmap = 1, kFaultMremap = 2, kFaultMadvise = 4 };
void inject_faults(unsigned kinds, uint64_t first, uint64_t count);
uint64_t fault_calls_counted();  // calls of the armed kinds since inject_faults
uint64_t faults_injected();      // of which failed

// The OS page: the kernel's (4 KiB on x86-64; 4, 16 or 64 KiB on arm64), read once at the
// first call; in a build for tests with TRAY_TEST_PAGE_SIZE, that size, and then mappings and
// resident_pages go by it too.
size_t page_size();
uint64_t now_ms();  // monotonic, coarse: cheap enough for slow paths
// Whether the process has an address-space limit (RLIMIT_AS, ulimit -v). Read from the kernel
// at most every kLimitRecheckMs, since a program may set it at any time: cheap enough for a
// slow path that makes a system call anyway.
bool address_space_limited();
uint64_t random_u64();  // getrandom(2), or clock and addresses mixed where it is unavailable
int process_id();
int thread_id();      // gettid: async-signal-safe
// The calling thread's thread pointer (x86-64: the %fs base, which glibc points at the
// thread's own control block; arm64: TPIDR_EL0): one instruction, distinct for every live
// thread, and never 0. A thread's pointer can come back for a thread created after it ends.
TRAY_INLINE uintptr_t thread_pointer() {
  return reinterpret_cast<uintptr_t>(__builtin_thread_pointer());
}
void yield_thread();  // sched_yield
const char* env(const char* name);  // getenv: reads environ, never allocates
// The executable's path (readlink of /proc/self/exe, not terminated); its length, or -1.
ssize_t executable_path(char* out, size_t capacity);
// The definition of `name` that the dynamic loader finds after this library's own (RTLD_NEXT):
// the C library's malloc behind our overrides, say. nullptr if there is none. Not from inside
// malloc: the loader may allocate.
void* next_symbol(const char* name);

// Writes all of text[0, length) (again after EINTR and short writes); false if the kernel
// refused part of it (ENOSPC, EIO, a closed pipe), errno left as it was.
bool write_fd(int fd, const char* text, size_t length);
// What was formatted into `text` (core/format.hpp).
inline void write_text(int fd, const TextBuffer& text) { write_fd(fd, text.data(), text.length()); }
// A close-on-exec duplicate of fd, or -1.
int duplicate_fd(int fd);
// Opens `path` for appending (created 0644 if missing), close-on-exec; -1 on failure.
int open_append(const char* path);
void close_fd(int fd);
// The resident size of the whole process, from /proc/self/statm; 0 if unreadable.
// Async-signal-safe (open/read/close).
size_t resident_bytes();
// The first `capacity` bytes of a small file (/proc/self/statm, a cgroup's memory.max) with
// open/read/close, async-signal-safe and never allocating, errno left as it was: the bytes
// read, or -1 if the file could not be opened.
ssize_t read_small_file(const char* path, char* text, size_t capacity);
// The memory limit of the calling process's cgroup, as the files under `root` say ("" for the
// real ones; tests give a directory of their own that holds proc/self/cgroup,
// proc/self/mountinfo and the cgroup files): the lowest of cgroup v1's memory.limit_in_bytes
// and memory.soft_limit_in_bytes, or v2's memory.max and memory.high, over the process's
// cgroup and those above it. 0 if there is none. `source` gets the file it came from
// (terminated, cut to source_capacity). `scratch` is room for /proc/self/mountinfo (which can
// be long, and the caller may be on a small stack): nothing here allocates.
size_t cgroup_memory_limit(const char* root, char* scratch, size_t scratch_bytes, char* source,
                           size_t source_capacity);
// Which OS pages of [p, p + bytes) (page-aligned) are in memory: out[i] & 1 for the i-th
// (mincore). False if the kernel would not say.
bool resident_pages(const void* p, size_t bytes, unsigned char* out);
[[noreturn]] void abort_process();

// Signal number for a name such as "SIGUSR1", "USR1" or "10"; 0 if there is no such signal.
int signal_number(const char* name, size_t length);
// Runs handler(signo) on that signal (SA_RESTART), replacing what was there; false on failure.
bool set_signal_handler(int signo, void (*handler)(int));

// Backtraces for fatal reports. The C library's unwinder loads libgcc_s on its first use,
// which allocates: prepare_backtrace() does that early, outside the allocator, and
// write_backtrace() prints nothing until it has.
void prepare_backtrace();
void write_backtrace(int fd);
// The calling thread's stack for heap profiles: up to `capacity` return addresses, innermost
// first, leaving out the frames in the allocator's own code when it is a shared library (a
// statically linked allocator cannot be told apart from its program: its frames stay).
// 0 until prepare_backtrace has run. Never allocates once prepared. Takes the loader's lock
// for a moment (platform/unwind.cpp): not under a lock that free() may want, since dlclose
// frees under the loader's lock.
int capture_stack(void** frames, int capacity);
// What dladdr knows about a code address: the nearest exported symbol (nullptr if none; its
// offset in *offset) and the file it lies in (nullptr if none). Not async-signal-safe.
const char* symbol_of(const void* address, uintptr_t* offset, const char** file);
// Copies a file (such as /proc/self/maps) to fd with open/read/write: async-signal-safe.
void copy_file_to_fd(const char* path, int fd);
// Creates or truncates `path` for writing (0644, close-on-exec); -errno on failure.
int open_truncate(const char* path);
// rename(2): `to` becomes the file `from` was in one step, so a reader opens either the old file
// or the new one, whole (both in one file system); false on failure. errno left as it was.
bool rename_file(const char* from, const char* to);
// unlink(2), errno left as it was.
void remove_file(const char* path);
// Frames from capture_stack, one a line, symbolised as write_backtrace does.
void write_frames(int fd, void* const* frames, int count);

// Runs hook(faulting address) first on every SIGSEGV. The hook returns when the fault is not
// its business: the signal then goes to the handler installed before (a program's own), or
// takes its default action (the process ends by SIGSEGV, as it would have without us).
// Up to two hooks (guarded sampling's, debug mode's), each run in turn; the handler is
// installed with the first. A hook set twice is set once. False if sigaction failed or both
// places are taken.
bool set_fault_hook(void (*hook)(void* address));

// Where p lies if no allocator can have handed it out: "the calling thread's stack" (between
// the stack pointer and the top of the stack, when the thread runs on its own stack) or "the
// program's image" (a loaded segment of the executable); nullptr when it may be another
// allocator's block. For frees of pointers that are not ours (slow path: a system call).
const char* place_of_non_heap_pointer(const void* p);

int thread_key_create(pthread_key_t* key, void (*destructor)(void*));
void thread_key_set(pthread_key_t key, const void* value);
int register_atfork(void (*prepare)(), void (*parent)(), void (*child)());
// Whether the C library still counts the process as single-threaded: no thread was ever
// created (glibc's __libc_single_threaded). Its fork then takes none of its own locks, which
// keeps fork usable from a signal handler; a thread of ours would end that.
bool process_single_threaded();
// stdio's list of streams (glibc's _IO_list_lock), which glibc's fork takes after the fork
// handlers' prepare step: a fork handler that takes locks a stdio call may wait for takes this
// one first. Recursive, so glibc's own take in the same fork is free. In the child, glibc
// resets it (as reset_stdio_after_fork_child does again); the parent lets it go.
void lock_stdio_for_fork();
void unlock_stdio_after_fork();
void reset_stdio_after_fork_child();

// Starts a detached thread running body(), with every signal blocked in it (the program's
// handlers must not land on a thread it does not know of); false if it cannot. The C
// library allocates for the new thread: never from under one of the allocator's locks.
bool start_thread(void (*body)());
// Whether thread `tid` of this process is still there as far as the kernel counts threads
// (tgkill with signal 0): a thread that pthread_join saw end may not have left yet.
bool thread_exists(int tid);
// unshare(2) and setns(2), straight to the kernel (glibc's are plain wrappers): -1 and errno
// on failure.
int unshare_namespaces(int flags);
int enter_namespace(int fd, int type);
// Sleeps while word == expected, at most timeout_ms (0: no limit), or until wake_all(word).
void wait_on(std::atomic<uint32_t>& word, uint32_t expected, uint64_t timeout_ms);
void wake_all(std::atomic<uint32_t>& word);

// A plain mutex for slow paths, constant-initialised so that it works before any constructor:
// a futex word, 0 free, 1 held, 2 held with a waiter asleep. Taking and leaving a free lock is
// one atomic instruction each, where glibc's adaptive mutex took 30-75 instructions per call
// (7% of a span block's allocation and free, which take two locks). A waiter spins a little
// before it sleeps: every lock of ours is held for a few hundred instructions, far less than a
// futex sleep and wake-up (tens of microseconds). The kernel is called through syscall(), which
// ASan leaves alone, so -DTRAY_ASAN=ON builds use it too (ASan intercepts pthread_mutex_lock,
// and calls malloc while it sets that interceptor up).
class Mutex {
 public:
  constexpr Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  void lock() {
    if (!try_lock()) lock_contended();
  }
  bool try_lock() {
    uint32_t expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() {
    if (state_.exchange(0, std::memory_order_release) == 2) wake_one_waiter();
  }

 private:
  void lock_contended();
  void wake_one_waiter();
  std::atomic<uint32_t> state_{0};
};

// Cancellation (pthread_cancel) held off while it lives: a dump writes through write and open,
// which are cancellation points, and a thread unwound there would leave the dump's lock or
// flag held, and every later dump waiting for it (glibc's malloc_stats holds it off too).
class CancelDisabled {
 public:
  CancelDisabled();
  ~CancelDisabled();
  CancelDisabled(const CancelDisabled&) = delete;
  CancelDisabled& operator=(const CancelDisabled&) = delete;

 private:
  int previous_;
};

class LockGuard {
 public:
  explicit LockGuard(Mutex& m) : mutex_(m) { mutex_.lock(); }
  ~LockGuard() { mutex_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  Mutex& mutex_;
};

}  // namespace tray::os
