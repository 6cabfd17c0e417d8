// The platform layer's memory side (os.hpp): mappings, purges, protection and remaps with
// their counts and injected faults, and the small services beside them (time, randomness,
// files, the environment). Signals, backtraces, threads and locks are in os_process.cpp.
#include "platform/os.hpp"
#include "core/core.hpp"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>  // rename
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#if TRAY_ASAN
#include <sys/syscall.h>
// In a program built with -fsanitize=address, ASan's runtime intercepts these C library
// functions and, while it sets its interceptors up, calls our malloc (the loader allocates an
// error message for each symbol it cannot find): an interceptor whose real function is not
// known yet jumps to address 0. The system calls themselves are never intercepted.
namespace {
void* raw_mmap(void* a, size_t n, int prot, int flags, int fd, off_t off) {
  return reinterpret_cast<void*>(syscall(SYS_mmap, a, n, prot, flags, fd, off));
}
void* raw_mremap(void* p, size_t old_bytes, size_t new_bytes, int flags, void* target = nullptr) {
  return reinterpret_cast<void*>(syscall(SYS_mremap, p, old_bytes, new_bytes, flags, target));
}
int raw_munmap(void* p, size_t n) { return int(syscall(SYS_munmap, p, n)); }
int raw_madvise(void* p, size_t n, int advice) { return int(syscall(SYS_madvise, p, n, advice)); }
int raw_mprotect(void* p, size_t n, int prot) { return int(syscall(SYS_mprotect, p, n, prot)); }
int raw_clock_gettime(clockid_t clock, timespec* ts) { return int(syscall(SYS_clock_gettime, clock, ts)); }
ssize_t raw_getrandom(void* buffer, size_t n, unsigned flags) { return syscall(SYS_getrandom, buffer, n, flags); }
ssize_t raw_write(int fd, const void* text, size_t n) { return syscall(SYS_write, fd, text, n); }
}  // namespace
#define mmap(...) raw_mmap(__VA_ARGS__)
#define mremap(...) raw_mremap(__VA_ARGS__)
#define munmap(...) raw_munmap(__VA_ARGS__)
#define madvise(...) raw_madvise(__VA_ARGS__)
#define mprotect(...) raw_mprotect(__VA_ARGS__)
#define clock_gettime(...) raw_clock_gettime(__VA_ARGS__)
#define getrandom(...) raw_getrandom(__VA_ARGS__)
#define write(...) raw_write(__VA_ARGS__)
#endif

