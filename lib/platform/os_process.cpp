// The platform layer's process side (os.hpp): signals, backtraces and the symbols of code
// addresses, the fault hook, threads with their keys and fork hooks, and futex locks. Memory,
// time, randomness and files are in os.cpp.
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
#include <sys/single_threaded.h>
#endif
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "platform/config.hpp"
#include "platform/os.hpp"
#include "platform/unwind.hpp"

// Weak: a static executable then links without the C library's unwinder (and its dlopen),
// and simply prints no backtrace.
extern "C" int backtrace(void** frames, int count) __attribute__((weak));
extern "C" void backtrace_symbols_fd(void* const* frames, int count, int fd)
    __attribute__((weak));

// glibc's stdio list lock, exported since 2.2.5. Weak: a static executable that does not use
// stdio links none of it, and then has no stream to lock.
extern "C" {
void _IO_list_lock() __attribute__((weak));
void _IO_list_unlock() __attribute__((weak));
void _IO_list_resetlock() __attribute__((weak));
}

namespace tray::os {

void abort_process() { abort(); }

int signal_number(const char* name, size_t length) {
  if (length > 3 && memcmp(name, "SIG", 3) == 0) {
    name += 3;
    length -= 3;
  }
  if (length == 0 || length > 9) return 0;
  // RTMIN and RTMIN+n: real-time signals, which programs rarely claim (a program that sets its
  // own handler for USR1 after we set ours takes the dumps' signal over).
  if (length >= 5 && memcmp(name, "RTMIN", 5) == 0) {
    int offset = 0;
    if (length > 5) {
      if (name[5] != '+' || length == 6) return 0;
      for (size_t i = 6; i < length; ++i) {
        if (name[i] < '0' || name[i] > '9') return 0;
        offset = offset * 10 + (name[i] - '0');
      }
    }
    return SIGRTMIN + offset <= SIGRTMAX ? SIGRTMIN + offset : 0;
  }
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
// The executable segments of the shared object holding this code ([start, end) pairs); none
// when the allocator is linked into the program.
constexpr int kOwnRangesMax = 4;
uintptr_t g_own_ranges[kOwnRangesMax][2];
int g_own_range_count = 0;

int find_own_ranges(dl_phdr_info* info, size_t, void*) {
  const auto self = reinterpret_cast<uintptr_t>(&prepare_backtrace);
  int count = 0;
  bool contains_self = false;
  for (int i = 0; i < info->dlpi_phnum && count < kOwnRangesMax; ++i) {
    const ElfW(Phdr)& header = info->dlpi_phdr[i];
    if (header.p_type != PT_LOAD || (header.p_flags & PF_X) == 0) continue;
    const uintptr_t start = info->dlpi_addr + header.p_vaddr;
    g_own_ranges[count][0] = start;
    g_own_ranges[count][1] = start + header.p_memsz;
    contains_self |= self >= start && self < start + header.p_memsz;
    ++count;
  }
  if (!contains_self) return 0;
  // The main program has no name: its frames are the ones a profile is about.
  g_own_range_count = info->dlpi_name != nullptr && info->dlpi_name[0] != '\0' ? count : 0;
  return 1;
}

bool in_own_code(const void* address) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  for (int i = 0; i < g_own_range_count; ++i)
    if (a >= g_own_ranges[i][0] && a < g_own_ranges[i][1]) return true;
  return false;
}
}  // namespace

void prepare_backtrace() {
  if (backtrace == nullptr || g_backtrace_ready.load(std::memory_order_relaxed)) return;
  void* frame[1];
  backtrace(frame, 1);
  dl_iterate_phdr(find_own_ranges, nullptr);
  g_backtrace_ready.store(true, std::memory_order_release);
}

int capture_stack(void** frames, int capacity) {
  if (!g_backtrace_ready.load(std::memory_order_acquire)) return 0;
  // Room for the allocator's own frames on top of the ones kept.
  constexpr int kOwnFramesMax = 8;
  void* raw[128];
  const int wanted = capacity + kOwnFramesMax < 128 ? capacity + kOwnFramesMax : 128;
  int count = unwind_stack(raw, wanted);
  if (count < 0) count = backtrace(raw, wanted);
  int first = 0;
  while (first < count && in_own_code(raw[first])) ++first;
  int kept = 0;
  for (int i = first; i < count && kept < capacity; ++i) frames[kept++] = raw[i];
  return kept;
}

const char* symbol_of(const void* address, uintptr_t* offset, const char** file) {
  Dl_info info;
  if (dladdr(address, &info) == 0) {
    *file = nullptr;
    return nullptr;
  }
  *file = info.dli_fname;
  if (info.dli_sname == nullptr) return nullptr;
  *offset = reinterpret_cast<uintptr_t>(address) - reinterpret_cast<uintptr_t>(info.dli_saddr);
  return info.dli_sname;
}

