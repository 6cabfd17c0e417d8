// Size classes: the table of block sizes, computed at compile time.
//
// Spacing: 16-byte steps from 16 B to 128 B, then four classes per doubling up to
// kMaxSmallBytes. Every class is a multiple of 16, so every block is 16-byte aligned, and every
// block holds two words: the free-list link and the free key (double-free detection). Four per
// doubling bounds the waste of a block to under 20% of it.
// Each class also fixes its page (slab) size: whole 64 KiB units, enough for at least
// kMinBlocksPerPage blocks, with at most 1/8 of the page left over at its end. The big classes
// (above kBigClassThresholdBytes) whose 8 blocks a segment cannot hold take as many as its 63
// units hold: 7 blocks of 512 KiB, 3 of 1 MiB, 1 of 2 MiB.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "size_classes/config.hpp"

namespace tray {

inline constexpr unsigned kFineStepBytes = 16;
inline constexpr unsigned kFineLimitBytes = 128;  // last class of the 16-byte steps
inline constexpr unsigned kFirstGeometricClass = kFineLimitBytes / kFineStepBytes;  // 8
inline constexpr unsigned kClassesPerDoubling = 4;
inline constexpr unsigned kGeometricDoublings =
    floor_log2(kMaxSmallBytes) - floor_log2(kFineLimitBytes);  // 128 B .. 2 MiB: 14
inline constexpr unsigned kSizeClassCount =
    kFirstGeometricClass + kGeometricDoublings * kClassesPerDoubling;  // 64
inline constexpr unsigned kMinBlocksPerPage = 8;
// Sizes up to this are mapped to a class with one table load indexed by the size...
inline constexpr size_t kLookupLimitBytes = 1024;
// ...and larger ones, up to kMaxSmallBytes, by the size in steps of this many bytes (every
// class boundary past kLookupLimitBytes is a multiple of it; checked below). The table has
// 8 KiB of entries; a program touches the lines of the sizes it asks for.
inline constexpr unsigned kCoarseStepShift = 8;
inline constexpr size_t kCoarseStepBytes = size_t{1} << kCoarseStepShift;

namespace detail {

constexpr size_t compute_class_size(unsigned c) {
  if (c < kFirstGeometricClass) return size_t{c + 1} * kFineStepBytes;
  const unsigned g = c - kFirstGeometricClass;
  const unsigned doubling = floor_log2(kFineLimitBytes) + g / kClassesPerDoubling;
  // Classes k = 0..3 of the doubling (2^d, 2^(d+1)] are (5 + k) * 2^(d-2).
  return size_t{kClassesPerDoubling + 1 + g % kClassesPerDoubling} << (doubling - 2);
}

constexpr unsigned compute_slab_units(size_t block) {
  constexpr size_t kMaxUnits = kUnitsPerSegment - 1;  // unit 0 is the segment's header
  unsigned units = unsigned(div_ceil(block * kMinBlocksPerPage, kUnitBytes));
  if (units == 0) units = 1;
  if (units > kMaxUnits) return unsigned(div_ceil(kMaxUnits * kUnitBytes / block * block, kUnitBytes));
  while ((units * kUnitBytes) % block > units * kUnitBytes / 8) ++units;
  return units;
}

// Class by arithmetic, for any size in 0..kMaxSmallBytes.
constexpr unsigned compute_class_of(size_t size) {
  if (size <= kFineStepBytes) return 0;
  if (size <= kFineLimitBytes) return unsigned(div_ceil(size, kFineStepBytes)) - 1;
  const size_t s = size - 1;
  const unsigned d = floor_log2(s);
  return kFirstGeometricClass + (d - floor_log2(kFineLimitBytes)) * kClassesPerDoubling +
         unsigned((s >> (d - 2)) & (kClassesPerDoubling - 1));
}

struct ClassTables {
  std::array<uint32_t, kSizeClassCount> block_bytes{};
  std::array<uint8_t, kSizeClassCount> slab_units{};
  std::array<uint32_t, kSizeClassCount> blocks_per_page{};
  std::array<uint8_t, kLookupLimitBytes + 1> class_of_lookup{};  // index: the size itself
  // index: the size in coarse steps, rounded up (sizes above kLookupLimitBytes)
  std::array<uint8_t, (kMaxSmallBytes >> kCoarseStepShift) + 1> class_of_coarse{};
};

constexpr ClassTables make_class_tables() {
  ClassTables t{};
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    t.block_bytes[c] = uint32_t(compute_class_size(c));
    t.slab_units[c] = uint8_t(compute_slab_units(t.block_bytes[c]));
    t.blocks_per_page[c] = uint32_t(t.slab_units[c] * kUnitBytes / t.block_bytes[c]);
  }
  for (size_t i = 0; i < t.class_of_lookup.size(); ++i)
    t.class_of_lookup[i] = uint8_t(compute_class_of(i));
  for (size_t i = 0; i < t.class_of_coarse.size(); ++i)
    t.class_of_coarse[i] = uint8_t(compute_class_of(i << kCoarseStepShift));
  return t;
}

}  // namespace detail

