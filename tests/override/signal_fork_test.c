// fork() from a signal handler of a single-threaded program must not deadlock, whatever the
// interrupted code was doing: malloc, free, realloc, or fork itself.
//
// glibc allows it in a process it sees as single-threaded (its malloc/tst-mallocfork2 tests
// the same): its fork then takes none of its own locks. An allocator can break that two ways:
//   - a thread of its own (traymalloc's idle purger) makes the process multi-threaded in
//     glibc's eyes, so glibc's fork takes its atfork lock and the list lock of stdio, and a
//     fork from a handler that interrupted a fork waits for itself;
//   - its pthread_atfork prepare handler takes the allocator's locks: a fork from a handler
//     that interrupted a fork (between prepare and release), or malloc holding one of those
//     locks, takes a lock the interrupted code holds.
//
// traymalloc starts no purger thread in a program that has none of its own, and takes no
// lock in its prepare handler while glibc counts the process as single-threaded.
//
// The tested process (a child of this one, which watches it) never calls pthread_create. It
// first frees a few large blocks, which in a threaded program would start the purger, waits
// a while and checks that the process still has one thread, then sets its handlers and runs for kRunMs. Its main loop mallocs, callocs, reallocs and
// frees blocks from 16 bytes to 1 MiB (the large ones go through the allocator's large path
// and, when freed, give its purger something to do), checks their patterns, and forks every
// few hundred steps; the forked child allocates once and _exits. SIGUSR1 comes from
// a sender process in a tight loop, SIGALRM from an interval timer of 1 ms; both handlers fork
// and the child _exits at once, and neither signal is masked in the other's handler, so forks
// nest. The main loop reaps the handlers' children with waitpid(-1, WNOHANG). After kRunMs it
// must exit 0 within kHangSeconds; if not, the watcher reports the hang with the tested
// process's progress (counters in shared memory) and kills it.
//
// Run with default options and with TRAY_OPTIONS=purge_thread=0. Prints "signal_fork: ok" on success.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "process_watch.h"

enum {
  kRunMs = 4000,
  kStartMs = 300,  // given to a purger thread to start, which must not
  kHangSeconds = 6,
  kWatchdogSeconds = 60,  // the whole program, whatever happens to the tested process
  kSlots = 64,
  kLargeBytes = 4 << 20,
  kForkEvery = 200,  // main-loop steps between two forks of the main loop itself
};

struct progress {
  atomic_long steps;
  atomic_long main_forks;
  atomic_long handler_forks;
  atomic_long signals_sent;
  atomic_int in_handler;  // forks in progress from handlers, nested ones counted
  atomic_int threads_at_start;  // of the tested process, when the signals began
  atomic_int ready;             // the handlers are set: the sender may begin
};

static struct progress* g_progress;
static volatile pid_t g_tested_pid, g_sender_pid;  // the watchdog kills them

static void fail_tested(const char* what) {
  fprintf(stderr, "FAIL (tested process): %s: %s\n", what, strerror(errno));
  _exit(2);
}

// Both handlers: fork, and the child leaves at once. The parent's children are reaped by the
// main loop. EAGAIN (a transient process limit) is not the bug.
static void fork_in_handler(int signal) {
  (void)signal;
  const int saved_errno = errno;
  atomic_fetch_add(&g_progress->in_handler, 1);
  const pid_t child = fork();
  if (child == 0) _exit(0);
  if (child > 0) atomic_fetch_add(&g_progress->handler_forks, 1);
  atomic_fetch_sub(&g_progress->in_handler, 1);
  errno = saved_errno;
}

static size_t block_size(uint32_t random) {
  switch (random % 16) {
    case 0: return 300 * 1024 + random % (700 * 1024);  // large: 300 KiB to 1 MiB
    case 1: case 2: return 16 * 1024 + random % (240 * 1024);
    default: return 16 + random % 2048;
  }
}

static uint32_t next_random(uint32_t* state) {
  *state = *state * 1103515245u + 12345u;
  return *state >> 8;
}

// Each block starts with its size and a pattern byte, and holds that byte throughout.
static void fill(unsigned char* p, size_t size, unsigned char pattern) {
  memset(p, pattern, size);
}

