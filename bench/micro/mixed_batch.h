/* The mixed batch shared by the Google Benchmark programs and pair_loop: 1000 request sizes
 * spread uniformly over 8..1024 bytes and a free order that differs from the allocation order.
 * Both come from fixed seeds, so every allocator (and every run) sees the same sequence, and a
 * callgrind count taken with pair_loop describes the same work as the timed benchmark.
 * Plain C so that pair_loop stays free of C++ runtime start-up. */
#ifndef TRAY_BENCH_MIXED_BATCH_H
#define TRAY_BENCH_MIXED_BATCH_H

#include <stddef.h>
#include <stdint.h>

#define MIXED_BATCH_COUNT 1000
#define MIXED_BATCH_MIN_BYTES 8
#define MIXED_BATCH_MAX_BYTES 1024

/* xorshift64*: small, fast and good enough to spread sizes and shuffle an order. */
static inline uint64_t mixed_batch_next(uint64_t* state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1DULL;
}

static inline void mixed_batch_sizes(size_t sizes[MIXED_BATCH_COUNT]) {
  uint64_t state = 0x9E3779B97F4A7C15ULL;
  const uint64_t span = MIXED_BATCH_MAX_BYTES - MIXED_BATCH_MIN_BYTES + 1;
  for (size_t i = 0; i < MIXED_BATCH_COUNT; ++i)
    sizes[i] = MIXED_BATCH_MIN_BYTES + (size_t)(mixed_batch_next(&state) % span);
}

/* A fixed random permutation of 0..MIXED_BATCH_COUNT-1 (Fisher-Yates). */
static inline void mixed_batch_shuffled_order(size_t order[MIXED_BATCH_COUNT]) {
  uint64_t state = 0xD1B54A32D192ED03ULL;
  for (size_t i = 0; i < MIXED_BATCH_COUNT; ++i) order[i] = i;
  for (size_t i = MIXED_BATCH_COUNT - 1; i > 0; --i) {
    const size_t j = (size_t)(mixed_batch_next(&state) % (i + 1));
    const size_t held = order[i];
    order[i] = order[j];
    order[j] = held;
  }
}

#endif /* TRAY_BENCH_MIXED_BATCH_H */
