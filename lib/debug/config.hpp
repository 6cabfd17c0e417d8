// Tunables of debug mode.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"

namespace tray {

// Debug mode: a freed block waits in its freeing thread's quarantine (at most this many blocks
// and bytes) before it can be handed out again, so a write through a stale pointer has time to
// land in the fill and be caught, and a double free finds the block still marked free.
inline constexpr size_t kDebugQuarantineBlocks = 4096;
inline constexpr size_t kDebugQuarantineBytes = size_t{4} << 20;
// Debug mode: freed large blocks stay mapped but inaccessible, the newest this many.
inline constexpr size_t kDebugRetiredLargeCount = 256;
// Debug mode: frames of a large block's free kept for the report of a later access to it.
inline constexpr int kDebugFreeStackFrames = 24;
// Debug mode's realloc: to at most this many bytes it always moves the block, so that code that
// keeps the old address reads the freed fill. Past it, a move costs enough that a buffer grown
// a few bytes per call would be copied quadratically (tmux reflowing its history ran 14 times
// slower): the block changes size in place while it has room, and a move leaves room for this
// much more, so a growing buffer moves, and meets the stale pointers to it, at every 1.5x.
inline constexpr size_t kDebugReallocMoveBytes = 4096;
inline constexpr size_t kDebugReallocRoomPercent = 50;

}  // namespace tray
