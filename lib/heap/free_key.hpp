// Double-free detection in release builds, at the cost of four instructions per pair.
//
// Every block on a free list, in a remote-free batch or on its way to its owner carries its
// page's descriptor address in its second word (every class holds at least two words); every
// block handed out has that word cleared. A free that finds the address there frees a block
// that is already free, and stops the program before anything is linked twice. A live block
// holds that value only if the program copied it out of freed memory, itself a bug: the
// descriptor lies in its segment's header unit, where no block is, so no pointer a correct
// program holds equals it. The address is already in a register on the free path, where a
// random process-wide key cost a load more. Nothing is walked to confirm it: from another
// thread the owner's lists cannot be walked safely, and the mark alone is as sure as glibc's
// walk of one thread's cache. debug=1 keeps its exact per-block states;
// TRAY_DOUBLE_FREE_CHECK=OFF (CMake) takes this out for the last instructions.
#pragma once

#include <cstdint>

#include "core/core.hpp"
#include "heap/types.hpp"
#include "segment/segment.hpp"

#ifndef TRAY_FREE_KEY_CHECK
#define TRAY_FREE_KEY_CHECK 1
#endif

namespace tray {

// A block of an OS page the sparse pass gave back (sparse.cpp) found written or on a free
// list: freed again after its key went with the page, or written after its free.
[[noreturn]] TRAY_COLD void report_sparse_block_reused(const void* block, const Page* page);

#if TRAY_FREE_KEY_CHECK
[[noreturn]] TRAY_COLD void report_release_double_free(const void* block, const Page* page);

TRAY_INLINE uint64_t* free_key_word(Block* block) {
  return reinterpret_cast<uint64_t*>(block) + 1;
}

// On every free, before the block is linked anywhere. `page` is the block's own page, never
// another unit's descriptor: the fast path and heap_free_remote must mark a block alike.
TRAY_INLINE void free_key_check_and_set(const Page* page, Block* block) {
  const uint64_t key = reinterpret_cast<uintptr_t>(page);
  if (TRAY_UNLIKELY(*free_key_word(block) == key)) report_release_double_free(block, page);
  *free_key_word(block) = key;
}

// On every allocation: a block given out must not look free when it comes back.
TRAY_INLINE void free_key_clear(Block* block) { *free_key_word(block) = 0; }

[[noreturn]] TRAY_COLD void report_release_realloc_of_freed(const void* block, const Page* page);

// realloc of a block that carries the mark reallocates a freed block: resized in place it
// would come back as live while it sits on a free list, and the next malloc hand it out twice.
TRAY_INLINE void free_key_check_live(const Page* page, Block* block) {
  if (TRAY_UNLIKELY(*free_key_word(block) == reinterpret_cast<uintptr_t>(page)))
    report_release_realloc_of_freed(block, page);
}
#else
TRAY_INLINE void free_key_check_and_set(const Page*, Block*) {}
TRAY_INLINE void free_key_clear(Block*) {}
TRAY_INLINE void free_key_check_live(const Page*, Block*) {}
#endif

}  // namespace tray
