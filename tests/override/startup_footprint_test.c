// What preloading traymalloc costs a process that hardly allocates: every program a user runs
// under LD_PRELOAD pays it, most of them small and short (git, sort, a shell). Copies of this
// program make one allocation each and report their peak RSS, some with the preload and some
// without; the test compares the medians of kRuns each. The budget is kStartupBudgetKiB:
// today's cost is about 400 KiB (the library's code and data, some 210 KiB resident, the first
// heap's and segment's metadata, and the pages of libc it calls that a program of glibc's
// malloc alone leaves unread), and a table initialized at load (the guarded slots', 312 KiB,
// zeroed by a constructor in every process) put it at 600 KiB and more.
//
// The copies run without address-space randomization where the kernel allows it: the kernel
// maps the file pages around each fault in aligned windows, so where libc lands decides how
// many of its pages a run has; with randomization glibc's own peak moved by 130-200 KiB from
// run to run, and the cost measured against a low one went over the budget now and then.
#include <dlfcn.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/wait.h>
#include <unistd.h>

enum { kStartupBudgetKiB = 512, kRuns = 5 };

extern char** environ;

static long peak_rss_kib(void) {
  FILE* status = fopen("/proc/self/status", "r");
  if (status == NULL) return -1;
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof line, status) != NULL)
    if (strncmp(line, "VmHWM:", 6) == 0) kib = strtol(line + 6, NULL, 10);
  fclose(status);
  return kib;
}

static long one_allocation_then_peak(void) {
  void* volatile block = malloc(100);
  free(block);
  return peak_rss_kib();
}

// A copy of this program: its peak RSS after one allocation, with LD_PRELOAD in its environment
// as it is here or without it (glibc's malloc).
static long peak_of_copy(const char* self, int preloaded) {
  size_t count = 0;
  while (environ[count] != NULL) ++count;
  char** env = calloc(count + 1, sizeof *env);
  size_t kept = 0;
  for (size_t i = 0; i < count; ++i)
    if (preloaded || strncmp(environ[i], "LD_PRELOAD=", 11) != 0) env[kept++] = environ[i];
  int out[2];
  if (pipe(out) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  char* argv[] = {(char*)self, "child", NULL};
  pid_t child;
  const int spawned = posix_spawn(&child, self, &actions, NULL, argv, env);
  posix_spawn_file_actions_destroy(&actions);
  free(env);
  close(out[1]);
  if (spawned != 0) return -1;
  char text[64] = {0};
  const ssize_t got = read(out[0], text, sizeof text - 1);
  close(out[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return got > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? strtol(text, NULL, 10) : -1;
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "child") == 0) {
    printf("%ld\n", one_allocation_then_peak());
    return 0;
  }
  if (dlsym(RTLD_DEFAULT, "tray_owns") == NULL) {
    fprintf(stderr, "startup_footprint: traymalloc is not preloaded\n");
    return 1;
  }
  // Inherited by the copies, through exec; where it is refused the medians absorb the spread.
  personality(personality(0xffffffff) | ADDR_NO_RANDOMIZE);
  long peaks[2][kRuns];
  for (int i = 0; i < kRuns; ++i) {
    for (int preload = 0; preload < 2; ++preload) {
      const long peak = peak_of_copy("/proc/self/exe", preload);
      if (peak <= 0) {
        fprintf(stderr, "startup_footprint: could not read a peak RSS\n");
        return 1;
      }
      int at = i;  // insertion sort: the runs in order
      for (; at > 0 && peaks[preload][at - 1] > peak; --at) peaks[preload][at] = peaks[preload][at - 1];
      peaks[preload][at] = peak;
    }
  }
  const long plain = peaks[0][kRuns / 2];
  const long preloaded = peaks[1][kRuns / 2];
  printf("startup_footprint: peak RSS %ld KiB preloaded, %ld KiB without (medians of %d; "
         "preloaded %ld..%ld, without %ld..%ld)\n",
         preloaded, plain, kRuns, peaks[1][0], peaks[1][kRuns - 1], peaks[0][0], peaks[0][kRuns - 1]);
  if (preloaded - plain > kStartupBudgetKiB) {
    fprintf(stderr, "startup_footprint: preloading costs %ld KiB, over the budget of %d KiB\n",
            preloaded - plain, kStartupBudgetKiB);
    return 1;
  }
  printf("startup_footprint: ok\n");
  return 0;
}
