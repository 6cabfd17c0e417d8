/* A bare malloc/free loop for instruction counting under callgrind (tools/bench-compare
 * --callgrind). No benchmark framework runs inside, so running it with two iteration counts
 * and subtracting the totals leaves only the loop: instructions per malloc+free pair.
 *
 *   pair_loop pair SIZE N   N times: p = malloc(SIZE); free(p)
 *   pair_loop batch N       N rounds: malloc the 1000 mixed sizes of mixed_batch.h, then free
 *                           them in its shuffled order
 *
 * Calls go through volatile function pointers: the compiler cannot see that they are malloc
 * and free, so it can neither drop a pair nor merge the calls of a round. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mixed_batch.h"

static void* (*volatile malloc_fn)(size_t) = malloc;
static void (*volatile free_fn)(void*) = free;

static int parse_count(const char* text, unsigned long long* out) {
  char* end = NULL;
  errno = 0;
  *out = strtoull(text, &end, 10);
  return errno == 0 && end != text && *end == '\0';
}

static int run_pairs(size_t size, unsigned long long iterations) {
  for (unsigned long long i = 0; i < iterations; ++i) {
    void* block = malloc_fn(size);
    if (block == NULL) return 1;
    free_fn(block);
  }
  return 0;
}

static int run_batches(unsigned long long rounds) {
  static size_t sizes[MIXED_BATCH_COUNT];
  static size_t free_order[MIXED_BATCH_COUNT];
  static void* blocks[MIXED_BATCH_COUNT];
  mixed_batch_sizes(sizes);
  mixed_batch_shuffled_order(free_order);
  for (unsigned long long r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < MIXED_BATCH_COUNT; ++i) {
      blocks[i] = malloc_fn(sizes[i]);
      if (blocks[i] == NULL) return 1;
    }
    for (size_t i = 0; i < MIXED_BATCH_COUNT; ++i) free_fn(blocks[free_order[i]]);
  }
  return 0;
}

int main(int argc, char** argv) {
  unsigned long long size = 0;
  unsigned long long count = 0;
  int failed = -1;
  if (argc == 4 && strcmp(argv[1], "pair") == 0 && parse_count(argv[2], &size) &&
      parse_count(argv[3], &count))
    failed = run_pairs((size_t)size, count);
  else if (argc == 3 && strcmp(argv[1], "batch") == 0 && parse_count(argv[2], &count))
    failed = run_batches(count);
  if (failed < 0) {
    fprintf(stderr, "usage: %s pair SIZE N | batch N\n", argv[0]);
    return 2;
  }
  if (failed) fprintf(stderr, "pair_loop: malloc returned NULL\n");
  return failed;
}
