// The big classes (above kBigClassThresholdBytes: 160 KiB .. 2 MiB; docs/DESIGN.md, "Big
// classes"). Their free blocks keep their first OS page, which holds their link and their free
// key, and stay on their page's free list; the rest of each, its tail, goes back to the OS once
// the block has waited long enough, and comes back with the block when the page's list goes to
// its class's slot (sparse_list_taken). So a free never makes a system call, a block taken
// again faults in only what the program writes of it, and a second free of a block whose tail
// went back is still caught by its key. Only the page's owner does any of this, on its slow
// paths; the bits of Segment::sparse_purged record which OS pages went, as for sparse pages.
//
// When: every tail once no big class of the heap was allocated from for the purge delay; and
// past the heap's budget (the larger of a floor and its recent peak of live big bytes, plus
// what was freed since that peak), the tails of the pages at the back of the biggest classes'
// queues at once. A free by the owner counts against the room the last pass left
// (Heap::big_free_room), so that a thread that frees many blocks and then goes quiet holds no
// more than its budget once its last free returns.
//
// Also here: the large blocks that serve a class the heap uses seldom, and the one empty page
// each class keeps.
#include "heap/tails.hpp"

#include <algorithm>

#include "core/core.hpp"
#include "heap/config.hpp"
#include "heap/hardening.hpp"
#include "heap/queue.hpp"
#include "heap/sparse.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

// The empty page class c keeps (sparse_big_page_emptied), if it is empty still: it may have
// been allocated from since. (A page given to the pool is forgotten: release_page.)
Page* kept_empty(Heap* heap, unsigned c) {
  Page*& kept = heap->big_empty[c - kFirstBigClass];
  if (kept != nullptr && (kept->floating || live_blocks(heap, kept) != 0)) kept = nullptr;
  return kept;
}

// The OS pages of a block at `offset` that it gives back when free: all but the first, whole.
struct TailPages {
  size_t first;
  size_t end;
};
TailPages tail_of(const Page* page, Geometry g, size_t offset) {
  return {(offset + 2 * g.os_page - 1) >> g.os_page_shift,
          (offset + page->block_bytes) >> g.os_page_shift};
}

// The blocks of class c's slot, which counts them as out of its page: free blocks whose tails
// are in memory (they came back with the list, sparse_list_taken).
uint32_t slot_blocks(const Heap* heap, unsigned c) {
  const Page* page = class_page(heap, c);
  uint32_t blocks = heap->books[c].sample_rest_blocks;
  for (const Block* b = heap->slots[c].head; b != list_end() && blocks < page->capacity;
       b = link_load(page, b)) {
    if (!link_in_page(page, b)) break;  // the next pop reports it
    ++blocks;
  }
  return blocks;
}

// The bytes of the page's free blocks' tails that are in memory, about: its free blocks (on its
// list, and in its class's slot) times a tail, less what went back.
size_t resident_tails(const Heap* heap, const Page* page, Geometry g, uint32_t in_slot) {
  const size_t free_blocks = page->capacity - live_blocks(heap, page) + in_slot;
  const size_t tails = free_blocks * (page->block_bytes - g.os_page);
  const size_t gone = page->given_back ? purged_bytes(page, g) : 0;
  return tails > gone ? tails - gone : 0;
}

// Gives back the tail of every block on the page's free list whose tail is in memory. A block's
// tail goes whole and comes back whole, so its first OS page's bit says for all of it.
bool scrub_tails(Page* page, Geometry g, GiveBack& give_back) {
  bool any;
  OsPageSet purged = load_purged(page, g, &any);
  bool any_new = false;
  uint32_t steps = 0;
  for (Block* b = page->free, *holder = nullptr; b != list_end(); holder = b, b = link_load(page, b)) {
    // Every link is followed here, not only the ones a pop takes: checked in full.
    if (!link_in_page(page, b) || ++steps > page->capacity) report_corrupted_list(page, b, holder);
    const TailPages tail = tail_of(page, g, size_t(reinterpret_cast<uint8_t*>(b) - page->blocks));
    if (tail.first >= tail.end || purged.test(tail.first)) continue;
    purged.set_range(tail.first, tail.end - 1);
    const size_t bytes = (tail.end - tail.first) << g.os_page_shift;
    give_back.add(page->blocks + (tail.first << g.os_page_shift), bytes);
    count_add(g_totals.bytes_purged, bytes);
    count_add(g_totals.bytes_decommitted, bytes);
    any_new = true;
  }
  if (any_new) store_purged(page, g, purged);
  return any_new;
}

// Past the budget: the tails of the pages least likely to be allocated from soon go first (the
// back of each queue, the biggest classes first; the pages the classes allocate from last),
// until `resident` is down to `target`.
bool trim_to(Heap* heap, Geometry g, size_t resident, size_t target, GiveBack& give_back) {
  bool released = false;
  for (int heads = 0; heads < 2; ++heads) {
    for (unsigned c = kSizeClassCount; c-- > kFirstBigClass && resident > target;) {
      Page* const head = class_page(heap, c);
      for (Page* page = heap->queues[c].tail; page != nullptr && resident > target; page = page->prev) {
        if ((page == head) != (heads == 1)) continue;
        const size_t before = resident_tails(heap, page, g, page == head ? slot_blocks(heap, c) : 0);
        if (before == 0) continue;
        if (page == head) slot_return(heap, c);
        released |= scrub_tails(page, g, give_back);
        resident -= std::min(resident, before);
      }
    }
  }
  return released;
}

}  // namespace

