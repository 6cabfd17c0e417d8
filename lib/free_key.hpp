// Double-free detection in release builds, at the cost of a few instructions per pair.
//
// Every block on a free list, in a remote-free batch or on its way to its owner carries the
// process's free key in its second word (every class holds at least two words); every block
// handed out has that word cleared. A free that finds the key there frees a block that is
// already free, and stops the program before anything is linked twice. The key is 64 random
// bits drawn at start-up, so a live block holds it only if the program copied it out of freed
// memory, itself a bug. Nothing is walked to confirm it: from another thread the owner's
// lists cannot be walked safely, and the key alone is as sure as glibc's walk of one thread's
// cache. debug=1 keeps its exact per-block states; TRAY_DOUBLE_FREE_CHECK=OFF (CMake) takes
// this out for the last instruction.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/bits.hpp"
#include "types.hpp"

#ifndef TRAY_FREE_KEY_CHECK
#define TRAY_FREE_KEY_CHECK 1
#endif

namespace tray {

#if TRAY_FREE_KEY_CHECK
// A fixed, odd-looking value until free_key_randomize() runs at the first thread's start.
extern constinit TRAY_HIDDEN std::atomic<uint64_t> g_free_key;

void free_key_randomize();
[[noreturn]] TRAY_COLD void report_release_double_free(const void* block, const Page* page);

TRAY_INLINE uint64_t* free_key_word(Block* block) {
  return reinterpret_cast<uint64_t*>(block) + 1;
}

// On every free, before the block is linked anywhere.
TRAY_INLINE void free_key_check_and_set(const Page* page, Block* block) {
  const uint64_t key = g_free_key.load(std::memory_order_relaxed);
  if (TRAY_UNLIKELY(*free_key_word(block) == key)) report_release_double_free(block, page);
  *free_key_word(block) = key;
}

// On every allocation: a block given out must not look free when it comes back.
TRAY_INLINE void free_key_clear(Block* block) { *free_key_word(block) = 0; }
#else
inline void free_key_randomize() {}
TRAY_INLINE void free_key_check_and_set(const Page*, Block*) {}
TRAY_INLINE void free_key_clear(Block*) {}
#endif

}  // namespace tray
