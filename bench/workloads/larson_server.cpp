// larson_server: the Larson server benchmark as mimalloc-bench runs it ("larson 5 8 1000 5000
// 100 4141 N"): worker threads that each own a slot array, live for a fixed number of steps,
// then exit and hand their array to a brand new thread.
//
// Models a server whose worker threads come and go while the data they allocated lives on
// (Larson & Krishnan, "Memory allocation for long-running server applications", ISMM 1998).
// The main thread fills one array of 5000 slots per lineage with blocks of 8..1000 B. Each
// lineage then runs one thread at a time: the thread replaces a random slot with a block of
// random size 100 x 5000 times (a free and a malloc per step), starts its successor and exits;
// the successor inherits the array, so every block it frees was allocated by a thread that is
// gone (or by the main thread, for the first one). The lineages run side by side, and each
// successor starts the moment its predecessor is done, not in lock-step waves. An allocator pays
// here for setting up a heap per thread, for taking frees of blocks whose owner has exited
// (abandoned pages), and for not letting the memory of dead threads pile up.
//
// Unlike `larson`, which keeps its threads and passes the arrays around, this one is the thread
// hand-off of the original benchmark; unlike the original it runs a fixed number of steps instead
// of a fixed time.
//
// Check: every block is stamped when allocated and verified before it is freed.
// Ops: one step (a free and a malloc). Default: 2 lineages (--threads), 16M steps in all, in
// thread lives of 500k steps (so 32 threads in all, 16 per lineage at 2 lineages).
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kSlotsPerThread = 5000;
constexpr size_t kMinBytes = 8;
constexpr size_t kMaxBytes = 1000;
constexpr uint64_t kStepsPerLife = 100 * kSlotsPerThread;
constexpr uint64_t kTotalSteps = 16'000'000;

using Slot = workload::StampedBlock;

// One chain of threads sharing a slot array, one thread alive at a time.
struct Lineage {
  unsigned index = 0;
  std::vector<Slot> slots;
  uint64_t steps_left = 0;
  uint64_t lives = 0;
};

// Threads start their successors themselves; the main thread joins every thread, taking the
// handles from `to_join` as they come, until every lineage has run out of steps.
struct Shared {
  std::vector<Lineage> lineages;
  workload::CheckCounter checks;
  std::mutex lock;
  std::condition_variable changed;
  std::vector<std::thread> to_join;
  unsigned lineages_done = 0;
};

void fill_slot(Slot& slot, workload::Rng& rng, uint64_t tag) {
  slot = workload::allocate_stamped(rng.between(kMinBytes, kMaxBytes), tag);
}

void release_slot(Slot& slot, workload::CheckCounter& checks) {
  workload::free_stamped(slot, checks, "larson_server block stamp");
}

// One thread's life: its steps, then the start of its successor (if the lineage has steps left).
void live(Shared& shared, Lineage& lineage) {
  const uint64_t life = ++lineage.lives;
  // The thread id in the tags tells blocks of different lives apart.
  const uint64_t thread_id = uint64_t{lineage.index} << 20 | life;
  workload::Rng rng(4141 + thread_id);
  const uint64_t steps = std::min(kStepsPerLife, lineage.steps_left);
  std::vector<Slot>& slots = lineage.slots;
  for (uint64_t step = 1; step <= steps; ++step) {
    Slot& slot = slots[rng.below(slots.size())];
    release_slot(slot, shared.checks);
    fill_slot(slot, rng, workload::block_tag(thread_id, step));
  }
  lineage.steps_left -= steps;
  std::thread successor;
  if (lineage.steps_left > 0) successor = std::thread(live, std::ref(shared), std::ref(lineage));
  const std::lock_guard<std::mutex> hold(shared.lock);
  if (successor.joinable()) {
    shared.to_join.push_back(std::move(successor));
  } else {
    ++shared.lineages_done;
  }
  shared.changed.notify_one();
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"larson_server", 2});
  const unsigned threads = options.threads;
  // At least two lives per lineage, so even a tiny run hands an array to a new thread.
  const uint64_t steps_per_lineage =
      std::max(2 * kStepsPerLife, options.scaled(kTotalSteps) / threads);

  Shared shared;
  shared.lineages.resize(threads);
  workload::Rng main_rng(4141);
  const workload::Stopwatch stopwatch;
  for (unsigned t = 0; t < threads; ++t) {
    Lineage& lineage = shared.lineages[t];
    lineage.index = t;
    lineage.steps_left = steps_per_lineage;
    lineage.slots.resize(kSlotsPerThread);
    uint64_t serial = 0;
    for (Slot& slot : lineage.slots) fill_slot(slot, main_rng, workload::block_tag(t, ++serial));
  }
  {
    const std::lock_guard<std::mutex> hold(shared.lock);
    for (Lineage& lineage : shared.lineages)
      shared.to_join.emplace_back(live, std::ref(shared), std::ref(lineage));
  }
  // A thread queues its successor before it exits, and the main thread joins every queued
  // thread: a queue found empty after those joins means no thread is left to join.
  uint64_t thread_count = 0;
  std::unique_lock<std::mutex> hold(shared.lock);
  for (;;) {
    shared.changed.wait(hold, [&] {
      return !shared.to_join.empty() || shared.lineages_done == threads;
    });
    if (shared.to_join.empty()) break;
    std::vector<std::thread> batch = std::move(shared.to_join);
    shared.to_join.clear();
    hold.unlock();
    for (std::thread& thread : batch) thread.join();
    thread_count += batch.size();
    hold.lock();
  }
  hold.unlock();
  for (Lineage& lineage : shared.lineages)
    for (Slot& slot : lineage.slots) release_slot(slot, shared.checks);
  const double seconds = stopwatch.seconds();

  const uint64_t ops = steps_per_lineage * threads;
  return workload::report("larson_server", threads, ops, seconds, shared.checks,
                          " thread_lives=" + std::to_string(thread_count));
}
