// What sparse pages and big classes' free blocks gave back to the OS, private to the heap
// layer (sparse.cpp, tails.cpp): a bit per OS page of a page in its segment's header
// (Segment::sparse_purged), read and written as a set, and the ranges a pass hands to the OS.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/core.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "stats/stats.hpp"

namespace tray {

constexpr unsigned kMaxOsPagesPerUnit = 16;  // the width of Segment::sparse_purged
constexpr size_t kMaxOsPagesPerPage = kUnitsPerSegment * kMaxOsPagesPerUnit;

template <size_t kBits>
class BitSet {
 public:
  void set(size_t i) { words_[i / 64] |= uint64_t{1} << (i % 64); }
  bool test(size_t i) const { return (words_[i / 64] >> (i % 64)) & 1; }
  // Fewer than 64 bits from `first`, within the word that holds it.
  void put_bits(size_t first, uint64_t value) { words_[first / 64] |= value << (first % 64); }
  uint64_t bits(size_t first, unsigned count) const {
    return (words_[first / 64] >> (first % 64)) & ((uint64_t{1} << count) - 1);
  }
  // Set operations on the bits under `end`.
  void add(const BitSet& other, size_t end) {
    for (size_t w = 0; w * 64 < end; ++w) words_[w] |= other.words_[w];
  }
  void remove(const BitSet& other, size_t end) {
    for (size_t w = 0; w * 64 < end; ++w) words_[w] &= ~other.words_[w];
  }
  // Ranges a word at a time: a page of 16-byte blocks has 256 of them on each OS page.
  void set_range(size_t first, size_t last) {  // inclusive
    for (size_t w = first / 64; w <= last / 64; ++w) words_[w] |= mask(w, first, last);
  }
  void clear_range(size_t first, size_t last) {  // inclusive
    for (size_t w = first / 64; w <= last / 64; ++w) words_[w] &= ~mask(w, first, last);
  }
  bool all_in(size_t first, size_t last) const {  // inclusive
    for (size_t w = first / 64; w <= last / 64; ++w)
      if ((words_[w] & mask(w, first, last)) != mask(w, first, last)) return false;
    return true;
  }
  // Every set bit under `end`, in order.
  template <typename Visit>
  void for_each(size_t end, Visit visit) const {
    for (size_t w = 0; w * 64 < end; ++w)
      for (uint64_t word = words_[w]; word != 0; word &= word - 1) {
        const size_t i = w * 64 + size_t(std::countr_zero(word));
        if (i >= end) return;
        visit(i);
      }
  }

 private:
  // The bits of word `w` that lie in [first, last].
  static uint64_t mask(size_t w, size_t first, size_t last) {
    const uint64_t from = w == first / 64 ? ~uint64_t{0} << (first % 64) : ~uint64_t{0};
    const uint64_t to = w == last / 64 ? ~uint64_t{0} >> (63 - last % 64) : ~uint64_t{0};
    return from & to;
  }

  static constexpr size_t kWords = kBits / 64;
  uint64_t words_[kWords] = {};
};
using OsPageSet = BitSet<kMaxOsPagesPerPage>;

struct Geometry {
  size_t os_page;
  unsigned os_page_shift;  // a shift, not a division, in loops over a page's lines
  unsigned per_unit;       // OS pages per unit
};

// 0 OS pages per unit where they do not fit the header's 16 bits (pages under 4 KiB).
inline Geometry geometry() {
  const size_t os_page = os::page_size();
  const size_t per_unit = kUnitBytes / os_page;
  return {os_page, floor_log2(os_page), per_unit <= kMaxOsPagesPerUnit ? unsigned(per_unit) : 0};
}

inline uint16_t* purged_words(const Page* page) {
  Segment* segment = segment_of(page);
  return &segment->sparse_purged[page - segment->pages];
}

// A unit's OS pages are a power of two of at most 16, so a unit's bits never straddle two
// words of the set.
inline OsPageSet load_purged(const Page* page, Geometry g, bool* any) {
  OsPageSet set;
  uint16_t all = 0;
  const uint16_t* words = purged_words(page);
  for (unsigned u = 0; u < page->unit_count; ++u) {
    set.put_bits(u * g.per_unit, words[u]);
    all = uint16_t(all | words[u]);
  }
  *any = all != 0;
  return set;
}

inline void store_purged(Page* page, Geometry g, const OsPageSet& set) {
  uint16_t* words = purged_words(page);
  uint16_t any = 0;
  for (unsigned u = 0; u < page->unit_count; ++u) {
    const auto word = uint16_t(set.bits(u * g.per_unit, g.per_unit));
    words[u] = word;
    any = uint16_t(any | word);
  }
  page->given_back = any != 0;
}

inline size_t purged_bytes(const Page* page, Geometry g) {
  size_t count = 0;
  const uint16_t* words = purged_words(page);
  for (unsigned u = 0; u < page->unit_count; ++u) count += popcount64(words[u]);
  return count * g.os_page;
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

}  // namespace tray
