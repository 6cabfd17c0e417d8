// The samplers: what an allocation that the heaps' sampling countdowns chose
// (heap/sample_countdown.hpp) becomes. Heap profiles (prof.hpp) record it with its stack;
// guarded sampling (guard.hpp) places it between inaccessible OS pages.
#pragma once

#include <cstddef>

#include "sample/guard.hpp"
#include "sample/prof.hpp"

namespace tray {

// A block of `size` bytes aligned to `alignment` (zeroed if `zero`) from the samplers in
// `fired` (Sampler bits), or nullptr when none of them takes this allocation: the caller then
// allocates as usual. A guarded slot goes first (as big as asked, so an overflow faults at the
// first byte past it); the profile records the allocation only when no slot takes it, as
// `sampled_bytes`. The handler of g_events.sampled_alloc.
void* sample_alloc(unsigned fired, size_t size, size_t sampled_bytes, size_t alignment, bool zero);
// A program heap is reset or destroyed: its sampled blocks that are not its own (guarded
// slots, small blocks of the profile's heap) are freed with the rest.
void sample_release_owned(const ProgramHeap* owner);

}  // namespace tray
