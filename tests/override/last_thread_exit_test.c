// A process ends when its last thread does: the purger thread must not keep alive a program
// whose own threads have all ended. Two ways to get there, each in a child watched from here:
//   main-exits:  main leaves through pthread_exit while a thread that frees memory (so the
//                purger starts) runs on and then ends;
//   fork-thread: a thread forks; in the child, that thread (the child's only one) frees
//                memory and ends through pthread_exit, as Python's test_threading does.
// Each child must exit with status 0 within kDeadlineSeconds, under LD_PRELOAD=libtraymalloc.so.
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kDeadlineSeconds = 20, kLargeBytes = 1 << 20 };

// Large blocks go back after a delay, which the purger thread waits out: it is running now.
// Then quiet until all of it has gone back, so that the purger sleeps with no deadline when
// the thread ends, and only that thread's end can tell it that no thread holds a heap now.
static void churn(void) {
  for (int i = 0; i < 20; ++i) {
    char* p = malloc(kLargeBytes);
    memset(p, i, kLargeBytes);
    free(p);
  }
  for (int i = 0; i < 10000; ++i) free(malloc(100));
  const struct timespec quiet = {1, 500 * 1000 * 1000};
  nanosleep(&quiet, NULL);
}

static void* worker(void* arg) {
  churn();
  return arg;
}

static void main_exits(void) {
  pthread_t thread;
  if (pthread_create(&thread, NULL, worker, NULL) != 0) _exit(3);
  pthread_exit(NULL);
}

static void* forking_thread(void* arg) {
  const pid_t child = fork();
  if (child < 0) _exit(3);
  if (child == 0) {
    churn();
    pthread_exit(NULL);  // the child's only thread
  }
  int status;
  if (waitpid(child, &status, 0) != child) _exit(4);
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 5);
  return arg;
}

static void fork_thread(void) {
  pthread_t thread;
  if (pthread_create(&thread, NULL, forking_thread, NULL) != 0) _exit(3);
  pthread_join(thread, NULL);
  _exit(6);  // forking_thread ends the process
}

static int run(const char* name, void (*scenario)(void)) {
  fflush(stdout);
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    scenario();
    _exit(7);
  }
  const time_t start = time(NULL);
  int status;
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (time(NULL) - start > kDeadlineSeconds) {
      fprintf(stderr, "FAIL [%s]: still running after %d s once its threads ended\n", name,
              kDeadlineSeconds);
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      return 1;
    }
    usleep(10000);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "FAIL [%s]: status %d\n", name, status);
    return 1;
  }
  printf("%s: exited after %ld s\n", name, (long)(time(NULL) - start));
  return 0;
}

int main(void) {
  int failures = run("main-exits", main_exits);
  failures += run("fork-thread", fork_thread);
  if (failures == 0) puts("last_thread_exit: ok");
  return failures == 0 ? 0 : 1;
}
