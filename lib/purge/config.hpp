// Tunables of the purger thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

// The idle purger (purger.cpp) sleeps until the next delay runs out, plus this much: the clock
// it reads is coarse (a few ms), and waking early finds nothing due and sleeps again.
inline constexpr uint64_t kPurgerLateMs = 10;
// While no thread of the program holds a heap, it ends once it has found nothing to do for
// this long (a process lives as long as any of its threads), and starts again when there is
// something to give back: a program whose threads have all ended exits this much later.
inline constexpr uint64_t kPurgerIdleExitMs = 1000;
// A call that needs the process to have one thread (unshare, setns) waits at most this long
// for the purger to end (a pass under way finishes first) before it goes ahead anyway.
inline constexpr uint64_t kPurgerStopWaitMs = 1000;

}  // namespace tray
