// Debug mode (debug=1): the same heaps and pages, reached only through these checked paths.
//
// Every block gets at least one canary byte past what was asked for (it comes from the class
// of size + 1). Each page of a debug heap has a table with one word per block saying whether
// the block was never handed out, is live (and how many bytes were asked for), or is free, so
// double frees and frees of the wrong address are found exactly, not by guessing from the
// contents. Freed blocks are filled with TRAY_FREED_PATTERN and wait in a quarantine; the fill
// is checked when they leave it and again when they are handed out. Pages never change class
// in debug mode, so a stale pointer always lands in a block of the size it was given.
#pragma once

#include <cstddef>

#include "debug/config.hpp"
#include "segment/segment.hpp"

namespace tray {

// Blocks a heap's thread freed, oldest first, in a ring (Heap::quarantine).
struct Quarantine {
  size_t oldest = 0;
  size_t count = 0;
  size_t bytes = 0;
  Block* blocks[kDebugQuarantineBlocks];
};

void* debug_alloc(size_t size, size_t alignment, bool zero) noexcept;
void debug_free(void* p) noexcept;
void* debug_realloc(void* p, size_t size) noexcept;
// A program heap's reset or destroy (heap/program.hpp, RetireBlock): a live block is marked
// freed and filled with the freed pattern, so that a use after the reset reads it and a free
// is a double free; false for a block that was not live.
bool debug_retire_block(Page* page, Block* block) noexcept;
// The size that was asked for (writing past it is an overflow); 0 if p is not a live block.
size_t debug_usable_size(const void* p) noexcept;
// Makes backtraces ready for the reports: at load time, and when debug mode is set from code.
void debug_prepare() noexcept;

}  // namespace tray
