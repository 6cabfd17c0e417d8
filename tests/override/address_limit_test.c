// An allocator under an address-space limit (ulimit -v, RLIMIT_AS) must start, fail cleanly
// when the limit is reached (NULL with errno ENOMEM, or ENOMEM from posix_memalign; no crash,
// no abort, no corrupted block), and recover once memory is freed: allocate again and let the
// program create threads. Batch schedulers, containers and build tools often run programs under
// such a limit, and an allocator that reserves a large range up front cannot start there.
//
// Two modes:
//   preset      (default) the limit is set before the program starts: ctest runs it through
//               `sh -c 'ulimit -v 500000; exec PROGRAM'`. Refuses to run (fails) without a limit,
//               which it would otherwise fill memory to find.
//   setrlimit   the program sets RLIMIT_AS itself, to its VmSize (from /proc/self/status) plus
//               kHeadroomMiB, after the allocator has started.
// In both, kThreads threads allocate with malloc, calloc, realloc, posix_memalign,
// aligned_alloc, memalign, valloc and pvalloc, in turn and of varied sizes (200 bytes to 8 MiB),
// until each has seen kFailuresWanted failures; every failure must be ENOMEM, a failed realloc
// must leave its block as it was, and every block carries a pattern checked before it is freed.
// Then everything is freed, and the program must be able to mmap kMappingMiB directly (the
// allocator gave the address space back), allocate with every function again, and create
// kThreadsAfter threads, more than before, alive at once, that allocate. Prints
// "address_limit: ok" on success; an internal alarm turns a hang into a failure.
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

enum {
  kThreads = 4,
  kThreadsAfter = 6,
  kFailuresWanted = 24,
  kCallsAfterFirstFailure = 200000,  // bounds the run when small sizes keep succeeding
  kHeadroomMiB = 512,
  kMappingMiB = 64,  // must be mappable once everything is freed
  kWatchdogSeconds = 60,
  kFunctions = 8,
};

static const char* const kFunctionNames[kFunctions] = {
    "malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign", "valloc",
    "pvalloc"};

// A block: a header in the block itself (its size and pattern), the next block, the pattern.
struct block {
  struct block* next;
  size_t size;
  unsigned char pattern;
};

struct worker {
  int index;
  struct block* blocks;
  long allocated_bytes;
  long successes;
  long failures[kFunctions];
  pthread_t thread;
};

static atomic_int g_failed;
// The allocating threads start together once all of them were created.
static pthread_barrier_t g_start_barrier;
// The threads after the limit hold their blocks until all of them were created.
static pthread_barrier_t g_after_barrier;

static void fail(const char* format, const char* what, long value) {
  fprintf(stderr, "FAIL: ");
  fprintf(stderr, format, what, value);
  fputc('\n', stderr);
  atomic_store(&g_failed, 1);
}

// The pattern: every byte of a small block, and for a large one the first and last 4 KiB and a
// word every 64 KiB, so that finding the limit does not also mean touching all of it.
static void visit(struct block* b, int write) {
  unsigned char* bytes = (unsigned char*)b;
  const size_t header = sizeof *b;
  const size_t size = b->size;
  const unsigned char pattern = b->pattern;
  size_t ranges[3][2] = {{header, size}, {0, 0}, {0, 0}};
  if (size > 64 * 1024) {
    ranges[0][1] = 4096;
    ranges[1][0] = size - 4096;
    ranges[1][1] = size;
    ranges[2][0] = 4096;
    ranges[2][1] = size - 4096;
  }
  for (int r = 0; r < 3; ++r) {
    const size_t step = r == 2 ? 64 * 1024 : 1;
    for (size_t i = ranges[r][0]; i < ranges[r][1]; i += step) {
      if (write) {
        bytes[i] = pattern;
      } else if (bytes[i] != pattern) {
        fprintf(stderr, "FAIL: block %p of %zu bytes: byte %zu is %#x, expected %#x\n",
                (void*)b, size, i, bytes[i], pattern);
        atomic_store(&g_failed, 1);
        return;
      }
    }
  }
}

static size_t size_for(long call) {
  static const size_t sizes[] = {200,         8 * 1024,        64 * 1024, 1 << 20,
                                 3000,        300 * 1024,      3 << 20,   40,
                                 8u << 20,    100 * 1024 + 8,  16 * 1024, 2 << 20};
  return sizes[call % (long)(sizeof sizes / sizeof sizes[0])];
}

