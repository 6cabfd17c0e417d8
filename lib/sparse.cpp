#include "sparse.hpp"

#include <cstring>

#include "core/assert.hpp"
#include "core/bits.hpp"
#include "core/config.hpp"
#include "free_key.hpp"
#include "options.hpp"
#include "platform/os.hpp"
#include "segment.hpp"
#include "stats.hpp"

namespace tray {

namespace {

constexpr unsigned kMaxOsPagesPerUnit = 16;  // the width of Segment::sparse_purged
// The release double-free check's (free_key.hpp) backstop for the blocks whose key went with
// their OS page.
constexpr bool kReleaseChecks = TRAY_FREE_KEY_CHECK != 0;
constexpr size_t kMaxBlocksPerPage = kUnitBytes / kNaturalAlignment;
constexpr size_t kMaxOsPagesPerPage = kUnitsPerSegment * kMaxOsPagesPerUnit;

template <size_t kBits>
class BitSet {
 public:
  void set(size_t i) { words_[i / 64] |= uint64_t{1} << (i % 64); }
  bool test(size_t i) const { return (words_[i / 64] >> (i % 64)) & 1; }
  bool any_in(size_t first, size_t last) const {  // inclusive
    for (size_t i = first; i <= last; ++i)
      if (test(i)) return true;
    return false;
  }

 private:
  uint64_t words_[kBits / 64] = {};
};
using OsPageSet = BitSet<kMaxOsPagesPerPage>;
using BlockSet = BitSet<kMaxBlocksPerPage>;

struct Geometry {
  size_t os_page;
  unsigned os_page_shift;  // a shift, not a division, in loops over a page's lines
  unsigned per_unit;       // OS pages per unit
};

// 0 OS pages per unit where they do not fit the header's 16 bits (pages under 4 KiB).
Geometry geometry() {
  const size_t os_page = os::page_size();
  const size_t per_unit = kUnitBytes / os_page;
  return {os_page, floor_log2(os_page), per_unit <= kMaxOsPagesPerUnit ? unsigned(per_unit) : 0};
}

uint16_t* purged_words(const Page* page) {
  Segment* segment = segment_of(page);
  return &segment->sparse_purged[page - segment->pages];
}

OsPageSet load_purged(const Page* page, Geometry g, bool* any) {
  OsPageSet set;
  *any = false;
  const uint16_t* words = purged_words(page);
  for (unsigned u = 0; u < page->unit_count; ++u)
    for (unsigned i = 0; i < g.per_unit; ++i)
      if ((words[u] >> i) & 1) {
        set.set(u * g.per_unit + i);
        *any = true;
      }
  return set;
}

void store_purged(const Page* page, Geometry g, const OsPageSet& set) {
  uint16_t* words = purged_words(page);
  for (unsigned u = 0; u < page->unit_count; ++u) {
    uint16_t word = 0;
    for (unsigned i = 0; i < g.per_unit; ++i)
      if (set.test(u * g.per_unit + i)) word = uint16_t(word | (1u << i));
    words[u] = word;
  }
}

bool overlaps(const OsPageSet& set, size_t block, size_t block_bytes, unsigned os_page_shift) {
  return set.any_in((block * block_bytes) >> os_page_shift,
                    ((block + 1) * block_bytes - 1) >> os_page_shift);
}

Block* block_at(const Page* page, size_t i) {
  return reinterpret_cast<Block*>(page->blocks + i * page->block_bytes);
}

size_t purged_bytes(const Page* page, Geometry g) {
  size_t count = 0;
  const uint16_t* words = purged_words(page);
  for (unsigned u = 0; u < page->unit_count; ++u) count += popcount64(words[u]);
  return count * g.os_page;
}

size_t block_index(const Page* page, const Block* b) {
  return size_t(reinterpret_cast<const uint8_t*>(b) - page->blocks) / page->block_bytes;
}

// For a block on `page`'s free list. The blocks of given-back OS pages left the list when
// their OS page went, and come back only all at once (sparse_refill): one found there was
// freed since, a second time.
void check_not_given_back(const Page* page, const Block* b, Geometry g, const OsPageSet& purged) {
  if (kReleaseChecks && overlaps(purged, block_index(page, b), page->block_bytes, g.os_page_shift))
    report_sparse_block_reused(b, page);
}

// The OS pages a pass gives back, handed to the OS a list at a time (os::purge_ranges): one
// system call for up to 32 ranges of one or two OS pages, where madvise took one each.
class GiveBack {
 public:
  GiveBack() = default;
  GiveBack(const GiveBack&) = delete;
  GiveBack& operator=(const GiveBack&) = delete;
  ~GiveBack() { flush(); }