namespace tray::os {

constinit CallCounts g_calls;

namespace {

void count_call(std::atomic<uint64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }

// Relaxed throughout: a test arms the plan before the workload it sweeps, and reads the
// counts after joining it.
struct FaultPlan {
  std::atomic<unsigned> kinds{0};
  std::atomic<uint64_t> first{0};
  std::atomic<uint64_t> last{0};
  std::atomic<uint64_t> counted{0};
  std::atomic<uint64_t> injected{0};
};
constinit FaultPlan g_faults;

bool inject_fault(unsigned kind) {
  if (TRAY_LIKELY((g_faults.kinds.load(std::memory_order_relaxed) & kind) == 0)) return false;
  const uint64_t n = g_faults.counted.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n < g_faults.first.load(std::memory_order_relaxed) ||
      n > g_faults.last.load(std::memory_order_relaxed))
    return false;
  g_faults.injected.fetch_add(1, std::memory_order_relaxed);
  errno = ENOMEM;
  return true;
}

// The kernel's page: what mmap aligns mappings to, and what mincore and /proc count in.
size_t kernel_page_size() {
  static std::atomic<size_t> cached{0};  // threads may race to fill it, with the same value
  size_t size = cached.load(std::memory_order_relaxed);
  if (TRAY_UNLIKELY(size == 0)) {
    size = size_t(sysconf(_SC_PAGESIZE));
    cached.store(size, std::memory_order_relaxed);
  }
  return size;
}

#if defined(TRAY_TEST_PAGE_SIZE)
// The test build that plays a kernel of larger pages (CMake's TRAY_TEST_PAGE_SIZE, see
// page_size): a mapping starts on one of its pages, as that kernel's would. The padding goes
// with plain munmap calls, which the counts that tests read leave out.
static_assert(is_pow2(TRAY_TEST_PAGE_SIZE) && TRAY_TEST_PAGE_SIZE >= 4096);
void* mmap_on_test_pages(size_t bytes, int prot, int flags) {
  const size_t kernel = kernel_page_size();
  const size_t used = align_up(bytes, kernel);
  const size_t padded = used + TRAY_TEST_PAGE_SIZE - kernel;
  void* p = mmap(nullptr, padded, prot, flags, -1, 0);
  if (p == MAP_FAILED) return p;
  auto* raw = static_cast<char*>(p);
  auto* aligned = reinterpret_cast<char*>(align_up(reinterpret_cast<uintptr_t>(raw), TRAY_TEST_PAGE_SIZE));
  const size_t head = size_t(aligned - raw);
  if (head != 0) munmap(raw, head);
  if (padded - head != used) munmap(aligned + used, padded - head - used);
  return aligned;
}
#endif

void* map_with(size_t bytes, int prot, int flags = MAP_NORESERVE) {
  count_call(g_calls.mmap);
  if (inject_fault(kFaultMmap)) return nullptr;
#if defined(TRAY_TEST_PAGE_SIZE)
  void* p = mmap_on_test_pages(bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags);
#else
  void* p = mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
#endif
  return p == MAP_FAILED ? nullptr : p;
}

void unmap_range(void* p, size_t bytes) {
  count_call(g_calls.munmap);
  munmap(p, bytes);
}

// Over-map by `alignment` and cut the excess off both ends: three system calls, but segments
// and large blocks are mapped rarely, and the result never depends on address hints (which
// sanitizer runtimes reserve for themselves).
void* map_aligned_with(size_t bytes, size_t alignment, int prot, int flags) {
  if (alignment <= page_size()) return map_with(bytes, prot, flags);
  const size_t padded = bytes + alignment;
  if (padded < bytes) return nullptr;
  auto* raw = static_cast<char*>(map_with(padded, prot, flags));
  if (raw == nullptr) return nullptr;
  const uintptr_t start = align_up(reinterpret_cast<uintptr_t>(raw), alignment);
  auto* aligned = reinterpret_cast<char*>(start);
  const size_t head = size_t(aligned - raw);
  const size_t tail = padded - head - bytes;
  if (head != 0) unmap_range(raw, head);
  if (tail != 0) unmap_range(aligned + bytes, tail);
  return aligned;
}

}  // namespace

void* map(size_t bytes) { return map_with(bytes, PROT_READ | PROT_WRITE); }

void* map_read_only(size_t bytes) { return map_with(bytes, PROT_READ); }

// Without MAP_NORESERVE: memory that will be written is charged as glibc's is, so the
// kernel's overcommit policy refuses a request no machine could back (malloc of 1 TiB is NULL
// and ENOMEM under the default heuristic, as with glibc, instead of a mapping that gets the
// program killed when it is touched).
void* map_aligned(size_t bytes, size_t alignment) {
  return map_aligned_with(bytes, alignment, PROT_READ | PROT_WRITE, 0);
}

void* reserve_aligned(size_t bytes, size_t alignment) {
  return map_aligned_with(bytes, alignment, PROT_NONE, MAP_NORESERVE);
}

void unmap(void* p, size_t bytes) {
  const int saved = errno;  // free() must leave errno alone
  unmap_range(p, bytes);
  errno = saved;
}

bool purge(void* p, size_t bytes) {
  // MADV_DONTNEED rather than MADV_FREE: the resident size drops at once, which is what
  // people watching RSS (and our tests) expect; reuse then faults in zero pages.
  const int saved = errno;
  count_call(g_calls.madvise);
  const bool purged = !inject_fault(kFaultMadvise) && madvise(p, bytes, MADV_DONTNEED) == 0;
  errno = saved;
  return purged;
}

