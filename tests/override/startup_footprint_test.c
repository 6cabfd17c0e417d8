// What preloading traymalloc costs a process that hardly allocates: every program a user runs
// under LD_PRELOAD pays it, most of them small and short (git, sort, a shell). This process,
// preloaded, makes one allocation and compares its peak RSS with that of a copy of itself run
// without the preload (the median of kBaselineRuns: glibc's own peak moves by 200 KiB from run
// to run, the preloaded one by a few KiB). The budget is kStartupBudgetKiB: today's cost is
// about 300 KiB (the library's code and data, the first heap's and segment's metadata), and a table initialized
// at load (the guarded slots', 312 KiB, zeroed by a constructor in every process) put it at
// 600 KiB and more.
#include <dlfcn.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { kStartupBudgetKiB = 512, kBaselineRuns = 5 };

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

// The same program, without LD_PRELOAD in its environment: glibc's malloc.
static long peak_without_preload(const char* self) {
  size_t count = 0;
  while (environ[count] != NULL) ++count;
  char** env = calloc(count + 1, sizeof *env);
  size_t kept = 0;
  for (size_t i = 0; i < count; ++i)
    if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0) env[kept++] = environ[i];
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
  const long preloaded = one_allocation_then_peak();
  long runs[kBaselineRuns];
  for (int i = 0; i < kBaselineRuns; ++i) {
    const long peak = peak_without_preload("/proc/self/exe");
    int at = i;  // insertion sort: the runs in order
    for (; at > 0 && runs[at - 1] > peak; --at) runs[at] = runs[at - 1];
    runs[at] = peak;
  }
  const long plain = runs[kBaselineRuns / 2];
  printf("startup_footprint: peak RSS %ld KiB preloaded, %ld KiB without\n", preloaded, plain);
  if (preloaded < 0 || runs[0] <= 0) {
    fprintf(stderr, "startup_footprint: could not read a peak RSS\n");
    return 1;
  }
  if (preloaded - plain > kStartupBudgetKiB) {
    fprintf(stderr, "startup_footprint: preloading costs %ld KiB, over the budget of %d KiB\n",
            preloaded - plain, kStartupBudgetKiB);
    return 1;
  }
  printf("startup_footprint: ok\n");
  return 0;
}
