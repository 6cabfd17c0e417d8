// Sampled allocations: heap profiling (prof=1) and guarded allocations (guard_sample=BYTES)
// each want about one allocation per so many bytes allocated, chosen at random so that every
// byte has the same chance and estimates scaled by the mean are unbiased. Each heap counts
// bytes down in one countdown per size class (and one for large and over-aligned requests,
// on their own slow path), shared by both samplers: the fast path subtracts each request's
// size from its class's (a subtract and a branch), and the allocation that takes it below
// zero goes to the slow path, which asks sample_take which samplers' intervals ended there.
// Intervals are exponential with the sampler's mean, drawn per thread and stream. A Poisson
// process split by class is a Poisson process in each class with the same rate, so every
// byte still has the same chance. The per-class countdowns are also the per-class requested
// bytes of the statistics, which then cost the fast path no add of their own.
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

// Options changed (tray_option_set): every heap re-arms on its next slow path.
void sample_options_changed();
// Re-arms the heap if the sampling options changed since it was armed.
void sample_refresh(Heap* heap);

// The heap's countdown of `stream` has run out (it already counts the allocation at hand):
// the set of samplers whose interval ended, with their next intervals drawn and the
// countdown re-armed.
unsigned sample_take(Heap* heap, unsigned stream);

// Bytes the heap's allocations of the class asked for (what its countdown counted down). For
// dumps from any thread: read while the owner re-arms, it can be off by about an interval.
uint64_t sample_requested_bytes(const Heap* heap, unsigned size_class);

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
  return fired != 0 ? g_events.sampled_alloc(fired, size, alignment, zero) : nullptr;
}

// sample_small_slow's common case, in a few instructions and no call: no sampler re-armed
// since the heap was, the request not counted yet (the class had no block ready), and not the
// one to sample. Counts it and returns true; false, with nothing changed, for the rest.
TRAY_INLINE bool sample_small_quiet(Heap* heap, unsigned size_class, size_t size) {
  int64_t& countdown = heap->sample_countdown[size_class];
  if (heap->sampling.generation != g_sample_generation.load(std::memory_order_relaxed) ||
      countdown < int64_t(size))
    return false;
  countdown -= int64_t(size);
  return true;
}

// The small-allocation slow path, before it allocates: either the fast path found the
// countdown run out (it is below zero, and counts this request already) or the class had no
// block ready (the request is not counted yet). A sampled block, or nullptr.
TRAY_INLINE void* sample_small_slow(Heap* heap, unsigned size_class, size_t size) {
  int64_t& countdown = heap->sample_countdown[size_class];
  const bool counted = countdown < 0;
  if (TRAY_UNLIKELY(heap->sampling.generation !=
                    g_sample_generation.load(std::memory_order_relaxed))) {
    sample_refresh(heap);
    // Re-arming kept what the countdown had counted, this request included: counting it
    // again would add it twice to the requested bytes.
    if (counted) return nullptr;
  }
  if (TRAY_LIKELY(!counted) && TRAY_LIKELY(countdown_sub(countdown, int64_t(size)) >= 0))
    return nullptr;
  return sample_after_countdown(heap, size_class, size, sample_class_alignment(size_class), false);
}

// A request served away from the small-block pools (large or over-aligned blocks).
TRAY_INLINE void* sample_large(Heap* heap, size_t size, size_t alignment, bool zero) {
  if (TRAY_LIKELY(countdown_sub(heap->sample_countdown[kSampleStreamLarge], int64_t(size)) >= 0))
    return nullptr;
  return sample_after_countdown(heap, kSampleStreamLarge, size, alignment, zero);
}

// A large block that realloc resized without a new block: an allocation of `size` bytes to the
// samplers that can take a block already placed (the profile's; guarded slots hold small
// blocks only). True if the profile's sampler picked it.
TRAY_INLINE bool sample_resized(Heap* heap, size_t size) {
  if (TRAY_LIKELY(countdown_sub(heap->sample_countdown[kSampleStreamLarge], int64_t(size)) >= 0))
    return false;
  return (sample_take(heap, kSampleStreamLarge) & kSamplerProf) != 0;
}

}  // namespace tray