// The system call itself, as the ASan build's raw_madvise: advice is no purge, so no fault
// injection either.
bool advise_huge_pages(void* p, size_t bytes, bool huge) {
  const int saved = errno;
  count_call(g_calls.madvise);
  const bool done = syscall(SYS_madvise, p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) == 0;
  errno = saved;
  return done;
}

// With the system calls themselves: no C library interceptor between (see above).
ssize_t read_small_file(const char* path, char* text, size_t capacity) {
  const int saved = errno;
  const int fd = int(syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC));
  ssize_t length = -1;
  if (fd >= 0) {
    // A file of /proc or /sys may come a piece per read.
    length = 0;
    while (size_t(length) < capacity) {
      const ssize_t n = syscall(SYS_read, fd, text + length, capacity - size_t(length));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      length += n;
    }
    syscall(SYS_close, fd);
  }
  errno = saved;
  return length;
}

namespace {

// strstr without the C library (an ASan interceptor may not be ready yet, see above): where
// the first `word` in `text` ends, nullptr if there is none.
const char* find_end_of(const char* text, const char* word) {
  if (text == nullptr) return nullptr;
  for (; *text != '\0'; ++text) {
    size_t i = 0;
    while (word[i] != '\0' && text[i] == word[i]) ++i;
    if (word[i] == '\0') return text + i;
  }
  return nullptr;
}

}  // namespace

int64_t anon_huge_page_bytes() {
  char text[2048];  // smaps_rollup is some 700 bytes
  const ssize_t length = read_small_file("/proc/self/smaps_rollup", text, sizeof text - 1);
  if (length <= 0) return -1;
  text[length] = '\0';
  const char* value = find_end_of(text, "\nAnonHugePages:");
  if (value == nullptr) return -1;
  while (*value == ' ') ++value;
  int64_t kib = 0;
  for (; *value >= '0' && *value <= '9'; ++value) kib = kib * 10 + (*value - '0');
  return kib << 10;
}

const char* thp_kernel_mode() {
  char text[128];
  const ssize_t length =
      read_small_file("/sys/kernel/mm/transparent_hugepage/enabled", text, sizeof text - 1);
  if (length <= 0) return "unknown";
  text[length] = '\0';
  for (const char* mode : {"always", "madvise", "never"}) {
    char bracketed[16];
    TextBuffer word(bracketed, sizeof bracketed - 1);
    word.chr('[').str(mode).chr(']');
    bracketed[word.length()] = '\0';
    if (find_end_of(text, bracketed) != nullptr) return mode;
  }
  return "unknown";
}

