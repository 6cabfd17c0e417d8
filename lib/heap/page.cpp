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
  Page* page = segment_take_page(class_slab_units(size_class));
  if (page == nullptr) return nullptr;
  page->free = list_end();
  page->used = 0;
  page->floating = false;
  page->retained = false;
  page->warm = false;
  page->came_home = false;
  page->cycled = false;
  page->scrubbed_used = 0;
  page->given_back = 0;
  page->capacity = 0;
  page->carved_before = 0;
  page->accounted = 0;
  page->reserved = class_blocks_per_page(size_class);
  page->block_bytes = uint32_t(class_size(size_class));
  page->size_class = uint8_t(size_class);
  page->next = page->prev = nullptr;
  page->heap = heap;
  page->heap_bucket = remote_bucket_of(heap);
  page->owner_kind = heap->kind;
  page_set_owner_thread(page, heap->owner_thread);
  if (heap->kind == OwnerKind::kPart) counter_add(heap->page_units, page->unit_count);
  page_arm_checks(page);
  page_extend(page);
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
  page->carved_before = page->capacity;
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

void page_extend(Page* page) {
  TRAY_ASSERT(page_can_extend(page));
  const size_t block = page->block_bytes;
  uint32_t count = uint32_t(kPageExtendBytes / block);
  if (count < kPageExtendMinBlocks) count = kPageExtendMinBlocks;
  // Carving little at a time keeps a barely used page barely resident; blocks carved before
  // a recarve are resident already, and one extension for them all saves a slow path per
  // kPageExtendBytes (a program heap's reset recarves every page it keeps).
  if (page->capacity < page->carved_before && page->carved_before - page->capacity > count)
    count = page->carved_before - page->capacity;
  if (count > page->reserved - page->capacity) count = page->reserved - page->capacity;
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
}

}  // namespace tray
