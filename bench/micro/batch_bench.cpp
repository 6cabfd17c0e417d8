// Batches: the 1000 mixed sizes of mixed_batch.h (8..1024 B) are all allocated, then all
// freed, in the order the benchmark names. Unlike a pair, a batch walks many size classes,
// fills and empties whole pages, and (freed FIFO or shuffled) returns blocks in an order
// that scatters each free list. One item is one malloc+free pair.
#include <benchmark/benchmark.h>

#include <array>
#include <cstddef>
#include <cstdlib>

#include "mixed_batch.h"

namespace {

enum class FreeOrder { lifo, fifo, shuffled };

struct MixedBatch {
  std::array<size_t, MIXED_BATCH_COUNT> sizes{};
  std::array<size_t, MIXED_BATCH_COUNT> shuffled_order{};
  MixedBatch() {
    mixed_batch_sizes(sizes.data());
    mixed_batch_shuffled_order(shuffled_order.data());
  }
};

const MixedBatch& mixed_batch() {
  static const MixedBatch batch;
  return batch;
}

void BM_mixed_batch(benchmark::State& state, FreeOrder order) {
  const MixedBatch& batch = mixed_batch();
  std::array<void*, MIXED_BATCH_COUNT> blocks{};
  for (auto _ : state) {
    for (size_t i = 0; i < MIXED_BATCH_COUNT; ++i) blocks[i] = std::malloc(batch.sizes[i]);
    benchmark::DoNotOptimize(blocks.data());
    switch (order) {
      case FreeOrder::lifo:
        for (size_t i = MIXED_BATCH_COUNT; i-- > 0;) std::free(blocks[i]);
        break;
      case FreeOrder::fifo:
        for (size_t i = 0; i < MIXED_BATCH_COUNT; ++i) std::free(blocks[i]);
        break;
      case FreeOrder::shuffled:
        for (size_t i = 0; i < MIXED_BATCH_COUNT; ++i) std::free(blocks[batch.shuffled_order[i]]);
        break;
    }
  }
  state.SetItemsProcessed(state.iterations() * MIXED_BATCH_COUNT);
}
BENCHMARK_CAPTURE(BM_mixed_batch, lifo, FreeOrder::lifo);
BENCHMARK_CAPTURE(BM_mixed_batch, fifo, FreeOrder::fifo);
BENCHMARK_CAPTURE(BM_mixed_batch, shuffled, FreeOrder::shuffled);

}  // namespace
