/* A program with known allocations for stats_test.py, which runs it with libtraymalloc.so
 * preloaded. It is not linked against traymalloc: like any program, it reaches the statistics
 * through malloc itself, glibc's introspection calls and the stats_signal option.
 *
 *   stats_probe hold N SIZE  holds N blocks of SIZE bytes while it calls malloc_stats()
 *                            (text on stderr), raises SIGUSR1 (a dump where stats_file says),
 *                            calls mallinfo2() and writes malloc_info(0, stdout)
 *   stats_probe signal       raises SIGUSR1 twice, with more blocks live at the second
 *   stats_probe threads      4 threads allocate and free known counts; most of their frees
 *                            are of blocks that the next thread allocated
 *   stats_probe signal-threads ROUNDS
 *                            4 threads allocate and free without pause while each round sends
 *                            SIGUSR1 to all of them: dumps from the middle of malloc and free,
 *                            in several threads at once
 *   stats_probe churn        4 threads allocate and free without pause until standard input
 *                            ends; a line "signals" on it starts sending SIGUSR1 to them, one
 *                            after another, every 200 microseconds (dumps back to back)
 *
 * stdout: "name value" lines that say what the program did (the test's expectations), then,
 * for hold, the XML of malloc_info.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void die(const char* message) {
  fprintf(stderr, "stats_probe: %s\n", message);
  exit(1);
}

static void* checked_malloc(size_t size) {
  void* block = malloc(size);
  if (block == NULL) die("malloc failed");
  memset(block, 0x5a, size);  // the pages are really used, and the call cannot be elided
  return block;
}

static void** allocate_blocks(size_t count, size_t size) {
  void** blocks = checked_malloc(count * sizeof *blocks);
  for (size_t i = 0; i < count; ++i) blocks[i] = checked_malloc(size);
  return blocks;
}

static void free_blocks(void** blocks, size_t first, size_t end) {
  for (size_t i = first; i < end; ++i) free(blocks[i]);
}

/* The stats_signal dump; traymalloc writes it from its handler before kill() returns. */
static void dump_on_signal(void) {
  if (kill(getpid(), SIGUSR1) != 0) die("kill failed");
}

static size_t parse_count(const char* text) {
  char* end;
  const unsigned long long value = strtoull(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value == 0) die("counts and sizes must be positive integers");
  return (size_t)value;
}

static int run_hold(size_t count, size_t size) {
  printf("pid %d\ncount %zu\nsize %zu\n", (int)getpid(), count, size);
  fflush(stdout);  // stdout's buffer exists from here on: no allocation between the reports
  void** blocks = allocate_blocks(count, size);
  // Nothing allocates or frees between these three: they report the same state.
  malloc_stats();
  dump_on_signal();
  const struct mallinfo2 info = mallinfo2();
  printf("arena %zu\nordblks %zu\nuordblks %zu\nfordblks %zu\nhblks %zu\nhblkhd %zu\n",
         info.arena, info.ordblks, info.uordblks, info.fordblks, info.hblks, info.hblkhd);
  if (malloc_info(0, stdout) != 0) die("malloc_info failed");
  free_blocks(blocks, 0, count);
  free(blocks);
  return 0;
}

/* 2,500 B blocks fall in a size class that nothing else in this program uses. */
enum { kSignalBlockBytes = 2500, kFirstBlocks = 1000, kAddedBlocks = 2000, kKeptBlocks = 500 };

static int run_signal(void) {
  printf("pid %d\nsize %d\nfirst %d\nadded %d\nkept %d\n", (int)getpid(), kSignalBlockBytes,
         kFirstBlocks, kAddedBlocks, kKeptBlocks);
  fflush(stdout);
  void* blocks[kFirstBlocks + kAddedBlocks];
  for (int i = 0; i < kFirstBlocks; ++i) blocks[i] = checked_malloc(kSignalBlockBytes);
  dump_on_signal();
  for (int i = kFirstBlocks; i < kFirstBlocks + kAddedBlocks; ++i)
    blocks[i] = checked_malloc(kSignalBlockBytes);
  dump_on_signal();
  // The kept blocks are still live in the exit dump.
  free_blocks(blocks, kKeptBlocks, kFirstBlocks + kAddedBlocks);
  return 0;
}

/* Each thread uses its own size class, one that nothing else in this program uses, so the
 * counts of those classes are exactly what the threads did. */
enum { kThreads = 4, kSharedBlocks = 1000, kKeptShared = 100, kLocalPairs = 500 };
static const size_t kThreadBlockBytes[kThreads] = {2500, 5000, 9000, 20000};

struct thread_work {
  unsigned index;
  void** shared;  // allocated by this thread, freed by the next one
};

static struct thread_work g_work[kThreads];
static pthread_barrier_t g_all_allocated;

