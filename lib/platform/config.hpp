// Tunables of the platform layer: the unwinder's cache and the mutex's spinning.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

// The cache of frame rules by return address that makes a profile's stacks cheap
// (platform/unwind.cpp): this many one-word slots (a power of two, 128 KiB of zero pages until
// a stack is taken), a return address looked for in this many slots from its hash's.
inline constexpr size_t kUnwindCacheSlots = 16384;
inline constexpr size_t kUnwindCacheProbes = 4;

// Times a thread that finds one of the allocator's locks held checks it again, with a pause
// between checks, before it sleeps (os::Mutex): about as long as a holder takes (a few hundred
// instructions), much less than a futex sleep and wake-up.
inline constexpr int kMutexSpins = 100;

}  // namespace tray
