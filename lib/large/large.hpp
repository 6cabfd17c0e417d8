// Large blocks (above kMaxSmallBytes, or aligned beyond what a page gives): each is a mapping
// of its own, aligned to the segment size so the chunk map finds its header, and reused
// through a small cache of freed mappings. realloc grows them in place or moves their pages
// with mremap instead of copying.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "large/config.hpp"
#include "large/large_cache.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"

namespace tray {

// A block of `size` bytes aligned to `alignment` (a power of two); zeroed if `zero`.
// nullptr when the OS refuses (errno is left to the caller).
void* large_alloc(size_t size, size_t alignment, bool zero);
// The header of the large mapping that p lies in (chunk kind from the chunk map), or nullptr
// if p lies too deep inside it to say.
LargeHeader* large_mapping_of(const void* p, uint8_t chunk_kind);
size_t large_usable_size(const LargeHeader* header);
void large_free(LargeHeader* header);
// A free (op "free") or realloc (op "realloc") of p, in the mapping of `header` but not its
// live block: a double free, a pointer into the block, or one into no block. Stops the
// program with a message that names the block.
[[noreturn]] TRAY_COLD void large_report_bad_free(const char* op, const LargeHeader* header, const void* p);
// Debug mode's free of the block at `user` (the caller has already cleared header->user, so a
// second free is recognised): the header stays and the rest of the mapping becomes
// inaccessible, so a use after free faults at once.
void large_retire(LargeHeader* header, void* user);
// Gives a retired mapping back to the OS.
void large_unmap_retired(LargeHeader* header);
// Resizes in place or by moving the mapping; nullptr (block untouched) if the OS refuses.
void* large_resize(LargeHeader* header, size_t new_size);
// Unmaps every cached mapping; true if there was any.
bool large_trim();
// Unmaps the cached mappings whose delay has run out (for the idle purger): when the next one
// will be due, or kNeverMs if the cache is empty.
uint64_t large_purge_expired(uint64_t now_ms);

// --- owners (large_owner.cpp) -------------------------------------------------------------
// A set of live large blocks freed together: a program heap's (heap/program.hpp). A block
// leaves it when it is freed on its own; it follows its block when realloc moves it.
struct LargeOwner {
  os::Mutex lock;
  LargeHeader** headers = nullptr;  // [0, count): the blocks; a header's owner_slot is its index
  uint32_t count = 0;
  uint32_t capacity = 0;
  size_t bytes = 0;                 // their usable bytes
};
// Adds the live block of `header` to owner; false (nothing done) when out of memory.
bool large_own(LargeOwner* owner, LargeHeader* header);
// Takes the block out of its owner (large_free and large_retire do it).
void large_disown(LargeHeader* header);
// realloc resized the block of `header` (where it lies, or moved to `header`), which was
// old_usable bytes: its owner follows.
void large_owner_resized(LargeHeader* header, size_t old_usable);
// Takes every block out of owner and hands each to `release` (large_free, or debug mode's
// retirement); the owner's table goes back to the OS.
void large_release_owned(LargeOwner* owner, void (*release)(LargeHeader*));
// Blocks and usable bytes the owner holds (for dumps: read without the lock).
void large_owner_usage(const LargeOwner* owner, size_t* blocks, size_t* bytes);

// Mappings in the cache and span chunks with resident free pages, and the bytes they hold
// (lock-free, for dumps).
void large_cache_usage(size_t* blocks, size_t* bytes);

void large_lock_for_fork();
void large_unlock_after_fork();

}  // namespace tray