namespace {

// process_madvise(2) on the calling process takes a list of ranges: the sparse pass gives back
// thousands of one- and two-page ranges (22k in the fragmentation workload), and one call per
// list saves most of a madvise's cost each (0.57 against 1.0-1.2 us per page, measured on
// Linux 6.18), the TLB flush included where a second thread ran on another core. Its handle
// PIDFD_SELF_THREAD_GROUP (not in older headers) names this process without a file descriptor:
// the program cannot close it, and after fork it names the child. Kernels that do not know the
// handle or refuse MADV_DONTNEED there fail the call; lists are then off for the process.
constexpr int kPidfdSelfThreadGroup = -10001;
constinit std::atomic<bool> g_lists_refused{false};

// A thread under a seccomp filter never makes the call: a filter written before the call
// existed may kill the process for it (OpenSSH's privilege-separated child does, for any call
// not on its list), where one madvise a range is what every malloc does. A program can install
// a filter at any time, on one thread or all, so each thread looks at its own state again once
// a second and in a new process (a forked child starts with its parent's copy of this); a
// filter, once there, stays. What is left is the second after a filter comes: a program that
// installs one that kills unknown calls long after its start may die in that second.
constexpr uint64_t kSeccompRecheckMs = 1000;
struct ListCheck {
  int pid;  // 0 until the thread's first look
  bool unfiltered;
  uint64_t checked_ms;
};
__thread ListCheck tls_list_check;

// True only if /proc says this thread has no seccomp filter ("Seccomp:\t0"). The field is
// some 900 bytes in; a thread whose list of groups pushes it past the buffer reads as filtered.
bool thread_unfiltered() {
  char text[2048];
  const ssize_t length = read_small_file("/proc/thread-self/status", text, sizeof text - 1);
  if (length <= 0) return false;
  text[length] = '\0';
  const char* value = find_end_of(text, "\nSeccomp:\t");
  return value != nullptr && value[0] == '0' && (value[1] == '\n' || value[1] == '\0');
}

bool purge_list_allowed() {
  if (g_lists_refused.load(std::memory_order_relaxed) ||
      (g_faults.kinds.load(std::memory_order_relaxed) & kFaultMadvise) != 0)
    return false;
  ListCheck& check = tls_list_check;
  const uint64_t now = now_ms();
  const int pid = process_id();
  if (check.pid != pid || (check.unfiltered && now - check.checked_ms >= kSeccompRecheckMs)) {
    // valgrind does not know the system call either, and warns on its first use.
    check = {pid, find_end_of(env("LD_PRELOAD"), "vgpreload") == nullptr && thread_unfiltered(), now};
  }
  return check.unfiltered;
}

// Purges up to kPurgeListRanges ranges in one call. The kernel goes through them in order and
// stops at the first it refuses: how many went before that; -1 if the call failed outright.
ptrdiff_t purge_list(PurgeRange* ranges, size_t count) {
  iovec list[kPurgeListRanges];
  for (size_t i = 0; i < count; ++i) list[i] = {ranges[i].start, ranges[i].bytes};
  count_call(g_calls.madvise);
  const ssize_t advised =
      syscall(SYS_process_madvise, kPidfdSelfThreadGroup, list, count, MADV_DONTNEED, 0u);
  if (advised < 0) return -1;
  size_t done = 0;
  for (size_t left = size_t(advised); done < count && ranges[done].bytes <= left; ++done) {
    left -= ranges[done].bytes;
    ranges[done].purged = true;
  }
  return ptrdiff_t(done);
}
}  // namespace

size_t purge_ranges(PurgeRange* ranges, size_t count) {
  const int saved = errno;
  size_t purged = 0;
  for (size_t next = 0; next < count;) {
    const size_t n = count - next < kPurgeListRanges ? count - next : kPurgeListRanges;
    const ptrdiff_t listed = n > 1 && purge_list_allowed() ? purge_list(ranges + next, n) : 0;
    if (listed > 0) {
      next += size_t(listed);
      purged += size_t(listed);
      if (size_t(listed) == n) continue;
    }
    // The range the list stopped at, or every range without a list: on its own. If that one
    // goes where the list failed outright, the list itself was refused.
    PurgeRange& range = ranges[next++];
    range.purged = purge(range.start, range.bytes);
    purged += range.purged;
    if (listed < 0 && range.purged) g_lists_refused.store(true, std::memory_order_relaxed);
  }
  errno = saved;
  return purged;
}

namespace {
// mprotect, counted, leaving errno as it was (free() must not change it).
bool protect(void* p, size_t bytes, int prot) {
  const int saved = errno;
  count_call(g_calls.mprotect);
  const bool done = mprotect(p, bytes, prot) == 0;
  errno = saved;
  return done;
}
}  // namespace

void protect_none(void* p, size_t bytes) {
  protect(p, bytes, PROT_NONE);
  purge(p, bytes);
}

void protect_no_access(void* p, size_t bytes) { protect(p, bytes, PROT_NONE); }

bool protect_read_write(void* p, size_t bytes) { return protect(p, bytes, PROT_READ | PROT_WRITE); }

