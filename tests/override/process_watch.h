// What the C programs of tests/override that watch a process of their own share: a clock, the
// kernel's count of this process's threads, and what each thread of a hung process waits on.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static inline long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

// From /proc/self/status with open and read: stdio could allocate.
static inline int thread_count(void) {
  const int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[4096];
  const ssize_t length = read(fd, text, sizeof text - 1);
  close(fd);
  if (length <= 0) return -1;
  text[length] = '\0';
  const char* line = strstr(text, "\nThreads:");
  return line != NULL ? atoi(line + 9) : -1;
}

// One line on stderr per thread of `pid`: its state and the kernel function it waits in.
static inline void describe_threads(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR* tasks = opendir(path);
  if (tasks == NULL) return;
  const struct dirent* entry;
  while ((entry = readdir(tasks)) != NULL) {
    if (entry->d_name[0] == '.') continue;
    char file[128], wchan[64] = "?", stat[256] = "?";
    snprintf(file, sizeof file, "%s/%s/wchan", path, entry->d_name);
    FILE* f = fopen(file, "r");
    if (f != NULL) {
      if (fgets(wchan, sizeof wchan, f) == NULL) strcpy(wchan, "?");
      fclose(f);
    }
    snprintf(file, sizeof file, "%s/%s/stat", path, entry->d_name);
    f = fopen(file, "r");
    if (f != NULL) {
      if (fgets(stat, sizeof stat, f) == NULL) strcpy(stat, "?");
      fclose(f);
    }
    const char* state = strrchr(stat, ')');
    fprintf(stderr, "  thread %s: state %c, wchan %s\n", entry->d_name,
            state != NULL && state[1] == ' ' ? state[2] : '?', wchan);
  }
  closedir(tasks);
}
