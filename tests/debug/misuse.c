/* Heap misuse that traymalloc's debug mode (TRAY_OPTIONS=debug=1) must report: one mistake per
 * mode, named on the command line. The program is built at -O0 and reaches memory through
 * volatile pointers so that the compiler keeps every faulty access and every malloc/free pair.
 *
 * Modes that read memory print the word they read in hex. Every mode that gets past its
 * mistake prints "finished", so a test can tell a report that went on from one that aborted. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LARGE_BYTES ((size_t)3 << 20) /* above the largest size class (2 MiB) */
/* Not a multiple of the page size, so the block has slack to overflow into without debug. */
#define LARGE_ODD_BYTES ((size_t)3000000)
/* More frees than the quarantine holds (4096 blocks), so the oldest block leaves it. */
#define CHURN_FREES 5000

static void free_many_other_blocks(size_t size) {
  for (int i = 0; i < CHURN_FREES; ++i) free(malloc(size));
}

/* The first bytes of a freed 64-byte block would be its free-list link outside debug mode,
 * so the stale write goes further in. */
static void write_after_free(void) {
  volatile uint32_t* block = malloc(64);
  free((void*)block);
  block[6] = 0; /* byte offset 24 */
  free_many_other_blocks(64);
}

/* tcache poisoning's first step: the freed block's link overwritten with an address of the
 * attacker's choosing, then two mallocs of its class, the second of which would return it. */
static char g_target[64];
static void poison_link(void) {
  void* volatile* block = malloc(40);
  free((void*)block);
  block[0] = g_target;
  void* first = malloc(40);
  void* second = malloc(40);
  printf("%s\n", second == g_target ? "exploited" : "not exploited");
  fflush(stdout); /* before a report aborts */
  free(first);
  free_many_other_blocks(40);
}

/* A linear overflow of two bytes out of a live block into its freed neighbour, whose first
 * bytes are its free-list link outside debug mode. Blocks of a fresh page come in address
 * order, so the second is the first's neighbour. */
static void overflow_into_link(void) {
  volatile char* live = malloc(40);
  void* neighbour = malloc(40);
  free(neighbour);
  live[48] = 'A';
  live[49] = 'A';
  for (int i = 0; i < 3; ++i) (void)malloc(40);
  free_many_other_blocks(40);
}

static void double_free(size_t size) {
  void* block = malloc(size);
  free(block);
  free(block);
}

/* One byte past the requested size: the classic off-by-one. */
static void overflow(size_t size) {
  volatile char* block = malloc(size);
  block[size] = 'x';
  free((void*)block);
}

/* A fake block on the stack, with the two words in front that glibc's free would read as its
 * chunk header: traymalloc stops the program before the pointer can reach glibc. */
static void free_stack_pointer(void) {
  volatile size_t on_stack[3] = {0, 0, 0};
  free((void*)&on_stack[2]);
}

static void free_interior_pointer(void) {
  char* block = malloc(40);
  free(block + 8);
}

static void realloc_freed_block(void) {
  void* block = malloc(40);
  free(block);
  void* moved = realloc(block, 100);
  printf("realloc returned %s\n", moved == NULL ? "NULL" : "a block");
}

static void print_first_word(volatile uint32_t* block) { printf("%08x\n", (unsigned)block[0]); }

static void read_fresh_block(void) {
  volatile uint32_t* block = malloc(64);
  print_first_word(block);
  free((void*)block);
}

static void read_freed_block(void) {
  volatile uint32_t* block = malloc(64);
  free((void*)block);
  print_first_word(block);
}

static void write_to_freed_large_block(void) {
  volatile char* block = malloc(LARGE_BYTES);
  memset((void*)block, 1, LARGE_BYTES);
  free((void*)block);
  block[100] = 2;
}

struct mode {
  const char* name;
  void (*run)(void);
};

static void double_free_small(void) { double_free(40); }
static void double_free_large(void) { double_free(LARGE_BYTES); }
static void overflow_small(void) { overflow(40); }
static void overflow_large(void) { overflow(LARGE_ODD_BYTES); }

static const struct mode kModes[] = {
    {"write-after-free", write_after_free},
    {"double-free-small", double_free_small},
    {"double-free-large", double_free_large},
    {"overflow-small", overflow_small},
    {"overflow-large", overflow_large},
    {"free-stack", free_stack_pointer},
    {"free-interior", free_interior_pointer},
    {"realloc-freed", realloc_freed_block},
    {"poison-link", poison_link},
    {"overflow-into-link", overflow_into_link},
    {"read-fresh", read_fresh_block},
    {"read-freed", read_freed_block},
    {"large-use-after-free", write_to_freed_large_block},
};

int main(int argc, char** argv) {
  const size_t count = sizeof kModes / sizeof kModes[0];
  for (size_t i = 0; argc == 2 && i < count; ++i) {
    if (strcmp(argv[1], kModes[i].name) != 0) continue;
    kModes[i].run();
    printf("finished\n");
    return 0;
  }
  fprintf(stderr, "usage: %s MODE\nmodes:", argv[0]);
  for (size_t i = 0; i < count; ++i) fprintf(stderr, " %s", kModes[i].name);
  fprintf(stderr, "\n");
  return 2;
}
