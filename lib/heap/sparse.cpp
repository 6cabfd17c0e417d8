#include "heap/sparse.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/core.hpp"
#include "heap/config.hpp"
#include "heap/hardening.hpp"
#include "heap/os_pages.hpp"
#include "heap/tails.hpp"
#include "heap/queue.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

// The release double-free check's (hardening.hpp) backstop for the blocks whose key went with
// their OS page.
constexpr bool kReleaseChecks = TRAY_HARDENING != 0;
constexpr size_t kMaxBlocksPerPage = kUnitBytes / kNaturalAlignment;
using BlockSet = BitSet<kMaxBlocksPerPage>;

Block* block_at(const Page* page, size_t i) {
  return reinterpret_cast<Block*>(page->blocks + i * page->block_bytes);
}

// The first and last block of `page` with a byte on OS page `p` (a whole one of the carved part).
struct BlockRange {
  size_t first;
  size_t last;
};
BlockRange blocks_on(const Page* page, Geometry g, size_t p) {
  return {p * g.os_page / page->block_bytes, ((p + 1) * g.os_page - 1) / page->block_bytes};
}

// A block's index on its page, by a multiplication: a division for each block of the list
// walk bounded it at a block per 9 cycles. With m = ceil(2^43 / d) = (2^43 + e) / d, e < d,
// an offset n = q d + r gives n m / 2^43 = q + (r + n e / 2^43) / d, which floors to q while
// n e < 2^43: offsets stay under a segment (2^22) and d under the largest class (2^21), and
// n m under 2^61.
class BlockIndex {
 public:
  explicit BlockIndex(const Page* page)
      : blocks_(page->blocks),
        multiplier_(((uint64_t{1} << kShift) + page->block_bytes - 1) / page->block_bytes) {}
  size_t operator()(const Block* b) const {
    const auto offset = uint64_t(reinterpret_cast<const uint8_t*>(b) - blocks_);
    return size_t((offset * multiplier_) >> kShift);
  }

 private:
  static constexpr unsigned kShift = 43;
  static_assert(kSegmentBytes * kMaxSmallBytes <= uint64_t{1} << kShift);
  const uint8_t* blocks_;
  uint64_t multiplier_;
};

// The blocks with a byte on an OS page of `os_pages` (the first `count` of the page's).
BlockSet blocks_on_any(const Page* page, Geometry g, const OsPageSet& os_pages, size_t count) {
  BlockSet blocks;
  for (size_t p = 0; p < count; ++p)
    if (os_pages.test(p)) {
      const BlockRange on = blocks_on(page, g, p);
      blocks.set_range(on.first, on.last);
    }
  return blocks;
}

// The blocks of `set`, linked in address order in front of `rest`.
Block* link_blocks(const Page* page, const BlockSet& set, Block* rest) {
  Block* head = list_end();
  Block* tail = nullptr;
  set.for_each(page->capacity, [&](size_t i) {
    Block* block = block_at(page, i);
    if (tail != nullptr) link_store(page, tail, block);
    else head = block;
    tail = block;
  });
  if (tail == nullptr) return rest;
  link_store(page, tail, rest);
  return head;
}

// A walk of a page's free list waits for one cache miss after another (a fifth of the
// fragmentation workload's time went there): this loads every carved block's first line in
// address order first, and the walk then finds them in the cache (4096 lines, 256 KiB, at
// most). Each load has a prefetch kLoadAheadLines further on ahead of it. Prefetches alone,
// all issued at once, did not keep up on the AMD EPYC we measure on: in that workload the
// walk still waited 37 million cycles on top of the 3 that issuing them took; with the loads
// to pace them it waits 8, after 10 in the loop. Given-back OS pages are left out: nothing on
// them is on the list, and a load would fault them back in. The stride is a conditional, not
// std::max: with std::max<size_t> of the 32-bit field, GCC 12 left no prefetch of the loop
// in the object code at all.
constexpr size_t kLoadAheadLines = 16;