static void check(const unsigned char* p, size_t size, unsigned char pattern) {
  for (size_t i = 0; i < size; i += 97)
    if (p[i] != pattern) {
      fprintf(stderr, "FAIL (tested process): block %p byte %zu is %#x, expected %#x\n",
              (const void*)p, i, p[i], pattern);
      _exit(2);
    }
  if (size > 0 && p[size - 1] != pattern) {
    fprintf(stderr, "FAIL (tested process): block %p last byte corrupted\n", (const void*)p);
    _exit(2);
  }
}

static void main_loop(void) {
  unsigned char* blocks[kSlots] = {0};
  size_t sizes[kSlots] = {0};
  unsigned char patterns[kSlots] = {0};
  uint32_t random = (uint32_t)getpid();
  const long end = now_ms() + kRunMs;
  for (long step = 0; now_ms() < end; ++step) {
    const uint32_t r = next_random(&random);
    const int slot = (int)(r % kSlots);
    if (blocks[slot] != NULL) check(blocks[slot], sizes[slot], patterns[slot]);
    const size_t size = block_size(next_random(&random));
    const unsigned char pattern = (unsigned char)(step | 1);
    switch ((r >> 8) % 4) {
      case 0:  // realloc: keeps the old contents up to the smaller size
        if (blocks[slot] != NULL) {
          unsigned char* p = realloc(blocks[slot], size);
          if (p == NULL) fail_tested("realloc");
          check(p, size < sizes[slot] ? size : sizes[slot], patterns[slot]);
          blocks[slot] = p;
          break;
        }
        // fall through
      case 1:
        free(blocks[slot]);
        blocks[slot] = malloc(size);
        if (blocks[slot] == NULL) fail_tested("malloc");
        break;
      case 2:
        free(blocks[slot]);
        blocks[slot] = calloc(1, size);
        if (blocks[slot] == NULL) fail_tested("calloc");
        check(blocks[slot], size, 0);
        break;
      default:
        free(blocks[slot]);
        blocks[slot] = NULL;
        continue;
    }
    sizes[slot] = size;
    patterns[slot] = pattern;
    fill(blocks[slot], size, pattern);
    if (step % kForkEvery == 0) {
      const pid_t child = fork();
      if (child < 0 && errno != EAGAIN) fail_tested("fork");
      if (child == 0) {
        void* volatile p = malloc(size);  // the child's allocator works
        free(p);
        _exit(0);
      }
      if (child > 0) {
        int status;
        while (waitpid(child, &status, 0) < 0)
          if (errno != EINTR) fail_tested("waitpid");
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          fprintf(stderr, "FAIL (tested process): a forked child ended with status %#x\n",
                  status);
          _exit(2);
        }
        atomic_fetch_add(&g_progress->main_forks, 1);
      }
    }
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
    atomic_fetch_add(&g_progress->steps, 1);
  }
  // Quiet now: no more signals, then every block checked and freed.
  const struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  signal(SIGUSR1, SIG_IGN);
  for (int i = 0; i < kSlots; ++i) {
    if (blocks[i] != NULL) check(blocks[i], sizes[i], patterns[i]);
    free(blocks[i]);
  }
  while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

// Large blocks, touched and freed, leave the allocator memory to give back, which in a threaded
// program starts traymalloc's purger thread. Here it must not: the process keeps one thread.
static void leave_work_for_a_purger(void) {
  for (int i = 0; i < 3; ++i) {
    char* volatile p = malloc(kLargeBytes);
    if (p == NULL) fail_tested("malloc");
    memset(p, i, kLargeBytes);
    free(p);
  }
  for (int ms = 0; ms < kStartMs && thread_count() < 2; ++ms) {
    const struct timespec step = {0, 1000 * 1000};
    nanosleep(&step, NULL);
  }
  atomic_store(&g_progress->threads_at_start, thread_count());
  if (thread_count() != 1) fail_tested("a thread appeared in a program that started none");
}

