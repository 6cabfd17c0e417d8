/* Heap mistakes that guarded sampling (TRAY_OPTIONS=guard_sample=1) must catch, one per mode
 * named on the command line. Built at -O0 with -rdynamic, so every faulty access stays in the
 * program and the report's stacks can name the functions below. Accesses go through volatile
 * pointers so the compiler keeps them. Every mode that gets past its mistake prints "finished". */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BLOCK_BYTES 64 /* a multiple of the class alignment: no padding before the guard page */

__attribute__((noinline)) char* allocate_block(size_t size) { return malloc(size); }
__attribute__((noinline)) void free_block(void* block) { free(block); }

/* Guarded blocks alternate between the end of their slot (an overflow faults) and its start (an
 * underflow faults): of two blocks, one faults at once and the other at the latest at free,
 * through the canary around it. */
__attribute__((noinline)) void overflow_by_one(void) {
  volatile char* a = allocate_block(BLOCK_BYTES);
  volatile char* b = allocate_block(BLOCK_BYTES);
  a[BLOCK_BYTES] = 'x';
  b[BLOCK_BYTES] = 'x';
  free_block((void*)a);
  free_block((void*)b);
}

__attribute__((noinline)) void underflow_by_one(void) {
  volatile char* a = allocate_block(BLOCK_BYTES);
  volatile char* b = allocate_block(BLOCK_BYTES);
  a[-1] = 'x';
  b[-1] = 'x';
  free_block((void*)a);
  free_block((void*)b);
}

/* 13 bytes in a 16-byte-aligned block: the byte after it is padding before the guard page,
 * which only the canary check at free can see. */
__attribute__((noinline)) void overflow_into_padding(void) {
  volatile char* a = allocate_block(13);
  volatile char* b = allocate_block(13);
  a[13] = 'x';
  b[13] = 'x';
  free_block((void*)a);
  free_block((void*)b);
}

__attribute__((noinline)) void use_after_free(void) {
  volatile char* a = allocate_block(BLOCK_BYTES);
  free_block((void*)a);
  a[8] = 'x';
}

__attribute__((noinline)) void double_free(void) {
  char* a = allocate_block(BLOCK_BYTES);
  free_block(a);
  free_block(a);
}

/* Correct use of every entry point on a guarded block: nothing to report. */
__attribute__((noinline)) void correct_use(void) {
  char* a = allocate_block(100);
  memset(a, 1, 100);
  if (malloc_usable_size(a) < 100) abort();
  a = realloc(a, 3000);
  for (int i = 0; i < 100; ++i)
    if (a[i] != 1) abort();
  a = realloc(a, 10);
  free(a);
  void* aligned = NULL;
  if (posix_memalign(&aligned, 256, 200) != 0 || ((size_t)aligned & 255) != 0) abort();
  free(aligned);
  char* zeroed = calloc(50, 40);
  for (int i = 0; i < 2000; ++i)
    if (zeroed[i] != 0) abort();
  free(zeroed);
  for (int i = 0; i < 2000; ++i) free(malloc((size_t)(i % 5000)));
}

static void own_handler(int signo) {
  (void)signo;
  static const char text[] = "own handler\n";
  write(STDOUT_FILENO, text, sizeof text - 1);
  _exit(42);
}

/* A fault of the program's own, away from any guarded block, with traymalloc's handler installed
 * after the program's (own-handler) or with none of the program's (own-fault-default). */
__attribute__((noinline)) void own_fault(int with_handler) {
  if (with_handler) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = own_handler;
    sigaction(SIGSEGV, &action, NULL);
  }
  free_block(allocate_block(BLOCK_BYTES)); /* guarded: traymalloc installs its handler now */
  volatile char* page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  page[0] = 'x';
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const char* mode = argv[1];
  if (strcmp(mode, "overflow") == 0) overflow_by_one();
  else if (strcmp(mode, "underflow") == 0) underflow_by_one();
  else if (strcmp(mode, "overflow-padding") == 0) overflow_into_padding();
  else if (strcmp(mode, "use-after-free") == 0) use_after_free();
  else if (strcmp(mode, "double-free") == 0) double_free();
  else if (strcmp(mode, "correct") == 0) correct_use();
  else if (strcmp(mode, "own-handler") == 0) own_fault(1);
  else if (strcmp(mode, "own-fault-default") == 0) own_fault(0);
  else return 2;
  printf("finished\n");
  return 0;
}
