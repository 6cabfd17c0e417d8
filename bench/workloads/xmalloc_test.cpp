// xmalloc_test: xmalloc-test as mimalloc-bench runs it ("xmalloc-test -w N -t 5 -s 64"):
// allocator threads fill big batches of 64-byte blocks, releaser threads free whole batches.
//
// Models the producer/consumer test of Lever and Boreham ("malloc() performance in a
// multithreaded Linux environment", USENIX 2000) in the form mimalloc-bench uses. Half the
// threads only allocate: each mallocs a batch (a 32 KiB block holding 4096 pointers), fills it
// with 4096 fresh 64-byte blocks, writes each block, and pushes the batch onto one shared stack
// (a mutex, two condition variables, at most 100 batches waiting). The other half only free: each
// pops the most recently pushed batch (last in, first out), frees its 4096 blocks and then the
// batch itself. So every block, and every batch, is freed by a thread other than the one that
// allocated it, in bursts of 4096 blocks of one size class; an allocator has to send them home
// (or adopt them) fast, and the waiting batches keep up to ~26 MiB live.
//
// Unlike `xmalloc` (sizes 8..512 B, handoffs of 256 through a FIFO ring), this is the exact shape
// of the benchmark as run: one size, 4096-block batches that are heap blocks themselves, a LIFO
// stack. Unlike the original, it does a fixed number of batches instead of running for 5 s.
//
// Check: every block is written (filled, then stamped) by its allocator and verified before it is
// freed; every batch produced must be consumed.
// Peak live bytes (peak_live_kb) count a batch and its 4096 blocks from the batch's malloc to its
// free: how far the producers ran ahead is the program's doing, and sets most of its peak RSS
// (an allocator whose producers are fast relative to its consumers holds up to the 100 waiting
// batches, ~26 MiB), so RSS is only comparable against it. It overstates the truth by the
// batches being filled and emptied at that moment, at most one per thread (256 KiB each).
// Ops: one 64-byte block (its malloc and its free). Default: 2 threads (--threads N: N/2
// allocators and N/2 releasers, at least one each; xmalloc-test's -w is N/2), 2000 batches of
// 4096 blocks (8.2M blocks) in all.
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kBlockBytes = 64;
constexpr size_t kBlocksPerBatch = 4096;
constexpr size_t kStackLimit = 100;
constexpr uint64_t kTotalBatches = 2000;

// Allocated by the producer with malloc, freed by the consumer, like the original's batch.
struct Batch {
  Batch* next;
  uint64_t producer;
  uint64_t first_serial;
  void* blocks[kBlocksPerBatch];
};

class BatchStack {
 public:
  explicit BatchStack(unsigned producers) : producers_left_(producers) {}

  void push(Batch* batch) {
    std::unique_lock<std::mutex> hold(lock_);
    not_full_.wait(hold, [&] { return count_ < kStackLimit; });
    batch->next = top_;
    top_ = batch;
    ++count_;
    not_empty_.notify_one();
  }

  // nullptr once every producer is done and the stack is empty.
  Batch* pop() {
    std::unique_lock<std::mutex> hold(lock_);
    not_empty_.wait(hold, [&] { return top_ != nullptr || producers_left_ == 0; });
    Batch* batch = top_;
    if (batch != nullptr) {
      top_ = batch->next;
      --count_;
      not_full_.notify_one();
    }
    return batch;
  }

  void producer_done() {
    const std::lock_guard<std::mutex> hold(lock_);
    --producers_left_;
    not_empty_.notify_all();
  }

 private:
  std::mutex lock_;
  std::condition_variable not_full_;
  std::condition_variable not_empty_;
  Batch* top_ = nullptr;
  size_t count_ = 0;
  unsigned producers_left_;
};

// Batches between their malloc and their free, and the most there ever were.
class InFlight {
 public:
  void add() {
    const uint64_t now = count_.fetch_add(1, std::memory_order_relaxed) + 1;
    uint64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  void remove() { count_.fetch_sub(1, std::memory_order_relaxed); }
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> peak_{0};
};

void allocate_batches(BatchStack& stack, InFlight& in_flight, unsigned producer, uint64_t batches) {
  uint64_t serial = 0;
  for (uint64_t b = 0; b < batches; ++b) {
    auto* batch = static_cast<Batch*>(std::malloc(sizeof(Batch)));
    in_flight.add();
    batch->producer = producer;
    batch->first_serial = serial + 1;
    for (size_t i = 0; i < kBlocksPerBatch; ++i) {
      void* block = std::malloc(kBlockBytes);
      std::memset(block, static_cast<int>(i & 0xFF), kBlockBytes);  // as the original writes it
      workload::stamp(block, kBlockBytes, workload::block_tag(producer, ++serial));
      batch->blocks[i] = block;
    }
    stack.push(batch);
  }
  stack.producer_done();
}

void release_batches(BatchStack& stack, InFlight& in_flight, workload::CheckCounter& checks,
                     uint64_t& released) {
  while (Batch* batch = stack.pop()) {
    for (size_t i = 0; i < kBlocksPerBatch; ++i) {
      const uint64_t tag = workload::block_tag(batch->producer, batch->first_serial + i);
      checks.expect(workload::stamp_intact(batch->blocks[i], kBlockBytes, tag),
                    "xmalloc_test block stamp");
      std::free(batch->blocks[i]);
    }
    std::free(batch);
    in_flight.remove();
    ++released;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"xmalloc_test", 2});
  const unsigned producers = std::max(1u, options.threads / 2);
  const unsigned consumers = std::max(1u, options.threads - producers);
  const unsigned threads = producers + consumers;
  const uint64_t batches_per_producer =
      std::max<uint64_t>(2, options.scaled(kTotalBatches) / producers);

  workload::CheckCounter checks;
  BatchStack stack(producers);
  InFlight in_flight;
  std::vector<uint64_t> released(consumers, 0);
  const workload::Stopwatch stopwatch;
  std::vector<std::thread> workers;
  for (unsigned c = 0; c < consumers; ++c)
    workers.emplace_back(release_batches, std::ref(stack), std::ref(in_flight), std::ref(checks),
                         std::ref(released[c]));
  for (unsigned p = 0; p < producers; ++p)
    workers.emplace_back(allocate_batches, std::ref(stack), std::ref(in_flight), p,
                         batches_per_producer);
  for (std::thread& worker : workers) worker.join();
  const double seconds = stopwatch.seconds();

  uint64_t total_released = 0;
  for (uint64_t count : released) total_released += count;
  const uint64_t produced = uint64_t{producers} * batches_per_producer;
  checks.expect(total_released == produced, "xmalloc_test: every batch was released");
  const uint64_t batch_bytes = sizeof(Batch) + kBlocksPerBatch * kBlockBytes;
  return workload::report("xmalloc_test", threads, produced * kBlocksPerBatch, seconds, checks,
                          " peak_live_kb=" + std::to_string(in_flight.peak() * batch_bytes / 1024));
}