static void tested_process(void) {
  leave_work_for_a_purger();
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = fork_in_handler;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);  // the other signal may interrupt this handler: forks nest
  if (sigaction(SIGUSR1, &action, NULL) != 0 || sigaction(SIGALRM, &action, NULL) != 0)
    fail_tested("sigaction");
  const struct itimerval every_ms = {{0, 1000}, {0, 1000}};
  if (setitimer(ITIMER_REAL, &every_ms, NULL) != 0) fail_tested("setitimer");
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigprocmask(SIG_UNBLOCK, &usr1, NULL);  // blocked by the watcher until the handler was set
  atomic_store(&g_progress->ready, 1);
  main_loop();
  _exit(0);
}

// Sends SIGUSR1 to the tested process until it is gone. Allocates nothing.
static void sender_process(pid_t target) {
  const struct timespec pause = {0, 50 * 1000};
  while (!atomic_load(&g_progress->ready)) {
    if (kill(target, 0) != 0) _exit(0);
    nanosleep(&pause, NULL);
  }
  for (;;) {
    if (kill(target, SIGUSR1) != 0) _exit(0);
    atomic_fetch_add(&g_progress->signals_sent, 1);
    nanosleep(&pause, NULL);
  }
}

static void on_watchdog(int signal) {
  (void)signal;
  static const char message[] = "FAIL: signal_fork_test did not finish within its watchdog\n";
  if (write(2, message, sizeof message - 1) < 0) {}
  if (g_sender_pid > 0) kill(g_sender_pid, SIGKILL);
  if (g_tested_pid > 0) kill(g_tested_pid, SIGKILL);
  _exit(1);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGALRM, on_watchdog);
  alarm(kWatchdogSeconds);
  g_progress = mmap(NULL, sizeof *g_progress, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
  if (g_progress == MAP_FAILED) return 3;
  const char* options = getenv("TRAY_OPTIONS");
  printf("TRAY_OPTIONS=%s\n", options != NULL ? options : "(unset)");
  fflush(NULL);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigprocmask(SIG_BLOCK, &usr1, NULL);  // the tested process inherits it, until its handler is set
  const long start = now_ms();
  const pid_t tested = fork();
  if (tested < 0) return 3;
  if (tested == 0) {
    signal(SIGALRM, SIG_DFL);
    tested_process();
  }
  g_tested_pid = tested;
  const pid_t sender = fork();
  if (sender < 0) return 3;
  if (sender == 0) sender_process(tested);
  g_sender_pid = sender;
  int status;
  pid_t done;
  while ((done = waitpid(tested, &status, WNOHANG)) == 0) {
    if (now_ms() - start > kStartMs + kRunMs + kHangSeconds * 1000L) {
      fprintf(stderr,
              "FAIL: the tested process hung (deadlock): still running %d s after its start "
              "and %d ms of signals; "
              "%d threads when the signals began, %ld steps, %ld forks from main, %ld forks "
              "from handlers, %d forks in progress from handlers, %ld SIGUSR1 sent\n",
              kHangSeconds, kRunMs, atomic_load(&g_progress->threads_at_start),
              atomic_load(&g_progress->steps),
              atomic_load(&g_progress->main_forks), atomic_load(&g_progress->handler_forks),
              atomic_load(&g_progress->in_handler), atomic_load(&g_progress->signals_sent));
      describe_threads(tested);
      kill(sender, SIGKILL);
      kill(tested, SIGKILL);
      waitpid(tested, &status, 0);
      waitpid(sender, NULL, 0);
      return 1;
    }
    usleep(20000);
  }
  kill(sender, SIGKILL);
  waitpid(sender, NULL, 0);
  if (done != tested) return 3;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "FAIL: the tested process ended with status %#x\n", status);
    return 1;
  }
  printf("%d threads when the signals began; %ld steps, %ld forks from main, %ld forks from "
         "handlers, %ld SIGUSR1 sent in %ld ms\n",
         atomic_load(&g_progress->threads_at_start), atomic_load(&g_progress->steps),
         atomic_load(&g_progress->main_forks),
         atomic_load(&g_progress->handler_forks), atomic_load(&g_progress->signals_sent),
         now_ms() - start);
  puts("signal_fork: ok");
  return 0;
}
