#include "heap/reuse.hpp"

#include <algorithm>

#include "heap/remote.hpp"

namespace tray {

void reuse_start(Heap* self, ReuseRun& run, Page* page, Block* block) noexcept {
  if (self->reuse_bytes >= kReuseHeapBytes) return remote_send(self, page, block);
  run.page = page;
  run.head = list_end();
  run.count = 0;
  run.limit = uint32_t(std::min<size_t>(page->reserved, kReuseRunBytes / page->block_bytes));
  if (run.limit == 0) run.limit = 1;
  reuse_push(self, run, page, block);
  // When the slot runs dry, the refill takes the slow path, which takes the run in.
  SlotBook& book = self->books[page->size_class];
  if (book.sample_rest == nullptr) book.sample_rest = reuse_mark();
}

namespace {

// Keeping others' blocks pays where a thread frees mostly blocks others allocated and then
// allocates about as many itself: a stage of a pipeline, which hands what it allocates on. It
// costs where the thread frees what it allocated: a kept block it allocated again is still
// another heap's, and each of its frees then takes the slow path and keeps it again (larson,
// whose threads free their own blocks a few thousand times for each block of another thread,
// took 1.7 times as long). Counted over spans of kReuseEpochFrees frees of others' blocks: its
// own frees (counted with their pages, a slot's list late at most) against those, and what it
// allocated. While keeping is on, the blocks the thread allocated count as others' when it
// frees them, so its counts say nothing: after kReuseProbeEvery spans on, keeping goes off,
// and only the second of two spans in a row with it off decides, once the blocks it had
// allocated from what it kept are mostly freed (a thread of larson_server whose 5000 slots
// held such blocks took 8,500 steps to free 4,096 of them, and then did not free as many
// others' blocks again in its life).
void reuse_look(Heap* self) {
  const HeapCounters& counters = self->counters;
  uint64_t frees = 0;
  uint64_t allocations = 0;
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    frees += counters.frees[c];
    allocations += counters.allocations[c];
  }
  const uint64_t remote = counters.remote_frees - self->reuse_mark_remote;
  const uint64_t all = frees - self->reuse_mark_frees;
  const uint64_t own = all > remote ? all - remote : 0;
  const uint64_t allocated = allocations - self->reuse_mark_allocations;
  self->reuse_mark_frees = frees;
  self->reuse_mark_remote = counters.remote_frees;
  self->reuse_mark_allocations = allocations;
  self->reuse_next_look = counters.remote_frees + kReuseEpochFrees;
  if (self->reuse_on) {
    if (++self->reuse_epochs < kReuseProbeEvery) return;
    self->reuse_on = false;
    self->reuse_epochs = 0;
    return;
  }
  if (++self->reuse_epochs < 2) return;
  self->reuse_on = remote >= own * 2 && allocated * 2 >= remote;
  self->reuse_epochs = self->reuse_on ? 0 : 1;
}

}  // namespace

void reuse_free(Heap* self, Page* page, Block* block) noexcept {
  const uint64_t remote = self->counters.remote_frees;
  if (remote >= self->reuse_next_look) reuse_look(self);
  self->reuse_left = self->reuse_on ? 1 : uint32_t(self->reuse_next_look - remote);
  reuse_keep_or_send(self, page, block);
}

void reuse_keep_or_send(Heap* self, Page* page, Block* block) noexcept {
  if (reuse_take(self, page, block)) return;
  remote_send(self, page, block);
}

ReuseRun reuse_pick(Heap* self, unsigned c) noexcept {
  ReuseRun* best = nullptr;
  for (ReuseRun& run : self->reuse[c])
    if (run.count != 0 && (best == nullptr || run.count > best->count)) best = &run;
  if (best == nullptr) return ReuseRun{};
  const ReuseRun taken = *best;
  best->count = 0;
  self->reuse_bytes -= size_t(taken.count) * taken.page->block_bytes;
  return taken;
}

uint32_t reuse_send_home(Heap* self, Page* page, Block* block, uint32_t most) noexcept {
  uint32_t sent = 0;
  for (const Block* holder = nullptr; block != list_end(); ++sent) {
    // Checked like any link a slow path follows: a write after the free, or a list longer than
    // it can be, ends the walk here. (Another heap's page: only what its owner never changes
    // while blocks are out is read.)
    if (sent == most || !is_free_block(page, block)) report_corrupted_list(page, block, holder);
    Block* next = link_load(page, block);
    remote_send(self, page, block);
    holder = block;
    block = next;
  }
  return sent;
}

void reuse_spill(Heap* self, ReuseRun& run) noexcept {
  const uint32_t count = run.count;
  run.count = 0;
  self->reuse_bytes -= size_t(count) * run.page->block_bytes;
  reuse_send_home(self, run.page, run.head, count);
}

void reuse_spill_all(Heap* self) noexcept {
  for (unsigned c = 0; c < kSizeClassCount; ++c)
    for (ReuseRun& run : self->reuse[c])
      if (run.count != 0) reuse_spill(self, run);
}

bool reuse_waits(const Heap* self, unsigned c) noexcept {
  for (const ReuseRun& run : self->reuse[c])
    if (run.count != 0) return true;
  return false;
}

}  // namespace tray
