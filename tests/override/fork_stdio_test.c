// fork() in a process whose other threads are inside stdio must not deadlock.
//
// glibc's fork runs the pthread_atfork prepare handlers first and then, in a multi-threaded
// process, takes stdio's list lock (_IO_list_lock) and its own malloc's locks, in that order.
// An allocator that takes its locks in a prepare handler therefore takes them *before* the
// list lock, the reverse of glibc's own order, and three threads can close a cycle:
//   forking thread: holds the allocator's locks (prepare), waits for the list lock;
//   fflush(NULL):   holds the list lock, waits for the lock of one FILE;
//   getline:        holds that FILE's lock, waits in realloc for an allocator lock.
// glibc's own malloc/tst-malloc-fork-deadlock exercises the same triangle.
//
// Each round is a child process with kForkThreads threads that fork in a loop (the grandchild
// allocates, frees and _exits at once; the thread reaps it), kReadThreads threads that read
// long lines with getline from a FILE of their own (fmemopen: it is on stdio's list like any
// FILE) and free the line each time, so that getline grows its buffer with realloc under the
// FILE's lock, and one thread that loops on fflush(NULL). Some lines are longer than 256 KiB, so
// realloc also takes the large path and its locks. The round stops its threads after kRoundMs
// and must end within kHangSeconds after that; a round that does not is the deadlock: it is
// reported with the progress its threads made (counters in shared memory) and killed.
//
// Usage: fork_stdio_test [ROUNDS]. Prints "fork_stdio: ok" when every round ended.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "process_watch.h"

enum {
  kForkThreads = 4,
  kReadThreads = 7,
  kDefaultRounds = 6,
  kRoundMs = 1000,
  kHangSeconds = 5,
  kWatchdogSeconds = 60,  // the whole program, whatever happens to the rounds
  kLines = 16,
};

// Progress of the current round, in memory the watching process shares with it.
struct progress {
  atomic_long forks;
  atomic_long lines;
  atomic_long flushes;
  atomic_int threads_done;
};

static struct progress* g_progress;
static atomic_int g_stop;
static volatile pid_t g_round_pid;  // the watchdog kills it

static void fail_in_round(const char* what) {
  fprintf(stderr, "FAIL (round process): %s: %s\n", what, strerror(errno));
  _exit(2);
}

static void* fork_loop(void* arg) {
  while (!atomic_load(&g_stop)) {
    const pid_t child = fork();
    if (child < 0) {
      if (errno == EAGAIN) continue;  // a transient process limit is not the bug
      fail_in_round("fork");
    }
    if (child == 0) {
      // The child's allocator must work: the locks the prepare handler took are released.
      void* volatile p = malloc(100 + (size_t)getpid() % 4000);
      free(p);
      _exit(0);
    }
    int status;
    if (waitpid(child, &status, 0) != child) fail_in_round("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "FAIL (round process): a forked child ended with status %#x\n", status);
      _exit(2);
    }
    atomic_fetch_add(&g_progress->forks, 1);
  }
  atomic_fetch_add(&g_progress->threads_done, 1);
  return arg;
}

// Lines from 1 KiB to 300 KiB: getline starts at 120 bytes and doubles its buffer, so each line
// costs several reallocs, small ones from the thread's heap and, for the longest, large ones.
static size_t line_length(int line, int seed) {
  static const size_t lengths[] = {1000, 3000, 5000, 9000, 2000, 17000, 4000, 300000};
  return lengths[(line + seed) % (int)(sizeof lengths / sizeof lengths[0])];
}