// ThreadSanitizer does not intercept mremap: memory a mapping moves or grows into keeps the
// shadow of what lay there before, and the new owner's accesses show as races with the old
// owner's. Under TSan, large blocks are copied instead; the other builds test mremap.
#if defined(TRAY_TSAN)
constexpr bool kRemapWorks = false;
#else
constexpr bool kRemapWorks = true;
#endif

namespace {
bool move_to(void* p, size_t old_bytes, size_t new_bytes, int flags, void* target) {
  count_call(g_calls.mremap);
  if (!kRemapWorks || inject_fault(kFaultMremap)) return false;
  return mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE | MREMAP_FIXED | flags, target) != MAP_FAILED;
}
}  // namespace

bool remap_in_place(void* p, size_t old_bytes, size_t new_bytes) {
  count_call(g_calls.mremap);
  if (!kRemapWorks || inject_fault(kFaultMremap)) return false;
  return mremap(p, old_bytes, new_bytes, 0) != MAP_FAILED;
}

bool remap_to(void* p, size_t old_bytes, size_t new_bytes, void* target) {
  return move_to(p, old_bytes, new_bytes, 0, target);
}

bool remap_pieces_to(void* p, size_t old_bytes, size_t new_bytes, void* target, size_t piece_bytes) {
  if (old_bytes <= piece_bytes) return false;  // one piece: remap_to was that call
  auto* from = static_cast<char*>(p);
  auto* to = static_cast<char*>(target);
  const size_t last = old_bytes - piece_bytes;
  // Every piece but the last leaves its old range mapped and empty behind it: until the last
  // one has moved, all of the old range is still ours (no other thread can map anything
  // there), so a refusal can put the moved pieces back. They are copied back, not moved: the
  // target must stay mapped, since it may lie inside a block (fill_from_cache's target).
  size_t moved = 0;
  while (moved < last && move_to(from + moved, piece_bytes, piece_bytes, MREMAP_DONTUNMAP, to + moved))
    moved += piece_bytes;
  if (moved == last && move_to(from + last, piece_bytes, piece_bytes + new_bytes - old_bytes, 0, to + last)) {
    unmap_range(from, last);
    return true;
  }
  memcpy(from, to, moved);
  return false;
}

void inject_faults(unsigned kinds, uint64_t first, uint64_t count) {
  g_faults.kinds.store(0, std::memory_order_relaxed);
  g_faults.counted.store(0, std::memory_order_relaxed);
  g_faults.injected.store(0, std::memory_order_relaxed);
  g_faults.first.store(first, std::memory_order_relaxed);
  const uint64_t last = count > UINT64_MAX - first ? UINT64_MAX : first + count - 1;
  g_faults.last.store(last, std::memory_order_relaxed);
  if (count != 0) g_faults.kinds.store(kinds, std::memory_order_relaxed);
}

uint64_t fault_calls_counted() { return g_faults.counted.load(std::memory_order_relaxed); }

uint64_t faults_injected() { return g_faults.injected.load(std::memory_order_relaxed); }

// A build for tests only (CMake's TRAY_TEST_PAGE_SIZE, a multiple of the kernel's page) runs
// as if the kernel's pages were that large: this machine boots no kernel of 16 or 64 KiB
// pages, which arm64 machines run.
size_t page_size() {
#if defined(TRAY_TEST_PAGE_SIZE)
  return TRAY_TEST_PAGE_SIZE;
#else
  return kernel_page_size();
#endif
}

uint64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

namespace {
constexpr uint64_t kLimitRecheckMs = 100;
std::atomic<uint64_t> g_limit_checked_ms{0};
std::atomic<bool> g_limited{false};
}  // namespace

bool address_space_limited() {
  const uint64_t now = now_ms();
  const uint64_t checked = g_limit_checked_ms.load(std::memory_order_relaxed);
  if (checked != 0 && now - checked < kLimitRecheckMs) return g_limited.load(std::memory_order_relaxed);
  rlimit limit;
  const bool limited = getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
  g_limited.store(limited, std::memory_order_relaxed);
  g_limit_checked_ms.store(now == 0 ? 1 : now, std::memory_order_relaxed);
  return limited;
}

