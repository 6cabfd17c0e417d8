// What release builds check on every small block, so that a program's memory errors stop it
// before they hand an attacker memory of his choosing (TRAY_HARDENING, on by default; CMake
// -DTRAY_HARDENING=OFF takes it all out for the last instructions). Three checks:
//
// Encoded free-list links. A free block's link (its first word) is stored multiplied by an odd
// key of its page (Page::link_key), drawn from a per-process secret, and multiplied back by the
// key's inverse when it is followed. A link overwritten after the free, or by an overflow out of
// the block before, decodes to an address no one chose: a multiplication carries a change in any
// byte into every byte above it, so even a byte or two written over the link's low end leaves
// the decoded address far outside the page. The fast path's test for "list empty" is
// `head >= limit` (the list ends in list_end(), above every page), so a decoded address past the
// page's end falls into the same branch, where the slow path names it (heap.cpp, check_slot).
// A link the program overwrote with zero decodes to zero and the next allocation of the class
// faults on it.
//
// Block starts. A free must name a block's first byte: the offset into the page times
// Page::start_divisor (2^64 / block size, rounded up) is below that divisor, modulo 2^64,
// exactly when the offset is a multiple of the block size (exact while the offset times the
// block size stays below 2^63: a page's offsets stay below 2^22, its blocks at 2^21 bytes at
// most). A pointer into a block is refused before it reaches a list.
//
// The free key. Every block on a free list, in a remote-free batch or on its way to its owner
// carries its page's descriptor address in its second word (every class holds at least two
// words); every block handed out has that word cleared. A free that finds the address there
// frees a block that is already free, and stops the program before anything is linked twice. A
// live block holds that value only if the program copied it out of freed memory, itself a bug:
// the descriptor lies in its segment's header unit, where no block is, so no pointer a correct
// program holds equals it. Nothing is walked to confirm it: from another thread the owner's
// lists cannot be walked safely, and the mark alone is as sure as glibc's walk of one thread's
// cache. debug=1 keeps exact per-block states instead.
#pragma once

#include <cstdint>

#include "core/core.hpp"
#include "heap/types.hpp"
#include "segment/segment.hpp"

#ifndef TRAY_HARDENING
#define TRAY_HARDENING 1
#endif

