// The first call a process makes into a preloaded traymalloc is a free of glibc's memory, from
// a library constructor that runs before any of the program's (first_call_free_lib.c). It
// must go back to glibc: no crash, realloc keeps the contents, and allocation works after.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int g_first_call_result;

int main(void) {
  if (g_first_call_result != 0) {
    fprintf(stderr, "FAIL: the constructor's calls failed at step %d\n", g_first_call_result);
    return 1;
  }
  char* p = malloc(64);
  if (p == NULL) return 1;
  memset(p, 1, 64);
  free(p);
  puts("first_call_free: ok");
  return 0;
}