static void* thread_main(void* argument) {
  struct thread_work* work = argument;
  const size_t size = kThreadBlockBytes[work->index];
  work->shared = allocate_blocks(kSharedBlocks, size);
  for (int i = 0; i < kLocalPairs; ++i) free(checked_malloc(size));
  pthread_barrier_wait(&g_all_allocated);
  // The next thread's blocks, all but the kept ones: frees of blocks another heap owns.
  const struct thread_work* next = &g_work[(work->index + 1) % kThreads];
  free_blocks(next->shared, kKeptShared, kSharedBlocks);
  return NULL;
}

static int run_threads(void) {
  printf("pid %d\nthreads %d\n", (int)getpid(), kThreads);
  for (unsigned t = 0; t < kThreads; ++t) {
    printf("thread_blocks %zu allocations %d frees %d live %d\n", kThreadBlockBytes[t],
           kSharedBlocks + kLocalPairs, kSharedBlocks - kKeptShared + kLocalPairs, kKeptShared);
  }
  printf("remote_frees %d\n", kThreads * (kSharedBlocks - kKeptShared));
  fflush(stdout);
  pthread_t threads[kThreads];
  if (pthread_barrier_init(&g_all_allocated, NULL, kThreads) != 0) die("barrier failed");
  for (unsigned t = 0; t < kThreads; ++t) {
    g_work[t].index = t;
    if (pthread_create(&threads[t], NULL, thread_main, &g_work[t]) != 0) die("thread failed");
  }
  for (unsigned t = 0; t < kThreads; ++t) pthread_join(threads[t], NULL);
  pthread_barrier_destroy(&g_all_allocated);
  return 0;  // the kept blocks (and the arrays of pointers) are live in the exit dump
}

enum { kChurnThreads = 4, kChurnSlots = 512 };
static atomic_bool g_stop_churning;

static void* churn(void* argument) {
  unsigned seed = (unsigned)(uintptr_t)argument;
  void* slots[kChurnSlots] = {0};
  while (!atomic_load_explicit(&g_stop_churning, memory_order_relaxed)) {
    const unsigned slot = (unsigned)rand_r(&seed) % kChurnSlots;
    free(slots[slot]);
    // One block in 16 is larger than the largest size class.
    const int large = rand_r(&seed) % 16 == 0;
    slots[slot] = checked_malloc(large ? 150000 + (size_t)rand_r(&seed) % 150000
                                       : 1 + (size_t)rand_r(&seed) % 4000);
  }
  free_blocks(slots, 0, kChurnSlots);
  return NULL;
}

static void start_churning(pthread_t threads[kChurnThreads]) {
  for (unsigned t = 0; t < kChurnThreads; ++t) {
    if (pthread_create(&threads[t], NULL, churn, (void*)(uintptr_t)(t + 1)) != 0)
      die("thread failed");
  }
}

static void stop_churning(pthread_t threads[kChurnThreads]) {
  atomic_store(&g_stop_churning, 1);
  for (unsigned t = 0; t < kChurnThreads; ++t) pthread_join(threads[t], NULL);
}

static int run_signal_threads(size_t rounds) {
  printf("pid %d\nsignals %zu\n", (int)getpid(), rounds * kChurnThreads);
  fflush(stdout);
  pthread_t threads[kChurnThreads];
  start_churning(threads);
  const struct timespec pause = {0, 500 * 1000};
  for (size_t round = 0; round < rounds; ++round) {
    for (unsigned t = 0; t < kChurnThreads; ++t) {
      if (pthread_kill(threads[t], SIGUSR1) != 0) die("pthread_kill failed");
    }
    nanosleep(&pause, NULL);
  }
  stop_churning(threads);
  return 0;
}

static int run_churn(void) {
  printf("pid %d\n", (int)getpid());
  fflush(stdout);
  pthread_t threads[kChurnThreads];
  start_churning(threads);
  const struct timespec pause = {0, 200 * 1000};
  struct pollfd input = {.fd = STDIN_FILENO, .events = POLLIN};
  int signalling = 0;
  for (unsigned sent = 0;;) {
    const int ready = poll(&input, 1, signalling ? 0 : -1);
    if (ready < 0) die("poll failed");
    if (ready > 0) {
      char line[64];
      const ssize_t length = read(STDIN_FILENO, line, sizeof line);
      if (length <= 0) break;
      if (memmem(line, (size_t)length, "signals", 7) != NULL) signalling = 1;
    }
    if (signalling) {
      if (pthread_kill(threads[sent++ % kChurnThreads], SIGUSR1) != 0) die("pthread_kill failed");
      nanosleep(&pause, NULL);
    }
  }
  stop_churning(threads);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "hold") == 0)
    return run_hold(parse_count(argv[2]), parse_count(argv[3]));
  if (argc == 2 && strcmp(argv[1], "signal") == 0) return run_signal();
  if (argc == 2 && strcmp(argv[1], "threads") == 0) return run_threads();
  if (argc == 3 && strcmp(argv[1], "signal-threads") == 0)
    return run_signal_threads(parse_count(argv[2]));
  if (argc == 2 && strcmp(argv[1], "churn") == 0) return run_churn();
  fprintf(stderr, "usage: %s hold N SIZE | signal | threads | signal-threads ROUNDS | churn\n",
          argv[0]);
  return 2;
}
