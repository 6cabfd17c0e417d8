// A library whose constructor makes the process's first call into traymalloc a free of glibc's
// memory, and then a realloc and a malloc_usable_size of it. Linked into first_call_free_test,
// it is initialised before anything traymalloc preloaded would be, unless the loader runs
// traymalloc's constructors first (-z initfirst): before them, the unit map that free reads
// is not reserved yet, and the foreign pointer's way back to glibc is not known.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

int g_first_call_result = -1;  // 0: every call answered as glibc would; >0: the step that failed

__attribute__((constructor)) static void free_foreign_memory_first(void) {
  // RTLD_NEXT from this library skips the preloaded traymalloc: glibc's own functions.
  void* (*glibc_malloc)(size_t) = (void* (*)(size_t))dlsym(RTLD_NEXT, "malloc");
  if (glibc_malloc == NULL) {
    g_first_call_result = 1;
    return;
  }
  char* first = glibc_malloc(100);
  char* second = glibc_malloc(200);
  if (first == NULL || second == NULL) {
    g_first_call_result = 2;
    return;
  }
  memset(second, 's', 200);
  free(first);
  if (malloc_usable_size(second) < 200) {
    g_first_call_result = 3;
    return;
  }
  char* grown = realloc(second, 5000);
  if (grown == NULL || grown[0] != 's' || grown[199] != 's') {
    g_first_call_result = 4;
    return;
  }
  free(grown);
  g_first_call_result = 0;
}