uint64_t random_u64() {
  uint64_t value = 0;
  if (getrandom(&value, sizeof value, GRND_NONBLOCK) == ssize_t(sizeof value)) return value;
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  value = uint64_t(ts.tv_nsec) ^ (uint64_t(ts.tv_sec) << 32) ^ reinterpret_cast<uintptr_t>(&ts);
  value ^= uint64_t(getpid()) << 48;
  // splitmix64's finaliser, so that close inputs give unrelated outputs
  value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ULL;
  value = (value ^ (value >> 27)) * 0x94D049BB133111EBULL;
  return value ^ (value >> 31);
}

int process_id() { return int(getpid()); }

int thread_id() { return int(gettid()); }

void yield_thread() { sched_yield(); }

const char* env(const char* name) { return getenv(name); }

ssize_t executable_path(char* out, size_t capacity) {
  return readlink("/proc/self/exe", out, capacity);
}

void* next_symbol(const char* name) { return dlsym(RTLD_NEXT, name); }

bool write_fd(int fd, const char* text, size_t length) {
  const int saved = errno;
  while (length > 0) {
    const ssize_t n = write(fd, text, length);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    text += n;
    length -= size_t(n);
  }
  errno = saved;
  return length == 0;
}

int duplicate_fd(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 3); }

int open_append(const char* path) {
  const int saved = errno;
  const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  errno = saved;
  return fd;
}

void close_fd(int fd) {
  const int saved = errno;
  close(fd);
  errno = saved;
}

void copy_file_to_fd(const char* path, int fd) {
  const int saved = errno;
  const int in = open(path, O_RDONLY | O_CLOEXEC);
  if (in >= 0) {
    char buffer[4096];
    ssize_t n;
    while ((n = read(in, buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR))
      if (n > 0) write_fd(fd, buffer, size_t(n));
    close(in);
  }
  errno = saved;
}

int open_truncate(const char* path) {
  const int saved = errno;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fd = -errno;
  errno = saved;
  return fd;
}

bool rename_file(const char* from, const char* to) {
  const int saved = errno;
  const bool renamed = rename(from, to) == 0;
  errno = saved;
  return renamed;
}

void remove_file(const char* path) {
  const int saved = errno;
  unlink(path);
  errno = saved;
}

bool resident_pages(const void* p, size_t bytes, unsigned char* out) {
#if defined(TRAY_TEST_PAGE_SIZE)
  // mincore answers per kernel page: a test page is resident where any of its kernel pages is.
  const size_t kernel = kernel_page_size();
  unsigned char answers[TRAY_TEST_PAGE_SIZE / 4096];
  for (size_t i = 0; i * TRAY_TEST_PAGE_SIZE < bytes; ++i) {
    const auto* page = static_cast<const char*>(p) + i * TRAY_TEST_PAGE_SIZE;
    if (mincore(const_cast<char*>(page), TRAY_TEST_PAGE_SIZE, answers) != 0) return false;
    out[i] = 0;
    for (size_t k = 0; k < TRAY_TEST_PAGE_SIZE / kernel; ++k) out[i] |= answers[k] & 1;
  }
  return true;
#else
  return mincore(const_cast<void*>(p), bytes, out) == 0;
#endif
}

size_t resident_bytes() {
  char text[128];
  const ssize_t length = read_small_file("/proc/self/statm", text, sizeof text - 1);
  if (length <= 0) return 0;
  // "size resident shared ...", in pages.
  ssize_t i = 0;
  while (i < length && text[i] != ' ') ++i;
  size_t pages = 0;
  for (++i; i < length && text[i] >= '0' && text[i] <= '9'; ++i) pages = pages * 10 + size_t(text[i] - '0');
  return pages * kernel_page_size();
}

}  // namespace tray::os