// A load the compiler cannot see into: the line may hold a live block that another thread
// writes meanwhile, and the value is never used. Other machines get a prefetch.
TRAY_INLINE void touch_line(const uint8_t* p) {
#if defined(__x86_64__)
  asm volatile("testb $0, (%0)" : : "r"(p) : "cc");
#elif defined(__aarch64__)
  uint32_t scratch;
  asm volatile("ldrb %w0, [%1]" : "=r"(scratch) : "r"(p));
#else
  __builtin_prefetch(p);
#endif
}

void load_carved(const Page* page, Geometry g, const OsPageSet& purged, bool any_purged) {
  const size_t stride = page->block_bytes > kCacheLineBytes ? page->block_bytes : kCacheLineBytes;
  const size_t carved_bytes = size_t(page->capacity) * page->block_bytes;
  const size_t ahead_bytes = kLoadAheadLines * stride;
  // An OS page at a time, so that the set is read once for each (a prefetch that lands on one
  // given back does nothing: prefetches never fault).
  for (size_t offset = 0; offset < carved_bytes;) {
    const size_t os_page_end =
        std::min(carved_bytes, ((offset >> g.os_page_shift) + 1) << g.os_page_shift);
    if (any_purged && purged.test(offset >> g.os_page_shift)) {
      offset += (os_page_end - offset + stride - 1) / stride * stride;  // the next block's start
      continue;
    }
    for (; offset < os_page_end; offset += stride) {
      if (offset + ahead_bytes < carved_bytes)
        __builtin_prefetch(page->blocks + offset + ahead_bytes);
      touch_line(page->blocks + offset);
    }
  }
}

// Gives back every OS page of the carved part of `page` whose blocks are all free (on the
// free list, or out already), and rebuilds the free list, in address order, without them.
// True if any went back (to `give_back`, which hands them to the OS).
bool scrub_page(Page* page, Geometry g, GiveBack& give_back) {
  const size_t block_bytes = page->block_bytes;
  const size_t capacity = page->capacity;
  const size_t whole_os_pages = capacity * block_bytes / g.os_page;
  if (whole_os_pages == 0) return false;
  TRAY_ASSERT(capacity <= kMaxBlocksPerPage);
  bool any_purged;
  const OsPageSet purged = load_purged(page, g, &any_purged);
  // The blocks that lie (partly) on an OS page given back: on no list. One found there was
  // freed since, a second time (its key went with the OS page, so free let it through).
  const BlockSet gone = any_purged ? blocks_on_any(page, g, purged, whole_os_pages) : BlockSet{};
  load_carved(page, g, purged, any_purged);
  const BlockIndex index_of(page);
  BlockSet on_list;
  for (Block* b = page->free, *holder = nullptr; b != list_end(); holder = b, b = link_load(page, b)) {
    // Every link is followed here, not only the ones a pop takes: checked in full.
    if (!link_in_page(page, b)) report_corrupted_list(page, b, holder);
    const size_t i = index_of(b);
    if (kReleaseChecks && any_purged && gone.test(i)) report_sparse_block_reused(b, page);
    on_list.set(i);
  }
  on_list.remove(gone, capacity);  // without the checks: such a block is not linked again

  // A block is out of use if it is on the list or gone.
  BlockSet out_of_use = on_list;
  out_of_use.add(gone, capacity);

  OsPageSet merged = purged;
  bool any_new = false;
  for (size_t p = 0; p < whole_os_pages; ++p) {
    if (purged.test(p)) continue;
    const BlockRange on = blocks_on(page, g, p);
    if (!out_of_use.all_in(on.first, on.last)) continue;
    merged.set(p);
    on_list.clear_range(on.first, on.last);
    any_new = true;
  }
  if (!any_new) return false;

  page->free = link_blocks(page, on_list, list_end());

  for (size_t p = 0; p < whole_os_pages;) {
    if (!merged.test(p) || purged.test(p)) {
      ++p;
      continue;
    }
    size_t end = p + 1;
    while (end < whole_os_pages && merged.test(end) && !purged.test(end)) ++end;
    const size_t bytes = (end - p) * g.os_page;
    give_back.add(page->blocks + p * g.os_page, bytes);
    count_add(g_totals.bytes_purged, bytes);
    count_add(g_totals.bytes_decommitted, bytes);
    p = end;
  }
  store_purged(page, g, merged);
  return true;
}

