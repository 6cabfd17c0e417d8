// Single-thread malloc/free pairs: each iteration allocates one block and frees it at once,
// so a size-class allocator serves it from the front of one free list. This is the fast path
// and nothing else; the batch and thread benchmarks cover what a pair cannot.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

namespace {

void BM_malloc_free(benchmark::State& state) {
  const auto size = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* block = std::malloc(size);
    benchmark::DoNotOptimize(block);
    std::free(block);
  }
  state.SetItemsProcessed(state.iterations());
}
// 8 B to 1 MiB by doublings: every small size class range and the first large blocks.
BENCHMARK(BM_malloc_free)->RangeMultiplier(2)->Range(8, 1 << 20);

void BM_calloc_free(benchmark::State& state) {
  const auto size = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* block = std::calloc(1, size);
    benchmark::DoNotOptimize(block);
    std::free(block);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_calloc_free)->Arg(64)->Arg(4096)->Arg(64 << 10)->Arg(1 << 20);

void BM_aligned_alloc_free(benchmark::State& state) {
  const auto alignment = static_cast<size_t>(state.range(0));
  const auto size = static_cast<size_t>(state.range(1));
  for (auto _ : state) {
    void* block = std::aligned_alloc(alignment, size);
    benchmark::DoNotOptimize(block);
    std::free(block);
  }
  state.SetItemsProcessed(state.iterations());
}
// {alignment, size}: cache-line objects, over-aligned small blocks and page-aligned buffers.
BENCHMARK(BM_aligned_alloc_free)
    ->ArgNames({"align", "size"})
    ->Args({16, 64})
    ->Args({64, 64})
    ->Args({64, 1024})
    ->Args({256, 1024})
    ->Args({4096, 4096})
    ->Args({4096, 64 << 10});

// operator new and the sized operator delete that a `delete obj` of a complete type calls.
void BM_new_delete(benchmark::State& state) {
  const auto size = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* object = ::operator new(size);
    benchmark::DoNotOptimize(object);
    ::operator delete(object, size);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_new_delete)->RangeMultiplier(4)->Range(16, 4096);

// A buffer that grows by half each time, the way std::vector and string builders grow,
// touching its new last byte so a lazily mapped allocator pays for the pages it hands out.
void BM_realloc_growth(benchmark::State& state) {
  const auto final_size = static_cast<size_t>(state.range(0));
  int64_t reallocs = 0;
  for (auto _ : state) {
    size_t size = 16;
    auto* buffer = static_cast<char*>(std::malloc(size));
    while (size < final_size) {
      size += size / 2;
      buffer = static_cast<char*>(std::realloc(buffer, size));
      buffer[size - 1] = 1;
      ++reallocs;
    }
    benchmark::DoNotOptimize(buffer);
    std::free(buffer);
  }
  state.counters["reallocs"] = benchmark::Counter(static_cast<double>(reallocs),
                                                  benchmark::Counter::kAvgIterations);
  state.SetItemsProcessed(reallocs);
}
BENCHMARK(BM_realloc_growth)->Arg(4 << 10)->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20);

}  // namespace