namespace {

// How many of the first frames are the allocator's own, in a shared library apart from the
// program: a report starts at the program's frame, not at ours, which only the library's
// symbol table could name. Where the allocator is linked into the program, its frames carry
// the program's names and stay.
int own_leading_frames(void* const* frames, int count) {
  Dl_info self;
  Dl_info program;
  // The executable's program headers lie in its first mapping (the auxiliary vector names
  // them): no symbol lookup, which could allocate.
  const auto* program_headers = reinterpret_cast<void*>(getauxval(AT_PHDR));
  if (dladdr(reinterpret_cast<void*>(&write_backtrace), &self) == 0 || program_headers == nullptr ||
      dladdr(program_headers, &program) == 0 || program.dli_fbase == self.dli_fbase)
    return 0;
  int own = 0;
  for (Dl_info frame; own < count - 1; ++own) {
    if (dladdr(frames[own], &frame) == 0 || frame.dli_fbase != self.dli_fbase) break;
  }
  return own;
}

}  // namespace

void write_backtrace(int fd) {
  if (!g_backtrace_ready.load(std::memory_order_acquire) || backtrace_symbols_fd == nullptr) return;
  void* frames[32];
  const int count = backtrace(frames, 32);
  write_frames(fd, frames, count);
}

void write_frames(int fd, void* const* frames, int count) {
  if (backtrace_symbols_fd == nullptr || count <= 0) return;
  const int own = own_leading_frames(frames, count);
  backtrace_symbols_fd(frames + own, count - own, fd);
}

namespace {
// Guarded sampling's and debug mode's: each returns when the fault is not in its memory.
constexpr int kFaultHookCount = 2;
std::atomic<void (*)(void*)> g_fault_hooks[kFaultHookCount];
std::atomic<bool> g_fault_handler_set{false};
os::Mutex g_fault_hook_lock;
struct sigaction g_previous_fault_action;

void on_fault(int signo, siginfo_t* info, void* context) {
  const int saved = errno;
  for (auto& hook : g_fault_hooks)
    if (void (*run)(void*) = hook.load(std::memory_order_acquire); run != nullptr) run(info->si_addr);
  errno = saved;
  const struct sigaction& previous = g_previous_fault_action;
  if ((previous.sa_flags & SA_SIGINFO) != 0) {
    if (previous.sa_sigaction != nullptr) previous.sa_sigaction(signo, info, context);
    return;
  }
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signo);
    return;
  }
  // The default action, as if we had never been here. A real fault runs its instruction again
  // on return and meets SIG_DFL; a SIGSEGV sent with kill() would not, so it is sent again (it
  // stays blocked until this handler returns). SIG_IGN cannot stop a real fault either.
  struct sigaction fallback;
  memset(&fallback, 0, sizeof fallback);
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(signo, &fallback, nullptr);
  raise(signo);
}
}  // namespace

bool set_fault_hook(void (*hook)(void* address)) {
  LockGuard guard(g_fault_hook_lock);
  int free_slot = -1;
  for (int i = 0; i < kFaultHookCount; ++i) {
    void (*present)(void*) = g_fault_hooks[i].load(std::memory_order_relaxed);
    if (present == hook) return true;
    if (present == nullptr && free_slot < 0) free_slot = i;
  }
  if (free_slot < 0) return false;
  g_fault_hooks[free_slot].store(hook, std::memory_order_release);
  if (g_fault_handler_set.exchange(true, std::memory_order_acq_rel)) return true;
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_fault;
  // SA_ONSTACK: a program that handles stack overflows on an alternate stack keeps doing so.
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&action.sa_mask);
  return sigaction(SIGSEGV, &action, &g_previous_fault_action) == 0;
}

int thread_key_create(pthread_key_t* key, void (*destructor)(void*)) {
  return pthread_key_create(key, destructor);
}

void thread_key_set(pthread_key_t key, const void* value) { pthread_setspecific(key, value); }

int register_atfork(void (*prepare)(), void (*parent)(), void (*child)()) {
  return pthread_atfork(prepare, parent, child);
}

CancelDisabled::CancelDisabled() { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &previous_); }

CancelDisabled::~CancelDisabled() { pthread_setcancelstate(previous_, nullptr); }

// glibc 2.32 and later (<sys/single_threaded.h>); a strong reference, so that a static
// executable links the flag in. Elsewhere the process counts as multi-threaded.
bool process_single_threaded() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
  return __atomic_load_n(&__libc_single_threaded, __ATOMIC_RELAXED) != 0;