  void add(uint8_t* start, size_t bytes) {
    ranges_[count_++] = {start, bytes, false};
    if (count_ == os::kPurgeListRanges) flush();
  }

 private:
  // Where the OS keeps the pages (locked memory), they must still read as zero for
  // check_given_back_untouched.
  void flush() {
    os::purge_ranges(ranges_, count_);
    for (size_t i = 0; i < count_; ++i)
      if (!ranges_[i].purged) std::memset(ranges_[i].start, 0, ranges_[i].bytes);
    count_ = 0;
  }

  os::PurgeRange ranges_[os::kPurgeListRanges];
  size_t count_ = 0;
};

// A walk of a page's free list waits for one cache miss after another (a fifth of the
// fragmentation workload's time went there): this starts the loads of every carved block's
// first line at once, in address order, and the walk finds them in the cache (4096 lines,
// 256 KiB, at most). Given-back OS pages are left out: nothing on them is on the list.
// The stride is a conditional, not std::max: with std::max<size_t> of the 32-bit field, GCC 12
// left no prefetch of this loop in the object code at all.
void prefetch_carved(const Page* page, Geometry g, const OsPageSet& purged, bool any_purged) {
  const size_t stride = page->block_bytes > kCacheLineBytes ? page->block_bytes : kCacheLineBytes;
  const size_t carved_bytes = size_t(page->capacity) * page->block_bytes;
  for (size_t offset = 0; offset < carved_bytes; offset += stride)
    if (!any_purged || !purged.test(offset >> g.os_page_shift))
      __builtin_prefetch(page->blocks + offset);
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
  OsPageSet purged = load_purged(page, g, &any_purged);
  prefetch_carved(page, g, purged, any_purged);
  BlockSet on_list;
  for (Block* b = page->free; b != nullptr; b = b->next) {
    if (any_purged) check_not_given_back(page, b, g, purged);
    on_list.set(block_index(page, b));
  }

  OsPageSet merged = purged;
  bool any_new = false;
  for (size_t p = 0; p < whole_os_pages; ++p) {
    if (purged.test(p)) continue;
    const size_t first = p * g.os_page / block_bytes;
    const size_t last = ((p + 1) * g.os_page - 1) / block_bytes;
    bool all_free = true;
    for (size_t i = first; i <= last && all_free; ++i)
      all_free = on_list.test(i) || overlaps(purged, i, block_bytes, g.os_page_shift);
    if (all_free) {
      merged.set(p);
      any_new = true;
    }
  }
  if (!any_new) return false;

  Block* head = nullptr;
  Block** tail = &head;
  for (size_t i = 0; i < capacity; ++i) {
    if (!on_list.test(i) || overlaps(merged, i, block_bytes, g.os_page_shift)) continue;
    *tail = block_at(page, i);
    tail = &(*tail)->next;
  }
  *tail = nullptr;
  page->free = head;

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

}  // namespace

bool sparse_pass(Heap* heap, bool force) {
  const Geometry g = geometry();
  if (g.per_unit == 0 || debug_mode()) return false;
  const uint64_t now = os::now_ms();
  if (!force && now - heap->sparse_pass_ms < kSparsePassMs) return false;
  // A heap that saw no pass for that long was parked, or its thread slept: its heads' idle
  // time counts from now, not from before a new thread adopted it.
  const bool heads_restart = now - heap->sparse_pass_ms >= kSparseHeadIdleMs;
  heap->sparse_pass_ms = now;
  const uint64_t delay_ms = uint64_t(option(Option::kSparseDelayMs));
  bool released = false;
  GiveBack give_back;
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    // A class whose head page changed since the last pass is still growing through its queue:
    // its head reaches the sparse pages soon and would fault back in whatever went (thread
    // churn, where each new thread adopts the pages of one that ended, lost a page fault per
    // OS page so). Only a class that went quiet gives its sparse pages back: quiet since the
    // last pass, or for sparse_delay_ms if that is longer.
    Page* const head = heap->direct[c];
    if (head->warm || heads_restart) heap->sparse_class_busy_ms[c] = now;
    const bool class_busy =
        (head->warm || now - heap->sparse_class_busy_ms[c] < delay_ms) && !force;
    // The page allocated from stays as it is while its class uses it. Once it is idle it can
    // hold most of what the class leaves behind: a class of 16 KiB and more has a head of
    // 128 KiB to 1 MiB (8 blocks), and the soak's heaps kept 8 MiB of them, nearly empty,
    // through every phase after the one that used them.
    if (head->free != heap->sparse_head_free[c] || heads_restart) {
      heap->sparse_head_free[c] = head->free;
      heap->sparse_head_since_ms[c] = now;
    }
    const bool head_idle = force || now - heap->sparse_head_since_ms[c] >= kSparseHeadIdleMs;
    for (Page* page = heap->queues[c].head; page != nullptr; page = page->next) {
      // Empty pages kept for reuse stay as they are; a page that was allocated from since the
      // last pass may be again soon.
      const bool warm = page->warm;
      page->warm = false;
      if ((page == head && !head_idle) || page->retained || ((warm || class_busy) && !force))
        continue;
      if (!force && !worth_a_look(page, g)) continue;
      page->scrubbed_used = uint16_t(page->used);
      released |= scrub_page(page, g, give_back);
    }
    heap->sparse_head_free[c] = head->free;
  }
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

// Nearly every page never gave an OS page back: a look at its words, before a set is built
// (that cost the mixed batch benchmark 0.8 instructions per pair in sparse_refill).
bool any_given_back(const Page* page) {
  const uint16_t* words = purged_words(page);
  uint16_t given_back = 0;
  for (unsigned u = 0; u < page->unit_count; ++u) given_back = uint16_t(given_back | words[u]);
  return given_back != 0;
}

}  // namespace

bool sparse_refill(Page* page) {
  if (!any_given_back(page)) return false;
  const Geometry g = geometry();
  if (g.per_unit == 0) return false;
  bool any;
  const OsPageSet purged = load_purged(page, g, &any);
  if (!any) return false;
  if (kReleaseChecks) check_given_back_untouched(page, g, purged);
  const size_t block_bytes = page->block_bytes;
  for (size_t i = page->capacity; i-- > 0;) {
    if (!overlaps(purged, i, block_bytes, g.os_page_shift)) continue;
    Block* block = block_at(page, i);
    block->next = page->free;
    page->free = block;
  }
  count_sub(g_totals.bytes_decommitted, purged_bytes(page, g));
  store_purged(page, g, OsPageSet{});
  page->scrubbed_used = 0;
  return true;
}

void sparse_forget(Page* page) {
  if (!any_given_back(page)) return;
  const Geometry g = geometry();
  if (g.per_unit == 0) return;
  if (kReleaseChecks) {
    bool any;
    const OsPageSet purged = load_purged(page, g, &any);
    prefetch_carved(page, g, purged, any);
    for (const Block* b = page->free; b != nullptr; b = b->next)
      check_not_given_back(page, b, g, purged);
  }
  count_sub(g_totals.bytes_decommitted, purged_bytes(page, g));
  uint16_t* words = purged_words(page);
  for (unsigned u = 0; u < page->unit_count; ++u) words[u] = 0;
}

}  // namespace tray