static void* read_loop(void* arg) {
  const int seed = (int)(long)arg;
  size_t size = 0;
  for (int i = 0; i < kLines; ++i) size += line_length(i, seed) + 1;
  char* text = malloc(size);
  if (text == NULL) fail_in_round("malloc of the text");
  char* at = text;
  for (int i = 0; i < kLines; ++i) {
    const size_t length = line_length(i, seed);
    memset(at, 'a' + (i + seed) % 26, length);
    at[length] = '\n';
    at += length + 1;
  }
  FILE* file = fmemopen(text, size, "r");
  if (file == NULL) fail_in_round("fmemopen");
  int line = 0;
  while (!atomic_load(&g_stop)) {
    char* buffer = NULL;  // a new buffer each time: every line is read through realloc
    size_t capacity = 0;
    const ssize_t got = getline(&buffer, &capacity, file);
    if (got < 0) {
      free(buffer);
      rewind(file);
      line = 0;
      continue;
    }
    const size_t expected = line_length(line, seed) + 1;
    if ((size_t)got != expected || buffer[0] != 'a' + (line + seed) % 26 ||
        buffer[got - 2] != buffer[0]) {
      fprintf(stderr, "FAIL (round process): line %d read as %zd bytes, expected %zu\n", line, got,
              expected);
      _exit(2);
    }
    free(buffer);
    ++line;
    atomic_fetch_add(&g_progress->lines, 1);
  }
  fclose(file);
  free(text);
  atomic_fetch_add(&g_progress->threads_done, 1);
  return arg;
}

static void* flush_loop(void* arg) {
  while (!atomic_load(&g_stop)) {
    fflush(NULL);
    atomic_fetch_add(&g_progress->flushes, 1);
  }
  atomic_fetch_add(&g_progress->threads_done, 1);
  return arg;
}

static void run_round(void) {
  pthread_t threads[kForkThreads + kReadThreads + 1];
  int count = 0;
  for (int i = 0; i < kReadThreads; ++i)
    if (pthread_create(&threads[count++], NULL, read_loop, (void*)(long)i) != 0)
      fail_in_round("pthread_create");
  if (pthread_create(&threads[count++], NULL, flush_loop, NULL) != 0)
    fail_in_round("pthread_create");
  for (int i = 0; i < kForkThreads; ++i)
    if (pthread_create(&threads[count++], NULL, fork_loop, NULL) != 0)
      fail_in_round("pthread_create");
  const struct timespec round = {kRoundMs / 1000, (kRoundMs % 1000) * 1000000L};
  nanosleep(&round, NULL);
  atomic_store(&g_stop, 1);
  for (int i = 0; i < count; ++i) pthread_join(threads[i], NULL);
  _exit(0);
}

static void on_watchdog(int signal) {
  (void)signal;
  static const char message[] =
      "FAIL: fork_stdio_test did not finish within its watchdog; killing the round\n";
  if (write(2, message, sizeof message - 1) < 0) {}
  if (g_round_pid > 0) kill(g_round_pid, SIGKILL);
  _exit(1);
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : kDefaultRounds;
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGALRM, on_watchdog);
  alarm(kWatchdogSeconds);
  g_progress = mmap(NULL, sizeof *g_progress, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
  if (g_progress == MAP_FAILED) return 3;
  for (int r = 0; r < rounds; ++r) {
    memset(g_progress, 0, sizeof *g_progress);
    fflush(NULL);
    const long start = now_ms();
    const pid_t pid = fork();
    if (pid < 0) return 3;
    if (pid == 0) run_round();
    g_round_pid = pid;
    int status;
    pid_t done;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0) {
      if (now_ms() - start > kRoundMs + kHangSeconds * 1000L) {
        fprintf(stderr,
                "FAIL: round %d of %d hung (deadlock): still running %d s after its threads were "
                "told to stop; %ld forks, %ld lines read, %ld fflush(NULL), %d of %d threads "
                "ended\n",
                r + 1, rounds, kHangSeconds, atomic_load(&g_progress->forks),
                atomic_load(&g_progress->lines), atomic_load(&g_progress->flushes),
                atomic_load(&g_progress->threads_done), kForkThreads + kReadThreads + 1);
        describe_threads(pid);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return 1;
      }
      usleep(20000);
    }
    if (done != pid) return 3;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "FAIL: round %d ended with status %#x\n", r + 1, status);
      return 1;
    }
    printf("round %d: %ld forks, %ld lines read, %ld fflush(NULL) in %ld ms\n", r + 1,
           atomic_load(&g_progress->forks), atomic_load(&g_progress->lines),
           atomic_load(&g_progress->flushes), now_ms() - start);
  }
  puts("fork_stdio: ok");
  return 0;
}