namespace tray {

inline constexpr bool kHardening = TRAY_HARDENING != 0;

// The end of a page's free list: above every address, so that one unsigned test against the
// page's limit covers "no block left" and "a link that leads out of the page".
TRAY_INLINE Block* list_end() { return reinterpret_cast<Block*>(~uintptr_t{0}); }

// A link to `target` (a block of the same page, list_end(), or for the remote-free chains a
// block of another page or nullptr) as a free block of `page` holds it, and back.
TRAY_INLINE Block* link_encode(const Page* page, Block* target) {
  if constexpr (kHardening)
    return reinterpret_cast<Block*>(reinterpret_cast<uintptr_t>(target) * page->link_key);
  return target;
}
// With the page's inverse key at hand (a class's slot holds a copy, heap/types.hpp).
TRAY_INLINE Block* link_decode_with(uint64_t unkey, Block* stored) {
  if constexpr (kHardening) return reinterpret_cast<Block*>(reinterpret_cast<uintptr_t>(stored) * unkey);
  (void)unkey;
  return stored;
}
TRAY_INLINE Block* link_decode(const Page* page, Block* stored) {
  return link_decode_with(page->link_unkey, stored);
}
TRAY_INLINE void link_store(const Page* page, Block* block, Block* target) {
  block->next = link_encode(page, target);
}
TRAY_INLINE Block* link_load(const Page* page, const Block* block) {
  return link_decode(page, block->next);
}

// Gives a page its link keys, its limit and its divisor (page_acquire).
void page_arm_checks(Page* page);

// Whether a decoded link is a block of the page that is carved (slow paths walking a list
// check every link in full: this one, the block boundary and the range).
TRAY_INLINE bool link_in_page(const Page* page, const Block* link) {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(link) - reinterpret_cast<uintptr_t>(page->blocks);
  return offset < uintptr_t(page->capacity) * page->block_bytes && offset % page->block_bytes == 0;
}

// The free list's head failed the fast path's test and is not the list's end: a link that
// decoded out of the page. `holder` is the block it was read from, when known.
[[noreturn]] TRAY_COLD void report_corrupted_list(const Page* page, const void* link, const void* holder);

// The page of `target`, a block of owner's reached through the link that `holder` holds
// (nullptr: a list head the allocator keeps itself), checked in full where links lead from one
// page to another (remote-free runs, the heap profile's freed blocks): one changed after its
// free decodes to an address that is no free block of owner's, which stops the program before
// anything is written there.
Page* page_of_linked_block(const Heap* owner, Block* target, const Block* holder);

// A block of an OS page the sparse pass gave back (sparse.cpp) found written or on a free
// list: freed again after its key went with the page, or written after its free.
[[noreturn]] TRAY_COLD void report_sparse_block_reused(const void* block, const Page* page);

TRAY_INLINE uint64_t* free_key_word(Block* block) {
  return reinterpret_cast<uint64_t*>(block) + 1;
}

// Whether p is the first byte of a block of page (any offset the unit map leads to is below
// 2^22: the page's units).
TRAY_INLINE bool is_block_start(const Page* page, const void* p) {
  const uint64_t offset = reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(page->blocks);
  return offset * page->start_divisor <= page->start_bound;
}

// Whether `block`, reached through a link, is a free block of `page`: a block's start below
// the page's limit, marked free. Slow paths that follow links across pages (remote.cpp) ask.
TRAY_INLINE bool is_free_block(const Page* page, Block* block) {
  if constexpr (!kHardening) return true;
  return reinterpret_cast<uintptr_t>(block) < page->limit && is_block_start(page, block) &&
         *free_key_word(block) == reinterpret_cast<uintptr_t>(page);
}

#if TRAY_HARDENING
[[noreturn]] TRAY_COLD void report_release_double_free(const void* block, const Page* page);
// `call` is "free" or "realloc".
[[noreturn]] TRAY_COLD void report_interior_free(const char* call, const void* pointer, const Page* page);

// The fast path's form of free_key_check_and_set: false when the pointer is not a block's
// start or the block is free already, which free_key_check_and_set then reports from the slow
// path (a report from here would give the fast path a stack frame).
TRAY_INLINE bool free_key_passes(const Page* page, Block* block) {
  return is_block_start(page, block) && *free_key_word(block) != reinterpret_cast<uintptr_t>(page);
}

// On every free, before the block is linked anywhere. `page` is the block's own page, never
// another unit's descriptor: the fast path and heap_free_remote must mark a block alike.
TRAY_INLINE void free_key_check_and_set(const Page* page, Block* block) {
  if (TRAY_UNLIKELY(!is_block_start(page, block))) report_interior_free("free", block, page);
  const uint64_t key = reinterpret_cast<uintptr_t>(page);
  if (TRAY_UNLIKELY(*free_key_word(block) == key)) report_release_double_free(block, page);
  *free_key_word(block) = key;
}

// Marks a block free: after free_key_passes on the fast path, and for a block that the debug
// layer gives back from its quarantine to another heap (the owner's drain checks every run's
// blocks for the mark, remote.cpp).
TRAY_INLINE void free_key_set(const Page* page, Block* block) {
  *free_key_word(block) = reinterpret_cast<uintptr_t>(page);
}

// On every allocation: a block given out must not look free when it comes back.
TRAY_INLINE void free_key_clear(Block* block) { *free_key_word(block) = 0; }

[[noreturn]] TRAY_COLD void report_release_realloc_of_freed(const void* block, const Page* page);

// realloc of a block that carries the mark reallocates a freed block: resized in place it
// would come back as live while it sits on a free list, and the next malloc hand it out twice.
// realloc of a pointer into a block is refused as its free would be.
TRAY_INLINE void free_key_check_live(const Page* page, Block* block) {
  if (TRAY_UNLIKELY(!is_block_start(page, block))) report_interior_free("realloc", block, page);
  if (TRAY_UNLIKELY(*free_key_word(block) == reinterpret_cast<uintptr_t>(page)))
    report_release_realloc_of_freed(block, page);
}
#else
TRAY_INLINE bool free_key_passes(const Page*, Block*) { return true; }
TRAY_INLINE void free_key_check_and_set(const Page*, Block*) {}
TRAY_INLINE void free_key_set(const Page*, Block*) {}
TRAY_INLINE void free_key_clear(Block*) {}
TRAY_INLINE void free_key_check_live(const Page*, Block*) {}
#endif

}  // namespace tray
