#include "heap/page.hpp"

#include <algorithm>

#include "heap/hardening.hpp"
#include "heap/queue.hpp"
#include "heap/sparse.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "stats/stats.hpp"

namespace tray {

Page* page_acquire(Heap* heap, unsigned size_class) {
  // A big class's page touches a block at a time (page_extend), and holds only what it touched.
  const bool big = is_big_class(size_class);
  size_t resident_bytes = 0;
  Page* page = segment_take_page(class_slab_units(size_class),
                                 big ? class_size(size_class) : class_slab_bytes(size_class),
                                 &resident_bytes);
  if (page == nullptr) return nullptr;
  page->free = list_end();
  page->used = 0;
  __atomic_store_n(&page->floating, false, __ATOMIC_RELAXED);  // takers read it atomically
  page->retained = false;
  page->warm = false;
  page->came_home = false;
  page->cycled = false;
  page->scrubbed_used = 0;
  page->given_back = 0;
  page->capacity = 0;
  page->accounted = 0;
  page->reserved = class_blocks_per_page(size_class);
  page->block_bytes = uint32_t(class_size(size_class));
  // It carves a block at a time, except the blocks on units that hold memory already (another
  // page's, freed): at once, so that their memory is in free blocks, whose tails go back as any
  // free block's do (tails.cpp), not hidden past the carved part.
  page->carved_before = big ? uint32_t(std::min<size_t>(page->reserved, div_ceil(resident_bytes, page->block_bytes))) : 0;
  page->size_class = uint8_t(size_class);
  page->next = page->prev = nullptr;
  page->heap = heap;
  page->heap_bucket = remote_bucket_of(heap);
  page->owner_kind = heap->kind;
  page_set_owner_thread(page, heap->owner_thread);
  if (heap->kind == OwnerKind::kPart) counter_add(heap->page_units, page->unit_count);
  page_arm_checks(page);
  // The first block is held already: if the memory limit refuses the resident ones after it
  // (clean units among them), the page starts with it alone.
  if (!page_extend(page)) {
    page->carved_before = 0;
    page_extend(page);
  }
  ClassTotals& totals = g_totals.classes[size_class];
  count_max(totals.peak_pages, totals.pages.fetch_add(1, std::memory_order_relaxed) + 1);
  return page;
}

size_t page_debug_states_bytes(const Page* page) {
  return align_up(size_t(page->reserved) * sizeof(uint32_t), os::page_size());
}

void page_release(Page* page) {
  TRAY_ASSERT(page->used == 0 && !page->floating);
  count_sub(g_totals.classes[page->size_class].pages, 1);
  if (uint32_t*& states = page_debug_states(page); states != nullptr) {
    os::unmap(states, page_debug_states_bytes(page));
    count_sub(g_totals.bytes_metadata, page_debug_states_bytes(page));
    states = nullptr;
  }
  sparse_forget(page);
  if (page->owner_kind == OwnerKind::kPart) counter_add(page->heap->page_units, -uint64_t(page->unit_count));
  page->heap = nullptr;
  page_set_owner_thread(page, 0);
  page->owner_kind = OwnerKind::kThread;
  page->free = list_end();
  page->limit = 0;
  page->capacity = 0;
  page->used = 0;
  page->accounted = 0;
  segment_return_page(page);
}

// Blocks that other threads free come home in runs, each spliced onto the front of its page's
// list, whose boundaries fall where the senders' batches and the owner's drains happened to
// cut (a page whose blocks only its own thread freed keeps its list: the most recently freed,
// warm blocks first). Over a few hundred rounds of a producer whose consumer frees blocks in
// the order they were handed out, the list's order became random: every pop a cache miss on a
// line another core wrote, and one that no prefetcher foresees, since the address comes from
// the block before. Carved again, an empty page hands out ascending addresses once more
// (xmalloc_test, 2 threads: 0.078 -> 0.039 s). It costs a store per block, in order, on lines
// the program is about to write anyway. Its given-back OS pages come back with the carving.
void page_recarve(Page* page) {
  TRAY_ASSERT(page->used == 0 && !page->floating);
  sparse_forget(page);
  page->free = list_end();
  // Carved before, in any life of the page (a program heap may reset it twice in a row).
  if (page->capacity > page->carved_before) page->carved_before = page->capacity;
  page->capacity = 0;
  page->came_home = false;
}

namespace {

// Starts fetching the blocks the page's next extension will link through (a hint to write;
// x86-64 without PREFETCHW builds it as a plain prefetch into every cache level).
// Memory a page reuses (resident, written long ago by blocks of another size) is cold, and
// the extension's link writes miss; x86 commits stores in order, so the store that follows
// them waits for every one. In `phases`, where 1000-byte blocks take over the pages 1 MiB
// blocks left, that store held 13% of the samples (`perf record`). Fetched now, the misses
// overlap the program's work until the next extension. Eight blocks at most: the hardware
// prefetcher follows the sequential writes through a run of small blocks on its own. Inlined:
// a function of loads and prefetches alone counts as free of side effects, and GCC dropped
// the call.
TRAY_INLINE void prefetch_next_extension(const Page* page, uint32_t count) {
  const uint32_t blocks = std::min(std::min<uint32_t>(count, 8), page->reserved - page->capacity);
  for (uint32_t i = 0; i < blocks; ++i)
    __builtin_prefetch(page->blocks + size_t(page->capacity + i) * page->block_bytes, 1);
}

}  // namespace

bool page_extend(Page* page) {
  TRAY_ASSERT(page_can_extend(page));
  const size_t block = page->block_bytes;
  uint32_t count = uint32_t(kPageExtendBytes / block);
  if (count < kPageExtendMinBlocks) count = kPageExtendMinBlocks;
  // A big class's page carves a block at a time: every block on its list was handed out once,
  // so what the list holds is what may be in memory (heap/tails.cpp), and a block of hundreds
  // of KiB is worth a slow path.
  if (is_big_class(page->size_class)) count = 1;
  // Carving little at a time keeps a barely used page barely resident; blocks carved before
  // a recarve are resident already, and one extension for them all saves a slow path per
  // kPageExtendBytes (a program heap's reset recarves every page it keeps).
  if (page->capacity < page->carved_before && page->carved_before - page->capacity > count)
    count = page->carved_before - page->capacity;
  if (count > page->reserved - page->capacity) count = page->reserved - page->capacity;
  // A big class's page counts as held only what it touches; the memory limit may refuse more.
  if (is_big_class(page->size_class) &&
      !segment_page_touch(page, size_t(page->capacity + count) * block))
    return false;
  // Link in address order, so a fresh page hands out ascending addresses (friendly to the
  // hardware prefetcher), onto the front of whatever the free list holds.
  uint8_t* first = page->blocks + size_t(page->capacity) * block;
  uint8_t* p = first;
  for (uint32_t i = 1; i < count; ++i, p += block)
    link_store(page, reinterpret_cast<Block*>(p), reinterpret_cast<Block*>(p + block));
  link_store(page, reinterpret_cast<Block*>(p), page->free);
  page->free = reinterpret_cast<Block*>(first);
  page->capacity += count;
  prefetch_next_extension(page, count);
  return true;
}

}  // namespace tray