// One allocation with function `f`; NULL on failure, with errno the error. For realloc, grows
// the worker's newest block, which must be unchanged when realloc fails.
static struct block* allocate(struct worker* w, int f, size_t size) {
  void* p = NULL;
  int error = 0;
  errno = 0;
  switch (f) {
    case 0: p = malloc(size); break;
    case 1: p = calloc(1, size); break;
    case 2: {
      struct block* old = w->blocks;
      if (old == NULL || old->size >= size) {
        p = realloc(NULL, size);  // realloc as malloc
        break;
      }
      w->blocks = old->next;
      struct block* grown = realloc(old, size);
      if (grown == NULL) {
        error = errno;
        w->blocks = old;  // still ours, unchanged
        visit(old, 0);
        errno = error;
        return NULL;
      }
      visit(grown, 0);  // the header came along: the old contents, at the old size
      grown->size = size;
      return grown;
    }
    case 3: error = posix_memalign(&p, 64, size); errno = error; break;
    case 4: p = aligned_alloc(4096, size); break;
    case 5: p = memalign(256, size); break;
    case 6: p = valloc(size); break;
    default: p = pvalloc(size); break;
  }
  if (p == NULL) return NULL;
  struct block* b = p;
  b->size = size;
  return b;
}

static void* work(void* arg) {
  struct worker* w = arg;
  pthread_barrier_wait(&g_start_barrier);  // no thread takes the limit before all were created
  long first_failure = -1;
  long total_failures = 0;
  for (long call = 0; total_failures < kFailuresWanted; ++call) {
    if (first_failure >= 0 && call - first_failure > kCallsAfterFirstFailure) break;
    const int f = (int)((call + w->index) % kFunctions);
    const size_t size = size_for(call * 7 + w->index);
    struct block* b = allocate(w, f, size);
    if (b == NULL) {
      if (errno != ENOMEM)
        fail("%s returned NULL with errno %ld, expected ENOMEM", kFunctionNames[f], errno);
      ++w->failures[f];
      ++total_failures;
      if (first_failure < 0) first_failure = call;
      continue;
    }
    if (f == 1) {  // calloc: zeroed after the header
      const unsigned char* bytes = (const unsigned char*)b;
      for (size_t i = sizeof *b; i < size; i += 4093)
        if (bytes[i] != 0) fail("%s: block not zeroed (%ld bytes)", "calloc", (long)size);
    }
    b->pattern = (unsigned char)(call * 31 + w->index + 1);
    visit(b, 1);
    b->next = w->blocks;
    w->blocks = b;
    w->allocated_bytes += (long)size;
    ++w->successes;
    if (atomic_load(&g_failed)) break;
  }
  return NULL;
}

static void free_all(struct worker* w) {
  while (w->blocks != NULL) {
    struct block* b = w->blocks;
    w->blocks = b->next;
    visit(b, 0);
    free(b);
  }
}

// After the limit: a thread (or main, arg NULL) that allocates with every function, 1 MiB in
// all, waits for the other threads, and frees.
static void* allocate_after(void* arg) {
  struct worker w = {.index = (int)(long)arg};
  static const size_t sizes[] = {200, 4096, 16 * 1024, 100 * 1024};  // 1 MiB in all
  for (int f = 0; f < kFunctions; ++f) {
    for (int i = 0; i < 4; ++i) {
      struct block* b = allocate(&w, f, sizes[i]);
      if (b == NULL) {
        fail("after freeing everything, %s failed (errno %ld)", kFunctionNames[f], errno);
        free_all(&w);
        if (arg != NULL) pthread_barrier_wait(&g_after_barrier);
        return arg;
      }
      b->pattern = (unsigned char)(f + i + 1);
      visit(b, 1);
      b->next = w.blocks;
      w.blocks = b;
    }
  }
  if (arg != NULL) pthread_barrier_wait(&g_after_barrier);
  free_all(&w);
  return arg;
}

static long vm_size_kib(void) {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == NULL) return -1;
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, "VmSize:", 7) == 0) kib = atol(line + 7);
  fclose(f);
  return kib;
}

