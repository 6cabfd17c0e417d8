/* A program linked with libtraymalloc.a, for valgrind's memcheck (TRAY_VALGRIND build) and for
 * AddressSanitizer (TRAY_ASAN build, program built with -fsanitize=address). Mode "buggy" leaks
 * one block and writes to another after freeing it; mode "clean" uses every kind of block
 * correctly (small, large, aligned, zeroed, realloc in every direction, usable size, a thread
 * freeing another's blocks) and must get no report at all. Built at -O0 so that every access
 * stays. */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEAKED_BYTES 200
#define FREED_BYTES 64

void* volatile g_kept;

__attribute__((noinline)) void leak_a_block(void) {
  g_kept = malloc(LEAKED_BYTES); /* still reachable: not a leak */
  char* lost = malloc(LEAKED_BYTES);
  memset(lost, 1, LEAKED_BYTES);
  lost = NULL;
}

__attribute__((noinline)) void write_after_free(void) {
  volatile char* block = malloc(FREED_BYTES);
  free((void*)block);
  block[8] = 'x';
}

static void* free_in_thread(void* blocks) {
  void** list = blocks;
  for (int i = 0; i < 100; ++i) free(list[i]);
  void* own = malloc(48);
  memset(own, 2, 48);
  free(own);
  return NULL;
}

static void check(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "check failed: %s\n", what);
    exit(3);
  }
}

__attribute__((noinline)) void clean(void) {
  for (size_t size = 1; size < 300000; size = size * 3 + 1) {
    char* p = malloc(size);
    memset(p, 7, size);
    p = realloc(p, size * 2); /* grows: the first half is still defined */
    check(p[size - 1] == 7, "realloc kept the data");
    memset(p + size, 8, size);
    p = realloc(p, size / 2 + 1); /* shrinks */
    check(p[0] == 7, "realloc kept the start");
    size_t usable = malloc_usable_size(p);
    memset(p, 9, usable); /* all of the usable size may be written */
    free(p);
  }
  int* zeroed = calloc(1000, sizeof(int));
  for (int i = 0; i < 1000; ++i) check(zeroed[i] == 0, "calloc zeroes");
  free(zeroed);
  char* big = calloc(1, 1 << 20);
  check(big[12345] == 0, "large calloc zeroes");
  free(big);
  void* aligned = NULL;
  check(posix_memalign(&aligned, 4096, 5000) == 0, "posix_memalign");
  memset(aligned, 3, 5000);
  free(aligned);
  aligned = aligned_alloc(64, 640);
  memset(aligned, 3, 640);
  free(aligned);
  void* blocks[100];
  for (int i = 0; i < 100; ++i) blocks[i] = malloc(16 + (size_t)i * 8);
  pthread_t thread;
  check(pthread_create(&thread, NULL, free_in_thread, blocks) == 0, "pthread_create");
  pthread_join(thread, NULL);
  for (int i = 0; i < 1000; ++i) free(malloc(32)); /* reuses what the thread freed */
  free(realloc(NULL, 10));
  check(realloc(malloc(10), 0) == NULL, "realloc to 0 frees");
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  if (strcmp(argv[1], "buggy") == 0) {
    leak_a_block();
    write_after_free();
  } else if (strcmp(argv[1], "clean") == 0) {
    clean();
  } else {
    return 2;
  }
  printf("finished\n");
  return 0;
}
