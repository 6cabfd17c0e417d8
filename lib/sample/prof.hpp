// Heap profiling (prof=1): the allocations that the sampler picks (heap/sample_countdown.hpp: one per
// prof_sample bytes on average, every byte equally likely) are placed and remembered here,
// with their stacks, until they are freed; prof_write.cpp turns what is live into heap
// profiles (gperftools' text format) and leak reports.
//
// Found again at free at no cost to other frees: a sampled small block comes from a heap that
// no thread owns, so its free always misses the free fast path (page->heap == tls_heap) and
// reaches heap_free_remote, which finds OwnerKind::kLocked on the page; a sampled large block
// carries LargeHeader::prof_sampled, which free_slow tests. Everything here runs on slow paths,
// under one lock, but for the free of a small sampled block (a lock-free push); dumps read the
// counts without it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "sample/config.hpp"
#include "segment/segment.hpp"

namespace tray {

struct ProgramHeap;

// sample_alloc's answer when the profile's sampler fired: a block of `size` bytes placed and
// recorded here as `sampled_bytes` (the bytes the sampler counted for it: a small block's
// class size, so that the profile's estimates, which weigh each sample by the chance of
// those bytes being picked, are unbiased; jemalloc's profiles count size classes too), or
// nullptr (the caller then allocates as usual) when the stack cannot be taken yet (before the
// library's constructor prepared the unwinder) or the tables are full.
void* prof_alloc(size_t size, size_t sampled_bytes, size_t alignment, bool zero);
// fork() (api/process.cpp): the profile's lock.
void prof_lock_for_fork();
void prof_unlock_after_fork();
// The free of a block of the profile's heap's pages, which then belongs to the profile: it leaves
// the table, and goes back to that heap, at the next sample or dump (without a lock here).
void prof_free(Block* block);
// The block (if recorded) leaves the table at once.
void prof_forget(const void* block);
// Dumps: the freed blocks leave the table, if the lock can be had without waiting (a signal
// handler's dump may have interrupted its holder) or `wait`.
void prof_take_in_freed(bool wait);
// Frees every small sampled block allocated into `owner` (tray_heap_reset and _destroy).
void prof_release_owned(const ProgramHeap* owner);
// The program heap a sampled small block was allocated into, or nullptr.
const ProgramHeap* prof_owner_of(const void* block);
// The free of a large block with prof_sampled set.
void prof_forget_large(LargeHeader* header);
// realloc resized a large block where it lies or moved its pages (large_resize; `header` is
// its header now, `old_block` where it was): a new allocation of header->requested bytes, in
// the profile if the sampler picked it (`sampled`), and the old one is gone from it. Without
// copying the block, as the kernel moves it: every large block above a few prof_sample means
// is sampled, and copying each at every realloc would make growing buffers quadratic.
void prof_large_resized(const void* old_block, LargeHeader* header, bool sampled);
// tray_option_set changed an option: prepares the unwinder and the prof_signal handler.
void prof_options_changed();

// Estimated counts are fixed-point numbers with this unit.
inline constexpr uint64_t kProfWeightOne = 256;

// One distinct stack and what was sampled there. Written under the profile's lock; read by
// dumps without it (a dump may run in a signal handler that interrupted the lock's holder),
// so the counts are relaxed atomics and a dump taken while others allocate is a little stale.
struct ProfStack {
  uint64_t hash;
  int depth;
  void* frames[kProfMaxFrames];  // return addresses, innermost first
  std::atomic<uint64_t> live_count;     // sampled allocations not freed yet
  std::atomic<uint64_t> live_bytes;     // their requested bytes
  std::atomic<uint64_t> live_weight;    // their estimated count of allocations (kProfWeightOne)
  std::atomic<uint64_t> live_estimate;  // their estimated bytes
  std::atomic<uint64_t> total_count;    // every sampled allocation, freed or not
  std::atomic<uint64_t> total_bytes;
  std::atomic<uint64_t> peak_count;     // live_count and live_bytes at the last peak copy
  std::atomic<uint64_t> peak_bytes;
};

// The stacks recorded so far, [0, prof_stack_count()); stacks are never removed.
size_t prof_stack_count();
const ProfStack* prof_stacks();
// Samples left out for want of room in the tables.
uint64_t prof_dropped();
// Estimated live bytes at the last peak copy (prof_peak=1).
uint64_t prof_peak_estimate();
// The mean sampling interval (prof_sample) that weights are computed with.
uint64_t prof_rate();

}  // namespace tray
