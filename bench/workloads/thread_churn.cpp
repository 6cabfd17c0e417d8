// thread_churn: thousands of short-lived threads, each allocating a little and leaving some of
// its blocks behind for the main thread to free after it has exited.
//
// Models thread-per-request servers and code that starts a std::thread per task. No classic
// benchmark isolates this; the nearest is the original Larson benchmark, which ends each
// thread after its round and hands its blocks to a freshly created one. A per-thread allocator
// pays here for setting up and tearing down a heap per thread, and must take frees of blocks
// whose owning thread is gone (abandoned or adopted pages) without leaking them.
//
// Check: every block is stamped; the thread verifies the half it frees, the main thread the
// half it inherits.
// Ops: one thread. Default: 4000 threads in waves of 4, 200 blocks of 16..2048 B each.
#include <cstdlib>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr unsigned kBlocksPerThread = 200;
constexpr size_t kMinBytes = 16;
constexpr size_t kMaxBytes = 2048;

using Block = workload::StampedBlock;

// Runs in the short-lived thread; the blocks it leaves in `inherited` outlive it.
void short_job(uint64_t job, std::vector<Block>& inherited, workload::CheckCounter& checks) {
  workload::Rng rng(5000 + job);
  Block blocks[kBlocksPerThread];
  for (unsigned i = 0; i < kBlocksPerThread; ++i) {
    Block& block = blocks[i];
    block.bytes = rng.log_between(kMinBytes, kMaxBytes);
    block.ptr = std::malloc(block.bytes);
    block.tag = workload::block_tag(job, i + 1);
    workload::stamp(block.ptr, block.bytes, block.tag);
  }
  for (unsigned i = 0; i < kBlocksPerThread; i += 2) {
    checks.expect(workload::stamp_intact(blocks[i].ptr, blocks[i].bytes, blocks[i].tag),
                  "thread_churn: block freed by its thread");
    std::free(blocks[i].ptr);
  }
  for (unsigned i = 1; i < kBlocksPerThread; i += 2) inherited.push_back(blocks[i]);
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"thread_churn", 4});
  const unsigned wave = options.threads;
  const uint64_t jobs = options.scaled(4000, 2 * wave);

  workload::CheckCounter checks;
  std::vector<std::vector<Block>> inherited(wave);
  for (std::vector<Block>& blocks : inherited) blocks.reserve(kBlocksPerThread);
  const workload::Stopwatch stopwatch;
  std::vector<std::thread> running;
  for (uint64_t first = 0; first < jobs; first += wave) {
    for (unsigned t = 0; t < wave && first + t < jobs; ++t)
      running.emplace_back(short_job, first + t, std::ref(inherited[t]), std::ref(checks));
    for (std::thread& thread : running) thread.join();
    running.clear();
    for (std::vector<Block>& blocks : inherited) {
      for (const Block& block : blocks) {
        checks.expect(workload::stamp_intact(block.ptr, block.bytes, block.tag),
                      "thread_churn: block inherited from an exited thread");
        std::free(block.ptr);
      }
      blocks.clear();
    }
  }
  const double seconds = stopwatch.seconds();

  return workload::report("thread_churn", wave, jobs, seconds, checks);
}