#else
  return false;
#endif
}

void lock_stdio_for_fork() {
  if (_IO_list_lock != nullptr) _IO_list_lock();
}

void unlock_stdio_after_fork() {
  if (_IO_list_unlock != nullptr) _IO_list_unlock();
}

void reset_stdio_after_fork_child() {
  if (_IO_list_resetlock != nullptr) _IO_list_resetlock();
}

namespace {

void* thread_entry(void* body) {
  reinterpret_cast<void (*)()>(body)();
  return nullptr;
}

}  // namespace

bool start_thread(void (*body)()) {
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return false;
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  // Small: the thread only walks the allocator's lists and formats into stack buffers.
  pthread_attr_setstacksize(&attr, size_t{256} << 10);
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  pthread_t thread;
  const bool started =
      pthread_create(&thread, &attr, thread_entry, reinterpret_cast<void*>(body)) == 0;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  pthread_attr_destroy(&attr);
  return started;
}

bool thread_exists(int tid) {
  const int saved = errno;
  const bool exists = syscall(SYS_tgkill, getpid(), tid, 0) == 0 || errno != ESRCH;
  errno = saved;
  return exists;
}

int unshare_namespaces(int flags) { return int(syscall(SYS_unshare, flags)); }

int enter_namespace(int fd, int type) { return int(syscall(SYS_setns, fd, type)); }

void wait_on(std::atomic<uint32_t>& word, uint32_t expected, uint64_t timeout_ms) {
  timespec timeout{time_t(timeout_ms / 1000), long(timeout_ms % 1000) * 1000000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
          timeout_ms == 0 ? nullptr : &timeout, nullptr, 0);
}

// Spins while the holder is likely still running, then marks the lock as having a sleeper and
// sleeps until the holder's unlock wakes one. errno is the program's: a futex call that finds
// the word changed fails with EAGAIN, inside malloc and free.
void Mutex::lock_contended() {
  for (int spin = 0; spin < kMutexSpins; ++spin) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
    if (state_.load(std::memory_order_relaxed) == 0 && try_lock()) return;
  }
  const int saved = errno;
  while (state_.exchange(2, std::memory_order_acquire) != 0) wait_on(state_, 2, 0);
  errno = saved;
}

namespace {

void wake(std::atomic<uint32_t>& word, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
}

}  // namespace

void Mutex::wake_one_waiter() {
  const int saved = errno;
  wake(state_, 1);
  errno = saved;
}

void wake_all(std::atomic<uint32_t>& word) { wake(word, INT32_MAX); }

namespace {

// A thread's stack is at most this big, for the test below: a stack pointer farther than this
// from the top it would measure from is on some other stack (a coroutine's), where the range
// to the top could take in anything.
constexpr uintptr_t kLargestStackBytes = uintptr_t{64} << 20;

bool on_own_stack(uintptr_t address) {
  const auto sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (address < sp) return false;
  stack_t alternate;
  if (syscall(SYS_sigaltstack, nullptr, &alternate) != 0 || (alternate.ss_flags & SS_ONSTACK) != 0)
    return false;
  // glibc puts a thread's descriptor at the top of its stack block, user-supplied stacks too;
  // the main thread's lies elsewhere, and its stack ends at the strings the kernel put there,
  // the executable's name last of them.
  const auto descriptor = reinterpret_cast<uintptr_t>(pthread_self());
  uintptr_t top = 0;
  if (descriptor > sp && descriptor - sp <= kLargestStackBytes) top = descriptor;
  else if (const uintptr_t end = getauxval(AT_EXECFN); end > sp && end - sp <= kLargestStackBytes)
    top = end;
  return address < top;
}

bool in_executable_image(uintptr_t address) {
  const auto* headers = reinterpret_cast<const ElfW(Phdr)*>(getauxval(AT_PHDR));
  const size_t count = getauxval(AT_PHNUM);
  if (headers == nullptr) return false;
  uintptr_t bias = 0;  // where a position-independent executable was loaded
  for (size_t i = 0; i < count; ++i)
    if (headers[i].p_type == PT_PHDR) bias = reinterpret_cast<uintptr_t>(headers) - headers[i].p_vaddr;
  for (size_t i = 0; i < count; ++i) {
    if (headers[i].p_type != PT_LOAD) continue;
    const uintptr_t start = bias + headers[i].p_vaddr;
    if (address >= start && address - start < headers[i].p_memsz) return true;
  }
  return false;
}

}  // namespace

const char* place_of_non_heap_pointer(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  if (on_own_stack(address)) return "the calling thread's stack";
  if (in_executable_image(address)) return "the program's image";
  return nullptr;
}

}  // namespace tray::os
