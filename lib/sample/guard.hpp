// Guarded sampling (guard_sample=BYTES): about one allocation per so many bytes allocated is
// served from a slot of its own in a reserved region, between inaccessible pages, so that the
// first byte read or written past its end (or, every other block, before its start) faults at
// the guilty instruction. At free its pages become inaccessible and stay so until the slot is
// reused, oldest freed first, so a use after free faults too. A SIGSEGV handler reports the
// block, the offset and the allocation and free stacks, then aborts; faults elsewhere go on to
// the program's own handler. The region has its own chunk-map kind (kChunkGuard), so frees of
// other blocks never look at it.
#pragma once

#include <cstddef>

namespace tray {

struct ProgramHeap;

// A guarded block of `size` bytes aligned to `alignment`, or nullptr when the request is not
// eligible (too big, over-aligned, before the process is ready, every slot live): the caller
// then allocates as usual. Always zeroed, so `zero` asks nothing more.
void* guard_alloc(size_t size, size_t alignment, bool zero);
// Frees a pointer into the region: reports a double or invalid free, or an overflow into the
// padding behind the block, and aborts.
void guard_free(void* p);
// Frees every live guarded block allocated into `owner` (tray_heap_reset and _destroy).
void guard_release_owned(const ProgramHeap* owner);
// The program heap the live guarded block at p was allocated into, or nullptr.
const ProgramHeap* guard_owner_of(const void* p);
// The bytes asked for (no more, so that malloc_usable_size leads nobody into the padding); 0 if
// p is not a live guarded block.
size_t guard_usable_size(const void* p);
// Loads the unwinder (it allocates on its first use) while it is safe to: guarded blocks are
// handed out only once this ran. Called at start-up and by tray_option_set.
void guard_prepare();
// fork() (api/process.cpp): the slots' lock.
void guard_lock_for_fork();
void guard_unlock_after_fork();

}  // namespace tray