bool tails_pass(Heap* heap, Geometry g, uint64_t now, TailsPass which, GiveBack& give_back) {
  bool in_use = false;
  size_t live_bytes = 0;
  size_t resident = 0;
  for (unsigned c = kFirstBigClass; c < kSizeClassCount; ++c) {
    const Page* head = class_page(heap, c);
    // Allocated from since the last pass: the slot's list moved, or took a list in (counted
    // then), or a page became the class's (warm). Frees alone do not count.
    const unsigned b = c - kFirstBigClass;
    const uint64_t allocations = heap->counters.allocations[c];
    in_use |= heap->slots[c].head != heap->big_seen_slot[b] || allocations != heap->big_seen_allocations[b];
    heap->big_seen_slot[b] = heap->slots[c].head;
    heap->big_seen_allocations[b] = allocations;
    for (Page* page = heap->queues[c].head; page != nullptr; page = page->next) {
      in_use |= page->warm;
      page->warm = false;
      const uint32_t in_slot = page == head ? slot_blocks(heap, c) : 0;
      live_bytes += size_t(live_blocks(heap, page) - in_slot) * page->block_bytes;
      resident += resident_tails(heap, page, g, in_slot);
    }
  }
  // Allocated from at some point since the last pass: as soon as that, which the frequent
  // passes of a busy heap (every big page change) keep close.
  if (in_use) heap->big_busy_ms = heap->big_pass_ms;
  heap->big_pass_ms = now;
  // The budget, as the span chunks' is: a floor or a share of the live bytes, and what was
  // live at the recent peak and has been freed since (it was resident a moment ago: a program
  // whose big blocks come in rounds or phases finds the last one's warm).
  heap->big_live_peak.note(live_bytes, now);
  const size_t peak = std::max(heap->big_live_peak.recent(now), live_bytes);
  const size_t budget = std::max(kHeapBigFreeFloorBytes, peak / 100 * kHeapBigFreePercent) +
                        (peak - live_bytes);
  bool released = false;
  // No big class allocated from for the purge delay, or the memory limit near: every free
  // block's tail goes.
  if (which == TailsPass::kAll || now - heap->big_busy_ms >= kPurgeDelayMs || limit_pressed()) {
    for (unsigned c = kFirstBigClass; c < kSizeClassCount; ++c) {
      // Its empty page goes to the pool, where any class may take its units.
      if (Page* empty = kept_empty(heap, c); empty != nullptr) release_page(heap, empty);
      for (Page* page = heap->queues[c].head; page != nullptr; page = page->next) {
        // The slot's blocks are free blocks of the page too: back on its list, for the next
        // allocation to take in again (with their tails, if it comes).
        if (page == class_page(heap, c)) slot_return(heap, c);
        released |= scrub_tails(page, g, give_back);
      }
    }
    resident = 0;
  } else if (resident > budget) {
    released |= trim_to(heap, g, resident, budget / 8 * 7, give_back);
    resident = budget / 8 * 7;
  }
  heap->big_free_room = int64_t(budget - resident);
  return released;
}

bool sparse_big_over_budget(Heap* heap) {
  const Geometry g = geometry();
  if (g.per_unit == 0 || heap->checked) {
    heap->big_free_room = INT64_MAX;
    return false;
  }
  GiveBack give_back;
  return tails_pass(heap, g, os::now_ms(), TailsPass::kWhenDue, give_back);
}

void sparse_big_page_emptied(Heap* heap, Page* page) {
  if (Page* kept = kept_empty(heap, page->size_class); kept != nullptr && kept != page)
    release_page(heap, page);
  else
    heap->big_empty[page->size_class - kFirstBigClass] = page;
}

bool sparse_big_wants_page(Heap* heap, unsigned c) {
  // Debug mode's heaps, and the heap profile's, which its lock guards, keep to pages.
  if (heap->checked || heap->kind == OwnerKind::kLocked) return true;
  const uint64_t now = os::now_ms();
  if (now - heap->big_asked_since_ms >= kPurgeDelayMs) {
    for (uint8_t& asked : heap->big_asked) asked = 0;
    heap->big_asked_since_ms = now;
  }
  uint8_t& asked = heap->big_asked[c - kFirstBigClass];
  if (asked < UINT8_MAX - 1) ++asked;
  return asked > kBigPageAfterBlocks;
}

bool sparse_give_back_big(Heap* heap) {
  const Geometry g = geometry();
  if (g.per_unit == 0 || heap->checked) return false;
  GiveBack give_back;
  return tails_pass(heap, g, os::now_ms(), TailsPass::kAll, give_back);
}

bool sparse_big_free_held(const Heap* heap) {
  for (unsigned c = kFirstBigClass; c < kSizeClassCount; ++c)
    for (const Page* page = heap->queues[c].head; page != nullptr; page = page->next)
      if (live_blocks(heap, page) < page->capacity) return true;
  return false;
}

void sparse_list_taken(Page* page) {
  TRAY_ASSERT(is_big_class(page->size_class));
  const Geometry g = geometry();
  count_sub(g_totals.bytes_decommitted, purged_bytes(page, g));
  store_purged(page, g, OsPageSet{});
}

}  // namespace tray