// Blocks die at random, so an OS page of small blocks is all free with a fair chance only
// once the page holds about as few live blocks as it has OS pages. Walking the free list
// touches every free block, so such a page is looked at again only once half of the live
// blocks it had then have died. A free block of an OS page or more holds a whole OS page
// (about one in two for blocks of one to two OS pages), so such pages are worth a look at any
// live share, and again after any death: their pages hold 8 to 16 blocks, so the walk is short.
bool worth_a_look(const Page* page, Geometry g) {
  const size_t used = page->used;
  if (page->block_bytes >= g.os_page) return page->scrubbed_used == 0 || used < page->scrubbed_used;
  const size_t os_pages = size_t(page->capacity) * page->block_bytes / g.os_page;
  if (used * 100 > size_t(page->capacity) * kSparsePagePercent || used > os_pages) return false;
  return page->scrubbed_used == 0 || used * 2 <= page->scrubbed_used;
}

// Whether the page class c allocates from has been idle (nothing allocated from it or freed
// into it) for kSparseHeadIdleMs, as the passes saw it; `restart`: the heap saw no pass for
// that long, and its head's idle time starts now. The page allocated from stays as it is while
// its class uses it. Once it is idle it can hold most of what the class leaves behind: a class
// of 16 KiB and more has a head of 128 KiB to 1 MiB (8 blocks), and the soak's heaps kept
// 8 MiB of them, nearly empty, through every phase after the one that used them.
bool head_idle_for_long(Heap* heap, unsigned c, uint64_t now, bool restart) {
  const Page* head = class_page(heap, c);
  const AllocSlot& slot = heap->slots[c];
  if (head->free != heap->sparse_head_free[c] || slot.head != heap->sparse_head_slot[c] || restart) {
    heap->sparse_head_free[c] = head->free;
    heap->sparse_head_slot[c] = slot.head;
    heap->sparse_head_since_ms[c] = now;
  }
  return now - heap->sparse_head_since_ms[c] >= kSparseHeadIdleMs;
}

}  // namespace

bool sparse_pass(Heap* heap, bool force) {
  const Geometry g = geometry();
  if (g.per_unit == 0 || heap->checked) return false;
  const uint64_t now = os::now_ms();
  if (!force && now - heap->sparse_pass_ms < kSparsePassMs) return false;
  // A heap that saw no pass for that long was parked, or its thread slept: its heads' idle
  // time counts from now, not from before a new thread adopted it.
  const bool heads_restart = now - heap->sparse_pass_ms >= kSparseHeadIdleMs;
  heap->sparse_pass_ms = now;
  const uint64_t delay_ms = uint64_t(option(Option::kSparseDelayMs));
  bool released = false;
  GiveBack give_back;
  for (unsigned c = 0; c < kFirstBigClass; ++c) {
    // A class whose head page changed since the last pass is still growing through its queue:
    // its head reaches the sparse pages soon and would fault back in whatever went (thread
    // churn, where each new thread adopts the pages of one that ended, lost a page fault per
    // OS page so). Only a class that went quiet gives its sparse pages back: quiet since the
    // last pass, or for sparse_delay_ms if that is longer.
    Page* const head = class_page(heap, c);
    if (head->warm || heads_restart) heap->sparse_class_busy_ms[c] = now;
    const bool class_busy =
        (head->warm || now - heap->sparse_class_busy_ms[c] < delay_ms) && !force;
    const bool head_idle = head_idle_for_long(heap, c, now, heads_restart) || force;
    for (Page* page = heap->queues[c].head; page != nullptr; page = page->next) {
      // Empty pages kept for reuse stay as they are; a page that was allocated from since the
      // last pass may be again soon.
      const bool warm = page->warm;
      page->warm = false;
      if ((page == head && !head_idle) || page->retained || ((warm || class_busy) && !force))
        continue;
      // The head's blocks in its slot are free blocks of the page too: back on its list, for
      // the next allocation to take in again.
      if (page == head) slot_return(heap, c);
      if (!force && !worth_a_look(page, g)) continue;
      page->scrubbed_used = uint16_t(page->used);
      released |= scrub_page(page, g, give_back);
    }
    heap->sparse_head_free[c] = head->free;
    heap->sparse_head_slot[c] = heap->slots[c].head;
  }
  released |= tails_pass(heap, g, now, force ? TailsPass::kAll : TailsPass::kWhenDue, give_back);
  return released;
}

