// Sampled allocations: heap profiling (prof=1) and guarded allocations (guard_sample=BYTES)
// each want about one allocation per so many bytes allocated, chosen at random so that
// estimates scaled by the mean are unbiased. Each heap counts bytes down in one countdown per
// size class (and one for large and over-aligned requests, on their own slow path), shared by
// both samplers. A class's countdown is charged a block's bytes for each block its slot takes
// in, on the slow path (heap.cpp, slot_install): where it runs out within them, the slot's list
// is cut before that block, and the allocation that finds the slot dry there is the sampled
// one. So the fast path carries no countdown, and a small block is sampled by its block's
// bytes rather than the bytes asked for (as jemalloc samples by its size classes): every block
// byte has the same chance. Intervals are exponential with the sampler's mean, drawn per
// thread and stream. A Poisson process split by class is a Poisson process in each class
// with the same rate.
//
// A thread picks up changed sampling options on its next slow path. What a sampled
// allocation becomes is the samplers' business (sample/), reached through
// g_events.sampled_alloc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "events/events.hpp"
#include "heap/types.hpp"
#include "segment/segment.hpp"

namespace tray {

// The countdown of `stream`: a class's, or kSampleStreamLarge's.
TRAY_INLINE int64_t& countdown_of(Heap* heap, unsigned stream) {
  return stream < kSizeClassCount ? heap->books[stream].countdown : heap->large_countdown;
}

// Options changed (tray_option_set): every heap re-arms on its next slow path.
void sample_options_changed();
// Re-arms the heap if the sampling options changed since it was armed.
void sample_refresh(Heap* heap);

// The heap's countdown of `stream` has run out (it already counts the allocation at hand):
// the set of samplers whose interval ended, with their next intervals drawn and the
// countdown re-armed (0 while the thread holds a SamplingPause).
unsigned sample_take(Heap* heap, unsigned stream);

// The alignment a block of class c has by construction (blocks lie at multiples of the class
// size from a unit boundary), which a sampled block standing in for it must match.
size_t sample_class_alignment(unsigned size_class);

extern constinit std::atomic<uint32_t> g_sample_generation;

// What libc allocates through malloc on the allocator's behalf (the purger thread's start-up:
// pthread_create's thread-local storage, live until that thread is long gone) is no program's
// allocation: a profile would report it as a leak at exit, and a guarded slot would be held by
// it. Samplers pass over the allocations of a thread while it holds a SamplingPause.
extern __thread unsigned tls_sampling_paused;
struct SamplingPause {
  SamplingPause() { ++tls_sampling_paused; }
  ~SamplingPause() { --tls_sampling_paused; }
  SamplingPause(const SamplingPause&) = delete;
  SamplingPause& operator=(const SamplingPause&) = delete;
};

TRAY_INLINE void* sample_after_countdown(Heap* heap, unsigned stream, size_t size,
                                         size_t alignment, bool zero) {
  const unsigned fired = sample_take(heap, stream);
  return fired != 0 ? g_events.sampled_alloc(fired, size, size, alignment, zero) : nullptr;
}

// A request served away from the small-block pools (large or over-aligned blocks).
TRAY_INLINE void* sample_large(Heap* heap, size_t size, size_t alignment, bool zero) {
  heap->large_countdown -= int64_t(size);
  if (TRAY_LIKELY(heap->large_countdown >= 0)) return nullptr;
  return sample_after_countdown(heap, kSampleStreamLarge, size, alignment, zero);
}

// A large block that realloc resized without a new block: an allocation of `size` bytes to the
// samplers that can take a block already placed (the profile's; guarded slots hold small
// blocks only). True if the profile's sampler picked it.
TRAY_INLINE bool sample_resized(Heap* heap, size_t size) {
  heap->large_countdown -= int64_t(size);
  if (TRAY_LIKELY(heap->large_countdown >= 0)) return false;
  return (sample_take(heap, kSampleStreamLarge) & kSamplerProf) != 0;
}

}  // namespace tray
