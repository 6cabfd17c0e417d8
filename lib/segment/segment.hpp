// Segments and the chunk map.
//
// The chunk map has one byte per 4 MiB of address space and says what traymalloc keeps
// there: nothing (a pointer we do not own, answered in O(1) without touching it), a segment
// (header at the chunk's start), or a large block (header some chunks back). Segments come
// from the OS and are shared by all heaps through one pool, under one lock taken only when a
// page changes hands and held for list and mask updates only: mmap, munmap and madvise run
// after it is let go. Empty units are given back to the OS after a delay. An empty segment
// whose units are still resident can become a span chunk (span.hpp), and an empty chunk a
// segment, so that memory a phase of the program freed serves the next phase whatever the
// size of its blocks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "segment/config.hpp"
#include "segment/types.hpp"

namespace tray {

inline constexpr size_t kChunkCount = size_t{1} << (kAddressBits - kSegmentShift);
inline constexpr uint8_t kChunkForeign = 0;
inline constexpr uint8_t kChunkSegment = 1;
inline constexpr uint8_t kChunkLarge = 2;      // 2 + k: the large header is k chunks back
inline constexpr uint8_t kChunkGuard = 254;    // the guarded slots' region (guard.hpp)
inline constexpr uint8_t kChunkLargeFar = 255; // deeper inside a large block than kChunkGuard - 1

// Every chunk marked as ours is ours to its last byte (large mappings span whole chunks), so an
// entry changes only when we map or unmap that chunk. It is read when freeing a pointer into
// the chunk, which the program could only have been handed after the mapping: a plain load is
// enough. Writes are relaxed atomics:
// one thread may clear an entry just before munmap while another sets it after the next mmap
// returned the same range, an ordering only the kernel provides. ThreadSanitizer cannot see
// that ordering either, so its builds read atomically too.
extern uint8_t g_chunk_map[kChunkCount];

TRAY_INLINE uint8_t chunk_map_load(size_t index) {
#if defined(TRAY_TSAN)
  return __atomic_load_n(&g_chunk_map[index], __ATOMIC_RELAXED);
#else
  return g_chunk_map[index];
#endif
}

TRAY_INLINE uint8_t chunk_kind(const void* p) {
  const uintptr_t index = reinterpret_cast<uintptr_t>(p) >> kSegmentShift;
  if (TRAY_UNLIKELY(index >= kChunkCount)) return kChunkForeign;
  return chunk_map_load(index);
}

// The unit map: for every 64 KiB unit of the address space, the page descriptor of the page
// that holds it, so that free finds a block's page with two loads and no range test, for the
// later units of multi-unit pages too. Entries are offsets from g_foreign_page, which has no
// owner: the zero that untouched map memory reads names it, for every address traymalloc does
// not keep in a segment (large blocks, guarded slots, other allocators' memory), and such a
// free fails the owner test and takes the slow path, which asks the chunk map. Unit 0 and the
// free units of a segment name its pages[0], also ownerless.
//
// Two levels, so that the map takes address space in proportion to where segments are: a
// root of kUnitRootEntries (16 KiB, static) names a leaf of entries for each 128 GiB of the
// 48-bit space. A leaf (16 MiB of address space, of which only the OS pages holding entries
// of mapped segments are touched: one per 32 MiB of segments) is mapped when the first
// segment lands in its range; every other root entry names one shared read-only leaf of
// zeros. A root entry holds its leaf's address less the offset of the range's first entry,
// so the lookup indexes it with the unit number as it is, with no mask. A flat map of the
// whole space took one load less but 16 GiB of address space, which an address-space limit
// (ulimit -v, RLIMIT_AS) refused, and which left no room under a limit set after start.
//
// The root is filled by the library's constructor, or by whatever allocates first, before
// any block exists; until then g_unit_root points at a root of one entry that reads one zero
// word, which serves free(nullptr): a free of another allocator's block before both would
// read past it. A pointer above the 48-bit space indexes past the root and faults there or
// at the leaf, as glibc faults on such a free. Entries change and are read like the chunk
// map's (see above).
inline constexpr unsigned kUnitLeafShift = 37;
inline constexpr unsigned kUnitMapAddressBits = 48;
inline constexpr size_t kUnitRootEntries = size_t{1} << (kUnitMapAddressBits - kUnitLeafShift);
inline constexpr size_t kUnitLeafEntries = size_t{1} << (kUnitLeafShift - kUnitShift);
inline constexpr size_t kUnitLeafBytes = kUnitLeafEntries * sizeof(uintptr_t);
// Root entries are pointers, so that the boot root can be constant-initialised.
extern TRAY_HIDDEN const char* const* g_unit_root;
extern TRAY_HIDDEN constinit Page g_foreign_page;

// Where the entry of p's unit lies: its root entry plus the unit number.
TRAY_INLINE const uintptr_t* unit_entry_of(const char* const* root, uintptr_t address) {
#if defined(TRAY_TSAN)
  const auto leaf = reinterpret_cast<uintptr_t>(__atomic_load_n(&root[address >> kUnitLeafShift], __ATOMIC_RELAXED));
#else
  const auto leaf = reinterpret_cast<uintptr_t>(root[address >> kUnitLeafShift]);
#endif
  return reinterpret_cast<const uintptr_t*>(leaf + (address >> kUnitShift) * sizeof(uintptr_t));
}

// The page p lies in: the slow paths ask it too, for any pointer inside a segment (a free unit
// names the segment's pages[0]).
TRAY_INLINE Page* unit_page_of(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
#if defined(TRAY_TSAN)
  const uintptr_t offset = __atomic_load_n(
      unit_entry_of(__atomic_load_n(&g_unit_root, __ATOMIC_RELAXED), address), __ATOMIC_RELAXED);
#else
  const uintptr_t offset = *unit_entry_of(g_unit_root, address);
#endif
  return reinterpret_cast<Page*>(reinterpret_cast<uintptr_t>(&g_foreign_page) + offset);
}

// Fills the unit map's root if no one has; stops the program if the OS refuses the leaf of
// zeros (16 MiB of address space).
void unit_map_reserve();

void chunk_map_set(const void* base, size_t bytes, bool large);
// Marks the guarded slots' region, for good (it is never unmapped).
void chunk_map_set_guard(const void* base, size_t bytes);
void chunk_map_clear(const void* base, size_t bytes);

TRAY_INLINE Segment* segment_of(const void* p) {
  return reinterpret_cast<Segment*>(align_down(reinterpret_cast<uintptr_t>(p), kSegmentBytes));
}

// The debug state table of a page (see Segment::debug_states).
TRAY_INLINE uint32_t*& page_debug_states(const Page* page) {
  Segment* segment = segment_of(page);
  return segment->debug_states[page - segment->pages];
}

// Transparent huge pages (the thp option, docs/MEMORY.md): the kernel backs a 2 MiB-aligned
// 2 MiB of a region that asks for it with one huge page. Segments and span chunks are mapped
// 4 MiB-aligned (os::map_aligned), so each holds two whole huge pages; unit 0, the header,
// lies in the first.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;
inline constexpr unsigned kUnitsPerHugePage = unsigned(kHugePageBytes / kUnitBytes);  // 32
static_assert(kSegmentBytes % kHugePageBytes == 0 && kUnitsPerSegment % kUnitsPerHugePage == 0);
// A new 4 MiB-aligned region for a segment or a span chunk (the two trade empty regions, see
// segment_give_empty), with the thp option's advice: MADV_HUGEPAGE under thp=madvise,
// MADV_NOHUGEPAGE under thp=never, none under thp=system. nullptr if the OS refuses.
void* segment_map_region();
// A large block's own mapping: MADV_NOHUGEPAGE under thp=never, no advice otherwise.
void thp_advise_large(void* p, size_t bytes);

// A run of `units` free units as a page descriptor with unit_count and blocks set (the rest
// is the page layer's to fill); nullptr when the OS or the memory limit refuses memory. The
// page touches its first commit_bytes now: its clean units past them count as held only once
// it touches them (segment_page_touch). *resident_bytes: from the page's start to the end of
// the last of its units that hold memory already (written by the pages before).
Page* segment_take_page(unsigned units, size_t commit_bytes, size_t* resident_bytes);
// The page is about to touch its first touched_bytes: false if the memory limit refuses what
// that adds to what is held.
bool segment_page_touch(Page* page, size_t touched_bytes);
// Gives a page's units back to the pool (the page must hold no live block); those it never
// touched go back clean.
void segment_return_page(Page* page);
// Purges every dirty unit and unmaps cached segments; true if anything went back to the OS.
bool segment_trim();
// A large block was allocated: the dirty units the pool held for the program's recent peak
// may now be beyond it, and go (a relaxed load while the pool holds none).
void segment_large_grew();
// Purges the units whose delay has run out (for the idle purger): when the next ones will be
// due, or kNeverMs if no unit is dirty.
uint64_t segment_purge_expired(uint64_t now_ms);

// An empty segment whose free units still hold resident memory, given up for another use (a
// span chunk) so that memory serves it without page faults instead of being purged here while
// the other use faults in new pages: the segment leaves the pool, its unit map entries and its
// count; the chunk map entry is the caller's to set. Bit u of *resident_units: unit u may be
// resident (unit 0, the header, always); the other units read zero. nullptr if no segment is
// empty and dirty. Takes the pool lock: never call it under the pool lock.
void* segment_give_empty(uint64_t* resident_units);

// Where the pool looks for an empty chunk that still holds resident memory before it carves
// units that would fault in or maps a new segment: span.cpp's empty chunks, which a program
// whose big blocks died as its small ones grow would otherwise purge while the pool faulted in
// new units. A callback because the span layer sits above this one. The source returns a 4
// MiB-aligned chunk that is no longer its own (or nullptr) and sets *resident_units as
// segment_give_empty does; it is called without the pool lock, so it may take its own. The
// source calls this whenever what it offers changes: `empty` chunks the pool may take before
// it maps a segment, `spare` ones (no more than `empty`) before it carves units that would
// fault in; the pool asks only while the number is not zero.
using EmptyChunkSource = void* (*)(uint64_t* resident_units);
void segment_offer_empty_chunks(EmptyChunkSource source, size_t empty, size_t spare);

// The pool lock, for fork handlers.
void segment_lock_for_fork();
void segment_unlock_after_fork();
// In a forked child, with the pool lock held (the fork handlers took it): every page that
// carries the thread pointer of a thread other than `keep` (the one that forked, the child's
// only thread) carries none. Those threads do not exist in the child, and their pointers come
// back for threads the child creates (heap/queue.hpp, page_owner_thread).
void segment_forget_owner_threads(uintptr_t keep);

}  // namespace tray
