// large_threads: threads that each keep 500 blocks of 256..512 KiB live and replace a random one
// per step, handing one old block in eight to the next thread, which frees it soon after.
//
// Servers whose worker threads each hold I/O buffers, decoded images or per-request arenas of
// hundreds of KiB, and pass some of them on (a response buffer freed by the thread that sends
// it). large_slots with threads: an allocator that keeps blocks of this size behind one lock
// makes its threads take turns, and one that gives each thread memory of its own holds
// whatever each one freed apart from the others. Only each block's first word is written, so
// that page faults stay out of it, as in large_slots.
//
// Check: each block's first word holds its tag, verified before it is freed (by its thread or
// the one it was handed to); every block handed on is freed.
// Ops: one step (a free and a malloc). Default: 2 threads, 100k steps each.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kSlots = 500;
constexpr size_t kMinBytes = size_t{256} << 10;
constexpr size_t kMaxBytes = size_t{512} << 10;
constexpr uint64_t kStepsPerThread = 100'000;
constexpr unsigned kHandOnEvery = 8;

struct Block {
  uint64_t* p;
  uint64_t tag;
};

// Blocks handed to a thread, which frees them every kHandOnEvery steps.
struct Inbox {
  std::mutex lock;
  std::vector<Block> blocks;
};

void release(const Block& block, workload::CheckCounter& checks) {
  checks.expect(*block.p == block.tag, "large_threads tag");
  std::free(block.p);
}

void run(unsigned self, unsigned threads, uint64_t steps, std::vector<Inbox>& inboxes,
         std::atomic<uint64_t>& handed, std::atomic<uint64_t>& freed, workload::CheckCounter& checks) {
  workload::Rng rng(2000 + self);
  uint64_t serial = 0;
  const auto allocate = [&] {
    auto* p = static_cast<uint64_t*>(std::malloc(rng.between(kMinBytes, kMaxBytes)));
    const Block block{p, workload::block_tag(self, ++serial)};
    *p = block.tag;
    return block;
  };
  std::vector<Block> slots(kSlots);
  for (Block& block : slots) block = allocate();
  std::vector<Block> mine;
  for (uint64_t step = 0; step < steps; ++step) {
    Block& slot = slots[rng.below(kSlots)];
    if (step % kHandOnEvery == 0) {
      Inbox& next = inboxes[(self + 1) % threads];
      const std::lock_guard<std::mutex> guard(next.lock);
      next.blocks.push_back(slot);
      handed.fetch_add(1, std::memory_order_relaxed);
    } else {
      release(slot, checks);
    }
    slot = allocate();
    if (step % kHandOnEvery != kHandOnEvery / 2) continue;
    {
      const std::lock_guard<std::mutex> guard(inboxes[self].lock);
      mine.swap(inboxes[self].blocks);
    }
    for (const Block& block : mine) release(block, checks);
    freed.fetch_add(mine.size(), std::memory_order_relaxed);
    mine.clear();
  }
  for (const Block& block : slots) release(block, checks);
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"large_threads", 2});
  const unsigned threads = options.threads;
  const uint64_t steps = options.scaled(kStepsPerThread, kSlots);

  workload::CheckCounter checks;
  std::vector<Inbox> inboxes(threads);
  std::atomic<uint64_t> handed{0};
  std::atomic<uint64_t> freed{0};
  const workload::Stopwatch stopwatch;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back(run, t, threads, steps, std::ref(inboxes), std::ref(handed), std::ref(freed),
                         std::ref(checks));
  for (std::thread& worker : workers) worker.join();
  const double seconds = stopwatch.seconds();
  for (Inbox& inbox : inboxes) {
    for (const Block& block : inbox.blocks) release(block, checks);
    freed.fetch_add(inbox.blocks.size(), std::memory_order_relaxed);
  }
  checks.expect(freed.load() == handed.load(), "large_threads: every block handed on was freed");

  return workload::report("large_threads", threads, steps * threads, seconds, checks);
}
