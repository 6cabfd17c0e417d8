#include "platform/os.hpp"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "core/bits.hpp"

// Weak: a static executable then links without the C library's unwinder (and its dlopen),
// and simply prints no backtrace.
extern "C" int backtrace(void** frames, int count) __attribute__((weak));
extern "C" void backtrace_symbols_fd(void* const* frames, int count, int fd)
    __attribute__((weak));

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

void* map_with(size_t bytes, int prot) {
  count_call(g_calls.mmap);
  if (inject_fault(kFaultMmap)) return nullptr;
  void* p = mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void unmap_range(void* p, size_t bytes) {
  count_call(g_calls.munmap);
  munmap(p, bytes);
}

// Over-map by `alignment` and cut the excess off both ends: three system calls, but segments
// and large blocks are mapped rarely, and the result never depends on address hints (which
// sanitizer runtimes reserve for themselves).
void* map_aligned_with(size_t bytes, size_t alignment, int prot) {
  if (alignment <= page_size()) return map_with(bytes, prot);
  const size_t padded = bytes + alignment;
  if (padded < bytes) return nullptr;
  auto* raw = static_cast<char*>(map_with(padded, prot));
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

void* map_aligned(size_t bytes, size_t alignment) {
  return map_aligned_with(bytes, alignment, PROT_READ | PROT_WRITE);
}

void* reserve_aligned(size_t bytes, size_t alignment) {
  return map_aligned_with(bytes, alignment, PROT_NONE);
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

void protect_none(void* p, size_t bytes) {
  const int saved = errno;
  count_call(g_calls.mprotect);
  mprotect(p, bytes, PROT_NONE);
  purge(p, bytes);
  errno = saved;
}

// ThreadSanitizer does not intercept mremap: memory a mapping moves or grows into keeps the
// shadow of what lay there before, and the new owner's accesses show as races with the old
// owner's. Under TSan, large blocks are copied instead; the other builds test mremap.
#if defined(TRAY_TSAN)
constexpr bool kRemapWorks = false;
#else
constexpr bool kRemapWorks = true;
#endif

bool remap_in_place(void* p, size_t old_bytes, size_t new_bytes) {
  count_call(g_calls.mremap);
  if (!kRemapWorks || inject_fault(kFaultMremap)) return false;
  return mremap(p, old_bytes, new_bytes, 0) != MAP_FAILED;
}

bool remap_to(void* p, size_t old_bytes, size_t new_bytes, void* target) {
  count_call(g_calls.mremap);
  if (!kRemapWorks || inject_fault(kFaultMremap)) return false;
  return mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, target) != MAP_FAILED;
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

size_t page_size() {
  static std::atomic<size_t> cached{0};  // threads may race to fill it, with the same value
  size_t size = cached.load(std::memory_order_relaxed);
  if (TRAY_UNLIKELY(size == 0)) {
    size = size_t(sysconf(_SC_PAGESIZE));
    cached.store(size, std::memory_order_relaxed);
  }
  return size;
}

uint64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
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

void* next_symbol(const char* name) { return dlsym(RTLD_NEXT, name); }

void write_fd(int fd, const char* text, size_t length) {
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

size_t resident_bytes() {
  const int saved = errno;
  const int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  char text[128];
  ssize_t length = -1;
  if (fd >= 0) {
    length = read(fd, text, sizeof text - 1);
    close(fd);
  }
  errno = saved;
  if (length <= 0) return 0;
  // "size resident shared ...", in pages.
  ssize_t i = 0;
  while (i < length && text[i] != ' ') ++i;
  size_t pages = 0;
  for (++i; i < length && text[i] >= '0' && text[i] <= '9'; ++i) pages = pages * 10 + size_t(text[i] - '0');
  return pages * page_size();
}

void abort_process() { abort(); }

int signal_number(const char* name, size_t length) {
  if (length > 3 && memcmp(name, "SIG", 3) == 0) {
    name += 3;
    length -= 3;
  }
  if (length == 0 || length > 8) return 0;
  if (name[0] >= '0' && name[0] <= '9') {
    int number = 0;
    for (size_t i = 0; i < length; ++i) {
      if (name[i] < '0' || name[i] > '9') return 0;
      number = number * 10 + (name[i] - '0');
    }
    return number > 0 && number < NSIG ? number : 0;
  }
  // Signals a program can spare for a dump; the others have jobs of their own.
  static constexpr struct {
    const char* name;
    int number;
  } kNames[] = {{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"HUP", SIGHUP},   {"INT", SIGINT},
                {"QUIT", SIGQUIT}, {"TERM", SIGTERM}, {"WINCH", SIGWINCH}, {"PROF", SIGPROF},
                {"URG", SIGURG},   {"TTIN", SIGTTIN}, {"TTOU", SIGTTOU},   {"PWR", SIGPWR}};
  for (const auto& entry : kNames)
    if (strlen(entry.name) == length && memcmp(entry.name, name, length) == 0) return entry.number;
  return 0;
}

bool set_signal_handler(int signo, void (*handler)(int)) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = handler;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  return sigaction(signo, &action, nullptr) == 0;
}

namespace {
std::atomic<bool> g_backtrace_ready{false};
}  // namespace

void prepare_backtrace() {
  if (backtrace == nullptr || g_backtrace_ready.load(std::memory_order_relaxed)) return;
  void* frame[1];
  backtrace(frame, 1);
  g_backtrace_ready.store(true, std::memory_order_release);
}

void write_backtrace(int fd) {
  if (!g_backtrace_ready.load(std::memory_order_acquire) || backtrace_symbols_fd == nullptr) return;
  void* frames[32];
  const int count = backtrace(frames, 32);
  // Frame 0 is this function; the caller's frames are the report's own and stay useful.
  if (count > 1) backtrace_symbols_fd(frames + 1, count - 1, fd);
}

int thread_key_create(pthread_key_t* key, void (*destructor)(void*)) {
  return pthread_key_create(key, destructor);
}

void thread_key_set(pthread_key_t key, const void* value) { pthread_setspecific(key, value); }

int register_atfork(void (*prepare)(), void (*parent)(), void (*child)()) {
  return pthread_atfork(prepare, parent, child);
}

}  // namespace tray::os
