// cache_thrash: threads that at the same moment each allocate a tiny block, write it hard and
// free it, over and over. An allocator that carves the blocks of different threads from one
// cache line (active false sharing: a shared free list or bump pointer handing out neighbouring
// 8-byte blocks to whichever thread asks) makes every write bounce that line between cores.
//
// Models Hoard's cache-thrash benchmark (Berger et al., "Hoard: a scalable memory allocator for
// multithreaded applications", ASPLOS 2000; also in mimalloc-bench as cache-thrash). Every
// worker waits at a common start, then repeatedly allocates an 8-byte block, increments each of
// its bytes many times through a volatile pointer and frees it. Unlike `cache_scratch` nothing
// is handed between threads first: the sharing, if any, comes from the allocator alone. Time is
// dominated by the writes, so the figure shows whether the threads' blocks were kept apart.
//
// Check: each block, zeroed when allocated, must hold exactly the number of increments (mod
// 256) in every byte before it is freed. The result also counts the threads whose first block,
// held while every other thread held its own, shared a cache line with another thread's
// (first_blocks_sharing_a_line; information, not a check).
// Ops: one block allocated and written. Default: 4 threads, 10k blocks each, 20k writes per
// byte.
#include <cstdlib>
#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kObjectBytes = 8;
constexpr unsigned kWritesPerByte = 20'000;
constexpr uint64_t kBlocksPerThread = 10'000;
constexpr uintptr_t kCacheLineBytes = 64;

struct Shared {
  uint64_t blocks_per_thread = 0;
  workload::CheckCounter checks;
  // The cache line of each thread's first block. Every thread holds its first block until all
  // have one, so two threads on one line there is false sharing the allocator caused.
  std::vector<uintptr_t> first_lines;
};

void thrash(Shared& shared, std::latch& start, std::latch& first_held, unsigned thread) {
  start.arrive_and_wait();
  for (uint64_t i = 0; i < shared.blocks_per_thread; ++i) {
    auto* object = static_cast<unsigned char*>(std::malloc(kObjectBytes));
    if (i == 0) {
      shared.first_lines[thread] = reinterpret_cast<uintptr_t>(object) / kCacheLineBytes;
      first_held.arrive_and_wait();
    }
    shared.checks.expect(workload::write_hard(object, kObjectBytes, kWritesPerByte),
                  "cache_thrash: increments lost");
    std::free(object);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"cache_thrash", 4});
  const unsigned threads = options.threads;
  Shared shared;
  shared.blocks_per_thread = options.scaled(kBlocksPerThread, 10);
  shared.first_lines.assign(threads, 0);

  const workload::Stopwatch stopwatch;
  std::latch start(threads), first_held(threads);
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back(thrash, std::ref(shared), std::ref(start), std::ref(first_held), t);
  for (std::thread& worker : workers) worker.join();
  const double seconds = stopwatch.seconds();

  // Threads whose first block shared a cache line with an earlier thread's.
  unsigned shared_first_lines = 0;
  for (unsigned t = 0; t < threads; ++t)
    for (unsigned u = 0; u < t; ++u)
      if (shared.first_lines[u] == shared.first_lines[t]) {
        ++shared_first_lines;
        break;
      }
  return workload::report("cache_thrash", threads, uint64_t{threads} * shared.blocks_per_thread,
                          seconds, shared.checks,
                          " first_blocks_sharing_a_line=" + std::to_string(shared_first_lines));
}