inline constexpr detail::ClassTables kClassTables = detail::make_class_tables();

// The first big class (160 KiB): blocks of 40 OS pages or more, in pages of 8 blocks or fewer,
// whose free blocks give back their OS pages past the first (heap/sparse.cpp).
inline constexpr unsigned kFirstBigClass = detail::compute_class_of(kBigClassThresholdBytes) + 1;
TRAY_INLINE constexpr bool is_big_class(unsigned c) { return c >= kFirstBigClass; }

constexpr size_t class_size(unsigned c) { return kClassTables.block_bytes[c]; }
constexpr unsigned class_slab_units(unsigned c) { return kClassTables.slab_units[c]; }
constexpr size_t class_slab_bytes(unsigned c) { return class_slab_units(c) * kUnitBytes; }
constexpr uint32_t class_blocks_per_page(unsigned c) { return kClassTables.blocks_per_page[c]; }

// The class for size <= kLookupLimitBytes: one table load (a 1 KiB table indexed by the size
// itself costs two instructions less than one indexed by size / 8).
TRAY_INLINE constexpr size_t size_class_lookup(size_t size) {
  return kClassTables.class_of_lookup[size];
}

// The class for kLookupLimitBytes < size <= kMaxSmallBytes: one shift and one load.
TRAY_INLINE constexpr size_t size_class_coarse(size_t size) {
  return kClassTables.class_of_coarse[(size + kCoarseStepBytes - 1) >> kCoarseStepShift];
}

// The smallest class whose blocks hold `size` bytes; size must be <= kMaxSmallBytes.
TRAY_INLINE constexpr unsigned size_class_of(size_t size) {
  if (TRAY_LIKELY(size <= kLookupLimitBytes)) return size_class_lookup(size);
  return unsigned(size_class_coarse(size));
}

// --- compile-time checks of the table -----------------------------------------------------
namespace detail {
constexpr bool classes_are_sound() {
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    const size_t size = class_size(c);
    if (c > 0 && size <= class_size(c - 1)) return false;                  // strictly increasing
    if (size % 16 != 0) return false;                                     // 16-byte alignment
    if (compute_class_of(size) != c) return false;                        // a class maps to itself
    if (compute_class_of(size + 1) != c + 1 && c + 1 < kSizeClassCount) return false;
    // At least kMinBlocksPerPage blocks, or as many as a segment holds.
    if (class_blocks_per_page(c) < kMinBlocksPerPage &&
        (class_blocks_per_page(c) + 1) * size <= (kUnitsPerSegment - 1) * kUnitBytes)
      return false;
    if (class_slab_units(c) >= kUnitsPerSegment) return false;            // fits in a segment
    if (class_blocks_per_page(c) == 0) return false;
    // Worst waste of a block: the request just above the previous class.
    if (c > kFirstGeometricClass && (size - class_size(c - 1) - 1) * 5 > size) return false;
    if (size > kLookupLimitBytes) {
      // The coarse table at both ends of the class's sizes: with every boundary a multiple of
      // the step, each size between rounds up to a step inside the class. (Every size is
      // checked by tests/core/size_classes_test.cpp; here they would take more constexpr steps
      // than clang allows by default.)
      if (size % kCoarseStepBytes != 0) return false;
      const size_t smallest = class_size(c - 1) + 1;
      if (size_class_coarse(size) != c) return false;
      if (size_class_coarse(smallest > kLookupLimitBytes ? smallest : kLookupLimitBytes + 1) != c)
        return false;
    }
  }
  return true;
}
}  // namespace detail

static_assert(detail::classes_are_sound());
static_assert(class_size(kSizeClassCount - 1) == kMaxSmallBytes);
static_assert(class_size(kFirstBigClass) == 160 * 1024 && !is_big_class(kFirstBigClass - 1));
static_assert(kSizeClassCount <= 64, "class index must fit the per-class arrays and a byte");

}  // namespace tray
