// Program heaps: heaps a program creates (tray_heap_t), allocates into from any number of
// threads, and empties or destroys at once. Each thread that allocates into one does so
// through a part: a Heap of its own, bound to that thread, with a thread heap's fast paths.
// A part serves one program heap at a time; a destroyed heap's parts are reused by the next.
//
// Who touches what:
//  - a part's queues and pages: its bound thread, or a reset or destroy while no thread
//    allocates into the heap (the program's promise; debug mode checks it);
//  - the heap's list of parts, and each part's binding: under the heap's lock;
//  - a thread's list of bound parts (Heap::bound_parts): that thread alone.
// The lock order, outermost first: the list of program heaps, a program heap's lock, the
// spare parts' lock, then the heaps' and lower layers' locks (api/process.cpp has it whole).
#pragma once

#include <cstdint>

#include "heap/types.hpp"
#include "segment/segment.hpp"

namespace tray {

// The part the calling thread allocates into now, whether its default or for the length of
// a tray_heap_* call (nullptr: its own heap). In debug mode too, where tls_heap stays
// &g_empty_heap.
extern __thread Heap* tls_part;

// The last part the thread looked up: tray_heap_malloc into one heap in a loop finds its part
// without walking the thread's list. Always one of the thread's bound parts, or nullptr.
extern __thread Heap* tls_last_part;

// A new, empty program heap; nullptr when out of memory.
ProgramHeap* program_heap_new();
// Whether `heap` is a program heap that has not been destroyed.
bool program_heap_live(const ProgramHeap* heap);
// The calling thread's part of `heap`, bound now if it had none; nullptr when out of memory.
// The thread must have a heap (tls_own_heap).
Heap* program_part(ProgramHeap* heap);
// Makes `part` (nullptr: none) the one the calling thread allocates into; returns the one it
// replaces.
Heap* program_target(Heap* part);

// Debug mode's part in emptying a checked part, which keeps its pages (HeapUse::kChecked):
// true if `block` of `page` was live, and is now marked freed and filled. nullptr outside
// debug mode.
using RetireBlock = bool (*)(Page* page, Block* block);
// Every small block of the heap goes back: its pages are carved afresh, up to what a thread
// heap keeps, or return to the pool. Large blocks are the caller's (heap->large).
void program_heap_reset(ProgramHeap* heap, RetireBlock retire);
// The same, and the heap is gone: its parts are spare (or will be, when their threads next
// look), and a thread whose default it was allocates from its own heap again.
void program_heap_destroy(ProgramHeap* heap, RetireBlock retire);
// For the length of a scope, the calling thread allocates into `heap` (given a heap of its
// own first if it had none). ready() is false when out of memory, or for a null heap; nothing
// changed then.
class TargetScope {
 public:
  explicit TargetScope(ProgramHeap* heap);
  ~TargetScope() {
    if (part_ != nullptr) program_target(previous_);
  }
  TargetScope(const TargetScope&) = delete;
  TargetScope& operator=(const TargetScope&) = delete;
  bool ready() const { return part_ != nullptr; }

 private:
  Heap* part_ = nullptr;
  Heap* previous_ = nullptr;
};
// The calling thread's own heap, given one if it had none (checked in debug mode); nullptr
// when out of memory.
Heap* program_thread_heap();

// A large block just allocated for the calling thread joins the program heap it allocates
// into, if any; false when out of memory (the caller frees it).
bool program_adopt_large(void* p);
// The program heap whose part allocated the block of `page` (nullptr: none).
ProgramHeap* program_heap_of_page(const Page* page);
// The program heap a live large block belongs to (nullptr: none).
ProgramHeap* program_heap_of_large(const LargeHeader* header);

// A free of a block of a part's page (Page::owner_kind kPart) by a thread other than the
// part's (whose heap is `self`), or by debug mode's quarantine: on the page if the calling
// thread is the part's, else onto the part's remote stack. `counted`: the caller has counted the free as self's
// (debug mode counts at the program's free, and gives the block back later).
void program_free_block(Heap* self, Page* page, Block* block, bool counted) noexcept;
// A part takes a page: stops the program if its heap was destroyed meanwhile (another thread
// destroyed the heap this thread had as its default).
void program_check_alive(Heap* part);
// The thread of `own` ends: its parts are unbound, for other threads to take.
void program_detach_thread(Heap* own);
// The pages the thread of `own` keeps for its next program heap go back to the pool (trim);
// true if there were any.
bool program_trim_thread(Heap* own);

// fork() (api/process.cpp): the program heaps' locks, in order.
void program_lock_for_fork();
void program_unlock_after_fork();

// What dumps show of a live program heap; read without locks while threads run.
struct ProgramHeapUsage {
  uint64_t serial = 0;
  uint64_t parts = 0;         // threads bound to it now
  uint64_t live_blocks = 0;   // small blocks
  uint64_t live_bytes = 0;
  uint64_t page_bytes = 0;    // the pages of its parts
  uint64_t large_blocks = 0;
  uint64_t large_bytes = 0;
};
// Every program heap ever made, newest first (never unlinked).
const ProgramHeap* program_heap_list();
// false when `heap` is not live now.
bool program_heap_usage(const ProgramHeap* heap, ProgramHeapUsage* out);

}  // namespace tray
