// The kernel refuses setns into a mount namespace and unshare of a user namespace (EINVAL) to
// a process with more than one thread. A program whose own threads have all ended, and that
// made large allocations under LD_PRELOAD=libtraymalloc.so, has the purger thread beside it,
// which it never made (a program that never started a thread gets none): traymalloc's setns
// and unshare end that thread first, and it comes back at the next allocation. Here, in order:
//   a thread of the program allocates and ends;
//   large blocks come and go, and the process has two threads (else nothing is tested: fail);
//   setns into its own mount namespace succeeds;
//   large blocks again: two threads again (the purger is back);
//   unshare(CLONE_NEWUSER) succeeds.
// A refusal that is the environment's (EPERM where namespaces are not allowed, or EINVAL with
// one thread counted, as in a chroot) skips that step; EINVAL while the process still counts
// two threads is the failure this tests. Exits 77 when both steps were skipped.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "process_watch.h"

enum { kLargeBytes = 4 << 20, kWaitMs = 3000 };

// Large blocks, touched and freed, leave memory for the purger to give back: it starts.
static void large_blocks(void) {
  for (int i = 0; i < 3; ++i) {
    char* volatile p = malloc(kLargeBytes);
    if (p == NULL) exit(3);
    memset(p, i, kLargeBytes);
    free(p);
  }
}

static int wait_for_threads(int wanted) {
  for (int ms = 0; ms < kWaitMs; ++ms) {
    if (thread_count() == wanted) return 1;
    const struct timespec step = {0, 1000 * 1000};
    nanosleep(&step, NULL);
  }
  return 0;
}

// 1: done; 0: the environment refused it; exits 1 when the purger was in the way.
static int step_result(const char* what, int result, int error) {
  if (result == 0) {
    printf("%s: ok\n", what);
    return 1;
  }
  const int threads = thread_count();
  if (error == EINVAL && threads != 1) {
    printf("FAIL: %s: EINVAL with %d threads (the purger was not ended)\n", what, threads);
    exit(1);
  }
  printf("%s: skipped (%s with %d thread%s: the environment's refusal)\n", what, strerror(error),
         threads, threads == 1 ? "" : "s");
  return 0;
}

static void* allocate_and_end(void* unused) {
  (void)unused;
  free(malloc(64));
  return NULL;
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  pthread_t thread;
  if (pthread_create(&thread, NULL, allocate_and_end, NULL) != 0 || pthread_join(thread, NULL) != 0)
    return 3;
  large_blocks();
  if (!wait_for_threads(2)) {
    printf("FAIL: expected the purger beside main after large blocks, counted %d threads\n",
           thread_count());
    return 1;
  }
  int done = 0;
  const int mount_ns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
  if (mount_ns < 0) return 3;
  int result = setns(mount_ns, CLONE_NEWNS);
  done += step_result("setns(mount)", result, errno);
  close(mount_ns);

  large_blocks();
  if (!wait_for_threads(2)) {
    printf("FAIL: the purger did not come back after setns, counted %d threads\n", thread_count());
    return 1;
  }
  result = unshare(CLONE_NEWUSER);
  done += step_result("unshare(user)", result, errno);
  large_blocks();  // and the allocator still works, its purger started again
  if (done == 0) return 77;
  printf("one_thread_calls: ok\n");
  return 0;
}
