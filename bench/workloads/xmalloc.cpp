// xmalloc: producer threads allocate, consumer threads free; no block is ever freed by the
// thread that allocated it.
//
// Models xmalloc-test (Lever and Boreham, "malloc() performance in a multithreaded Linux
// environment", USENIX 2000; also in mimalloc-bench). Half the threads allocate blocks of
// 8..512 B, stamp them and pass them on in handoffs of 256 through a bounded queue; the other
// half verify and free them. A per-thread allocator must send every block home (or adopt it)
// without letting the producers' heaps run dry or the consumers' heaps swell.
//
// Check: each block's stamp is verified by the consumer before free.
// Ops: one block (its malloc and its free). Default: 4 threads (2 producers, 2 consumers),
// 2M blocks per producer.
#include <array>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kMinBytes = 8;
constexpr size_t kMaxBytes = 512;
constexpr size_t kHandoffBlocks = 256;
constexpr size_t kQueueHandoffs = 32;

using Block = workload::StampedBlock;

struct Handoff {
  std::array<Block, kHandoffBlocks> blocks;
  size_t count = 0;
};

// A bounded queue: producers wait when consumers fall behind, so live memory stays bounded
// and the run measures allocation, not a growing backlog.
class HandoffQueue {
 public:
  explicit HandoffQueue(unsigned producers) : ring_(kQueueHandoffs), producers_left_(producers) {}

  void push(const Handoff& handoff) {
    std::unique_lock<std::mutex> hold(lock_);
    not_full_.wait(hold, [&] { return queued_ < ring_.size(); });
    ring_[(head_ + queued_) % ring_.size()] = handoff;
    ++queued_;
    not_empty_.notify_one();
  }

  // False once every producer is done and the queue is drained.
  bool pop(Handoff& handoff) {
    std::unique_lock<std::mutex> hold(lock_);
    not_empty_.wait(hold, [&] { return queued_ > 0 || producers_left_ == 0; });
    if (queued_ == 0) return false;
    handoff = ring_[head_];
    head_ = (head_ + 1) % ring_.size();
    --queued_;
    not_full_.notify_one();
    return true;
  }

  void producer_done() {
    std::lock_guard<std::mutex> hold(lock_);
    --producers_left_;
    not_empty_.notify_all();
  }

 private:
  std::mutex lock_;
  std::condition_variable not_full_;
  std::condition_variable not_empty_;
  std::vector<Handoff> ring_;
  size_t head_ = 0;
  size_t queued_ = 0;
  unsigned producers_left_;
};

void produce(HandoffQueue& queue, unsigned producer, uint64_t blocks) {
  workload::Rng rng(2000 + producer);
  Handoff handoff;
  for (uint64_t serial = 1; serial <= blocks; ++serial) {
    Block& block = handoff.blocks[handoff.count++];
    block.bytes = rng.between(kMinBytes, kMaxBytes);
    block.ptr = std::malloc(block.bytes);
    block.tag = workload::block_tag(producer, serial);
    workload::stamp(block.ptr, block.bytes, block.tag);
    if (handoff.count == kHandoffBlocks || serial == blocks) {
      queue.push(handoff);
      handoff.count = 0;
    }
  }
  queue.producer_done();
}

void consume(HandoffQueue& queue, workload::CheckCounter& checks, uint64_t& freed) {
  Handoff handoff;
  while (queue.pop(handoff)) {
    for (size_t i = 0; i < handoff.count; ++i) {
      const Block& block = handoff.blocks[i];
      checks.expect(workload::stamp_intact(block.ptr, block.bytes, block.tag), "xmalloc stamp");
      std::free(block.ptr);
    }
    freed += handoff.count;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"xmalloc", 4});
  const unsigned threads = std::max(2u, options.threads);
  const unsigned producers = (threads + 1) / 2;
  const unsigned consumers = threads - producers;
  const uint64_t blocks_per_producer = options.scaled(2'000'000, 1000);

  workload::CheckCounter checks;
  HandoffQueue queue(producers);
  std::vector<uint64_t> freed(consumers, 0);
  const workload::Stopwatch stopwatch;
  std::vector<std::thread> workers;
  for (unsigned p = 0; p < producers; ++p)
    workers.emplace_back(produce, std::ref(queue), p, blocks_per_producer);
  for (unsigned c = 0; c < consumers; ++c)
    workers.emplace_back(consume, std::ref(queue), std::ref(checks), std::ref(freed[c]));
  for (std::thread& worker : workers) worker.join();
  const double seconds = stopwatch.seconds();

  uint64_t total_freed = 0;
  for (uint64_t count : freed) total_freed += count;
  const uint64_t produced = uint64_t{producers} * blocks_per_producer;
  checks.expect(total_freed == produced, "xmalloc: every produced block was consumed");
  return workload::report("xmalloc", threads, produced, seconds, checks);
}
