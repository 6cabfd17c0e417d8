// exchange: threads in a ring, each allocating an array of blocks of many sizes, handing the
// array to the next thread and freeing, in order, the array the thread before handed to it.
//
// The cross-thread part of MicroQuill's sh8bench as mimalloc-bench runs it ("sh8benchN"): every
// block is freed by a thread other than the one that allocated it, and right after that thread
// frees it, it allocates as many blocks again. Worker threads of a pipeline (a stage builds a
// message of many small objects, the next stage consumes it and builds its own) have this
// shape. An allocator whose freeing thread reuses what it freed (tcmalloc's thread caches)
// keeps each block on one core per round; one that sends each block back to the page it came
// from moves it back to the allocating thread's core as well.
//
// Each round a thread allocates 2000 blocks whose sizes step through 1..1000 B (7 B apart,
// wrapping), stamps each, pushes the array onto the next thread's inbox (a mutex and a
// condition variable), then waits for an array in its own inbox and frees its blocks, front to
// back one round and back to front the next, checking every stamp first. The arrays in flight
// are at most one per thread.
//
// Check: every block's stamp is intact when freed; every array handed on is freed.
// Ops: one block (its malloc and its free). Default: 2 threads, 3000 rounds each.
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kBlocksPerArray = 2000;
constexpr size_t kMaxBytes = 1000;
constexpr size_t kSizeStepBytes = 7;
constexpr uint64_t kRoundsPerThread = 3000;

using Block = workload::StampedBlock;

struct Inbox {
  std::mutex lock;
  std::condition_variable ready;
  std::deque<Block*> arrays;
};

void push(Inbox& inbox, Block* array) {
  {
    const std::lock_guard<std::mutex> guard(inbox.lock);
    inbox.arrays.push_back(array);
  }
  inbox.ready.notify_one();
}

Block* pop(Inbox& inbox) {
  std::unique_lock<std::mutex> guard(inbox.lock);
  inbox.ready.wait(guard, [&] { return !inbox.arrays.empty(); });
  Block* array = inbox.arrays.front();
  inbox.arrays.pop_front();
  return array;
}

void free_array(Block* array, bool backwards, workload::CheckCounter& checks) {
  for (size_t i = 0; i < kBlocksPerArray; ++i)
    workload::free_stamped(array[backwards ? kBlocksPerArray - 1 - i : i], checks, "exchange stamp");
  std::free(array);
}

void run(unsigned self, uint64_t rounds, std::vector<Inbox>& inboxes, std::atomic<uint64_t>& freed,
         workload::CheckCounter& checks) {
  const unsigned threads = unsigned(inboxes.size());
  uint64_t serial = 0;
  size_t bytes = 1 + self;
  for (uint64_t round = 0; round < rounds; ++round) {
    auto* array = static_cast<Block*>(std::malloc(kBlocksPerArray * sizeof(Block)));
    for (size_t i = 0; i < kBlocksPerArray; ++i) {
      array[i] = workload::allocate_stamped(bytes, workload::block_tag(self, ++serial));
      bytes = bytes + kSizeStepBytes > kMaxBytes ? bytes + kSizeStepBytes - kMaxBytes : bytes + kSizeStepBytes;
    }
    push(inboxes[(self + 1) % threads], array);
    free_array(pop(inboxes[self]), round % 2 == 1, checks);
    freed.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"exchange", 2});
  const unsigned threads = options.threads;
  const uint64_t rounds = options.scaled(kRoundsPerThread, 10);

  workload::CheckCounter checks;
  std::vector<Inbox> inboxes(threads);
  std::atomic<uint64_t> freed{0};
  const workload::Stopwatch stopwatch;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back(run, t, rounds, std::ref(inboxes), std::ref(freed), std::ref(checks));
  for (std::thread& worker : workers) worker.join();
  const double seconds = stopwatch.seconds();
  // A thread alone in the ring hands its arrays to itself; otherwise every array was freed by
  // the thread after its maker, and none is left.
  for (Inbox& inbox : inboxes) checks.expect(inbox.arrays.empty(), "exchange: every array handed on was freed");
  checks.expect(freed.load() == rounds * threads, "exchange: every round freed an array");

  return workload::report("exchange", threads, rounds * threads * kBlocksPerArray, seconds, checks);
}