namespace {

// The OS pages given back read as zero until something writes them, and nothing may: their
// blocks are on no list. One that is in memory again and not all zero had a block freed a
// second time (its key went with the page, so free let it through, and malloc handed it out)
// or written after its free. Checked before those blocks are handed out again, which would
// give one of them to two owners. Only OS pages in memory are read: the rest are untouched.
void check_given_back_untouched(const Page* page, Geometry g, const OsPageSet& purged) {
  const size_t os_pages = size_t(page->capacity) * page->block_bytes / g.os_page;
  unsigned char resident[kMaxOsPagesPerPage];
  if (os_pages == 0 || !os::resident_pages(page->blocks, os_pages * g.os_page, resident)) return;
  for (size_t p = 0; p < os_pages; ++p) {
    if (!purged.test(p) || (resident[p] & 1) == 0) continue;
    const auto* words = reinterpret_cast<const uint64_t*>(page->blocks + p * g.os_page);
    for (size_t w = 0; w < g.os_page / sizeof(uint64_t); ++w) {
      if (words[w] == 0) continue;
      const size_t offset = p * g.os_page + w * sizeof(uint64_t);
      report_sparse_block_reused(page->blocks + offset / page->block_bytes * page->block_bytes, page);
    }
  }
}

// Nearly every page never gave an OS page back: its descriptor says so, before a set is built
// (that cost the mixed batch benchmark 0.8 instructions per pair in sparse_refill) or a line
// of the segment header is read (a cache miss, nearly always: the fragmentation workload
// takes 99 thousand pages without free blocks at scale 0.3, and sparse_refill asks for each).
bool any_given_back(const Page* page) {
#ifndef NDEBUG
  const uint16_t* words = purged_words(page);
  uint16_t given_back = 0;
  for (unsigned u = 0; u < page->unit_count; ++u) given_back = uint16_t(given_back | words[u]);
  TRAY_ASSERT((given_back != 0) == bool(page->given_back));
#endif
  return page->given_back;
}

}  // namespace

bool sparse_refill_given_back(Page* page) {
  if (!any_given_back(page)) return false;
  // A big page's given-back tails belong to blocks on its list, which is empty here.
  TRAY_CHECK(!is_big_class(page->size_class));
  const Geometry g = geometry();
  if (g.per_unit == 0) return false;
  bool any;
  const OsPageSet purged = load_purged(page, g, &any);
  if (!any) return false;
  if (kReleaseChecks) check_given_back_untouched(page, g, purged);
  const size_t os_pages = size_t(page->capacity) * page->block_bytes / g.os_page;
  page->free = link_blocks(page, blocks_on_any(page, g, purged, os_pages), page->free);
  count_sub(g_totals.bytes_decommitted, purged_bytes(page, g));
  store_purged(page, g, OsPageSet{});
  page->scrubbed_used = 0;
  return true;
}

void sparse_forget(Page* page) {
  if (!any_given_back(page)) return;
  const Geometry g = geometry();
  if (g.per_unit == 0) return;
  // The second free of a block on a given-back OS page wrote its link and key there: the
  // page reads as something other than zero again. A look at those OS pages alone finds it,
  // where a walk of the list (every block of a page that is now empty) took an eighth of the
  // sparse pass's time again in the fragmentation workload.
  if (kReleaseChecks) {
    bool any;
    check_given_back_untouched(page, g, load_purged(page, g, &any));
  }
  count_sub(g_totals.bytes_decommitted, purged_bytes(page, g));
  store_purged(page, g, OsPageSet{});
}

}  // namespace tray
