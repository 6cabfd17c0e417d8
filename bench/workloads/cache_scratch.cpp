// cache_scratch: small blocks handed to other threads, then allocated again and written hard.
// An allocator that gives a thread back the block it just freed for another thread can put
// blocks of different threads on one cache line (passive false sharing), and every write then
// bounces that line between cores.
//
// Models Hoard's cache-scratch benchmark (Berger et al., "Hoard: a scalable memory allocator
// for multithreaded applications", ASPLOS 2000; also in mimalloc-bench). The main thread
// allocates one 8-byte block per worker, back to back, and hands them out. Each worker frees
// the block it was given, then repeatedly allocates an 8-byte block, increments every byte of
// it many times and frees it. Time is dominated by the writes, so the figure shows whether the
// allocator kept the workers' blocks apart, not how fast it allocates.
//
// Check: each block, zeroed when allocated, must hold exactly the number of increments (mod
// 256) in every byte before it is freed.
// Ops: one block allocated and written. Default: 4 threads, 20k blocks each, 1000 writes per byte.
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kObjectBytes = 8;
constexpr unsigned kWritesPerByte = 1000;

void scratch(void* handed_over, uint64_t blocks, workload::CheckCounter& checks) {
  std::free(handed_over);
  for (uint64_t i = 0; i < blocks; ++i) {
    auto* object = static_cast<unsigned char*>(std::malloc(kObjectBytes));
    checks.expect(workload::write_hard(object, kObjectBytes, kWritesPerByte),
                  "cache_scratch: increments lost");
    std::free(object);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"cache_scratch", 4});
  const unsigned threads = options.threads;
  const uint64_t blocks_per_thread = options.scaled(20'000, 10);

  workload::CheckCounter checks;
  const workload::Stopwatch stopwatch;
  std::vector<void*> handed_over(threads);
  for (void*& block : handed_over) block = std::malloc(kObjectBytes);
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back(scratch, handed_over[t], blocks_per_thread, std::ref(checks));
  for (std::thread& worker : workers) worker.join();
  const double seconds = stopwatch.seconds();

  return workload::report("cache_scratch", threads, uint64_t{threads} * blocks_per_thread, seconds,
                          checks);
}