static void on_watchdog(int signal) {
  (void)signal;
  static const char message[] = "FAIL: address_limit_test hung: its watchdog fired\n";
  if (write(2, message, sizeof message - 1) < 0) {}
  _exit(1);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGALRM, on_watchdog);
  alarm(kWatchdogSeconds);
  const char* mode = argc > 1 ? argv[1] : "preset";
  struct rlimit limit;
  if (getrlimit(RLIMIT_AS, &limit) != 0) return 3;
  if (strcmp(mode, "setrlimit") == 0) {
    free(malloc(100));  // the allocator has started
    const long vm_kib = vm_size_kib();
    if (vm_kib <= 0) {
      fprintf(stderr, "FAIL: no VmSize in /proc/self/status\n");
      return 1;
    }
    limit.rlim_cur = ((rlim_t)vm_kib + kHeadroomMiB * 1024) * 1024;
    if (limit.rlim_max != RLIM_INFINITY && limit.rlim_cur > limit.rlim_max)
      limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_AS, &limit) != 0) {
      perror("FAIL: setrlimit(RLIMIT_AS)");
      return 1;
    }
    printf("setrlimit: VmSize %ld KiB, RLIMIT_AS now %llu KiB\n", vm_kib,
           (unsigned long long)limit.rlim_cur / 1024);
  } else if (strcmp(mode, "preset") == 0) {
    if (limit.rlim_cur == RLIM_INFINITY) {
      fprintf(stderr, "FAIL: preset mode needs an address-space limit (ulimit -v)\n");
      return 1;
    }
    printf("preset: RLIMIT_AS %llu KiB, VmSize %ld KiB at main\n",
           (unsigned long long)limit.rlim_cur / 1024, vm_size_kib());
  } else {
    fprintf(stderr, "usage: %s [preset|setrlimit]\n", argv[0]);
    return 2;
  }

  // The threads created after the limit, and main.
  pthread_barrier_init(&g_after_barrier, NULL, kThreadsAfter + 1);
  pthread_barrier_init(&g_start_barrier, NULL, kThreads);
  struct worker workers[kThreads];
  memset(workers, 0, sizeof workers);
  for (int i = 0; i < kThreads; ++i) {
    workers[i].index = i;
    const int error = pthread_create(&workers[i].thread, NULL, work, &workers[i]);
    if (error != 0) {
      fprintf(stderr, "FAIL: pthread_create of allocating thread %d: %s\n", i, strerror(error));
      return 1;
    }
  }
  for (int i = 0; i < kThreads; ++i) pthread_join(workers[i].thread, NULL);
  long bytes = 0, successes = 0, failures[kFunctions] = {0};
  for (int i = 0; i < kThreads; ++i) {
    bytes += workers[i].allocated_bytes;
    successes += workers[i].successes;
    for (int f = 0; f < kFunctions; ++f) failures[f] += workers[i].failures[f];
  }
  printf("limit reached: %ld allocations (%ld MiB requested), VmSize %ld KiB; failures:", successes,
         bytes >> 20, vm_size_kib());
  long total_failures = 0;
  for (int f = 0; f < kFunctions; ++f) {
    printf(" %s %ld", kFunctionNames[f], failures[f]);
    total_failures += failures[f];
  }
  printf("\n");
  if (total_failures == 0) {
    fprintf(stderr, "FAIL: no allocation failed: the limit was never reached\n");
    return 1;
  }
  for (int i = 0; i < kThreads; ++i) free_all(&workers[i]);
  printf("all freed: VmSize %ld KiB\n", vm_size_kib());
  // What was freed must be address space again for the rest of the program (thread stacks,
  // file mappings, other libraries): a quarter of the headroom, mapped directly.
  const size_t mapping_bytes = (size_t)kMappingMiB << 20;
  void* mapping = mmap(NULL, mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
  if (mapping == MAP_FAILED) {
    fprintf(stderr, "FAIL: after freeing everything, mmap of %d MiB: %s (the allocator kept the "
            "address space)\n", kMappingMiB, strerror(errno));
    return 1;
  }
  munmap(mapping, mapping_bytes);

  // Recovery: every function in this thread, then new threads.
  // All of them alive at once, more than the allocating threads were: their stacks need new
  // address space, which only what the allocator gave back can provide.
  allocate_after(NULL);
  pthread_t threads[kThreadsAfter];
  for (int i = 0; i < kThreadsAfter; ++i) {
    const int error = pthread_create(&threads[i], NULL, allocate_after, (void*)(long)(i + 1));
    if (error != 0) {
      fprintf(stderr, "FAIL: after freeing everything, pthread_create of thread %d of %d: %s\n",
              i + 1, kThreadsAfter, strerror(error));
      return 1;  // the threads created wait at the barrier: exit ends them
    }
  }
  pthread_barrier_wait(&g_after_barrier);
  for (int i = 0; i < kThreadsAfter; ++i) pthread_join(threads[i], NULL);
  if (atomic_load(&g_failed)) return 1;
  printf("recovered: allocated with every function and created %d threads\n", kThreadsAfter);
  puts("address_limit: ok");
  return 0;
}
