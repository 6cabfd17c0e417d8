// Tunables of heap profiles and guarded sampling.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "options/options.hpp"

namespace tray {

// Heap profiling (prof=1, see prof.hpp). A sampled allocation keeps this many frames of its
// stack (the innermost: enough to name the site and its callers a few levels up)...
inline constexpr int kProfMaxFrames = 24;
// ...in a table of distinct stacks that never shrinks (a sample whose stack finds no room is
// dropped and counted)...
inline constexpr size_t kProfStackSlots = 16384;
// ...and is remembered until its free in a table of at most this many slots (a power of two),
// kept at most three quarters full: 49152 live samples, some 24 GiB of live heap at the default
// rate. The table starts at the smaller size and doubles as it fills: its slots are picked by
// hash, so a table mapped at its full 2 MiB is faulted in page by page by the first few hundred
// samples (about 300 of larson's 1,400 page faults).
inline constexpr size_t kProfLiveSlots = 65536;
inline constexpr size_t kProfLiveFirstSlots = 1024;
// prof_peak=1 copies the live counts of every stack when the estimated live bytes pass the
// last copy's by this share: the peak profile is within that share of the true peak, and a
// heap growing from nothing to N bytes costs O(log N) copies.
inline constexpr size_t kProfPeakStepPercent = 2;

// Guarded sampling (guard.cpp): a sampled block of at most this many bytes gets a slot of its
// own (rounded up to whole OS pages) between two inaccessible pages; larger ones are not guarded.
inline constexpr size_t kGuardMaxBlockBytes = size_t{16} << 10;
// Slots at most (guard_slots is clamped to it): the slot table is a static array, and each slot
// takes kGuardMaxBlockBytes + a page of address space (resident only while a block is live).
inline constexpr size_t kGuardMaxSlots = size_t(kGuardSlotsMax);  // options.hpp keeps the option in range
// Return addresses kept of each guarded block's allocation and of its free.
inline constexpr unsigned kGuardStackFrames = 16;

}  // namespace tray
