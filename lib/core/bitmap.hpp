// Bitmaps as arrays of 64-bit words, read and changed a word at a time: a run of hundreds of
// pages is a few words, not a loop per bit. `size` is the bitmap's length in bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/bits.hpp"

namespace tray::bitmap {

// Calls f(word, mask) for each word that bits [first, first + count) touch, with their bits in
// the mask. Inlined, with the masks of the end words computed once: as a loop that worked out
// each word's share, it took 14% of `large_threads`' instructions.
template <typename F>
TRAY_INLINE void for_words(size_t first, size_t count, F f) {
  if (count == 0) return;
  const size_t last = first + count - 1;
  uint64_t mask = ~uint64_t{0} << (first % 64);
  for (size_t w = first / 64; w < last / 64; ++w) {
    f(w, mask);
    mask = ~uint64_t{0};
  }
  f(last / 64, mask & (~uint64_t{0} >> (63 - last % 64)));
}

inline void set_range(uint64_t* bits, size_t first, size_t count, bool value) {
  if (value) for_words(first, count, [&](size_t w, uint64_t mask) { bits[w] |= mask; });
  else for_words(first, count, [&](size_t w, uint64_t mask) { bits[w] &= ~mask; });
}

inline size_t count_range(const uint64_t* bits, size_t first, size_t count) {
  size_t n = 0;
  for_words(first, count, [&](size_t w, uint64_t mask) { n += size_t(popcount64(bits[w] & mask)); });
  return n;
}

// One past the last set bit of [first, first + count); `first` if none is set.
inline size_t end_of_set(const uint64_t* bits, size_t first, size_t count) {
  size_t end = first;
  for_words(first, count, [&](size_t w, uint64_t mask) {
    if (const uint64_t set = bits[w] & mask; set != 0) end = w * 64 + 64 - size_t(__builtin_clzll(set));
  });
  return end;
}

// The first bit at or after `from` that equals `value`, or `size` if none does.
inline size_t next_with(const uint64_t* bits, size_t size, size_t from, bool value) {
  while (from < size) {
    uint64_t word = value ? bits[from / 64] : ~bits[from / 64];
    word &= ~uint64_t{0} << (from % 64);
    if (word != 0) return std::min(size, (from & ~size_t{63}) + size_t(__builtin_ctzll(word)));
    from = (from | 63) + 1;
  }
  return size;
}

// The first bit of the run of set bits that ends just before `end` (`end` itself if bit end - 1
// is clear): a scan down to the highest clear bit below it.
inline size_t run_start(const uint64_t* bits, size_t end) {
  size_t w = end / 64;
  uint64_t clear = end % 64 == 0 ? 0 : ~bits[w] & ((uint64_t{1} << (end % 64)) - 1);
  while (clear == 0) {
    if (w == 0) return 0;
    clear = ~bits[--w];
  }
  return w * 64 + 64 - size_t(__builtin_clzll(clear));
}

// Calls f(first, count) for each run of set bits in order, a word at a time, until f returns
// true; true if one did. Bits past `size` must be clear.
template <typename F>
bool for_each_run(const uint64_t* bits, size_t size, F f) {
  size_t run = 0;  // set bits in a row that end where the walk is
  for (size_t w = 0; w < (size + 63) / 64; ++w) {
    const uint64_t word = bits[w];
    if (word == ~uint64_t{0}) {
      run += 64;
      continue;
    }
    for (unsigned pos = 0; pos < 64;) {
      // ~(word >> pos) has its top `pos` bits set, so it is not zero.
      const unsigned ones = unsigned(__builtin_ctzll(~(word >> pos)));
      run += ones;
      pos += ones;
      if (pos == 64) break;
      if (run != 0 && f(w * 64 + pos - run, run)) return true;
      run = 0;
      const uint64_t rest = word >> pos;  // bit 0 clear
      if (rest == 0) break;
      pos += unsigned(__builtin_ctzll(rest));
    }
  }
  return run != 0 && f(size - run, run);
}

}  // namespace tray::bitmap
