// The geometry every layer agrees on: how the address space is cut into segments and units,
// and the bounds of what a request may ask for. Tunables of one layer live in that layer's
// config.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tray {

// Address space comes from the OS in segments of this size, aligned to it, so that masking a
// pointer finds its segment header. A chunk is the same size: the chunk map has one entry per
// segment-sized, segment-aligned piece of the address space.
inline constexpr unsigned kSegmentShift = 22;
inline constexpr size_t kSegmentBytes = size_t{1} << kSegmentShift;  // 4 MiB

// A segment is cut into units; a page (slab) of one size class is a run of whole units.
inline constexpr unsigned kUnitShift = 16;
inline constexpr size_t kUnitBytes = size_t{1} << kUnitShift;        // 64 KiB
inline constexpr size_t kUnitsPerSegment = kSegmentBytes / kUnitBytes; // 64; unit 0 is the header

// Largest user-visible address the chunk map covers: user space ends at 2^47 on x86-64, and
// at 2^48 on AArch64 kernels with 48-bit VAs (Graviton's and Ampere's), which put mappings
// just below it; there the chunk map takes 64 MiB of address space instead of 32.
#if defined(__aarch64__)
inline constexpr unsigned kAddressBits = 48;
#else
inline constexpr unsigned kAddressBits = 47;
#endif

// Every block is aligned to this (the smallest class is 16 bytes); larger
// alignments need a class whose size is a multiple of them, or a large block.
inline constexpr size_t kNaturalAlignment = 16;

// Requests above this are refused with ENOMEM before any arithmetic can overflow.
inline constexpr size_t kMaxRequestBytes = size_t{1} << 46;
// Largest alignment accepted by the aligned entry points (mirrors TRAY_MAX_ALIGNMENT).
inline constexpr size_t kMaxAlignmentBytes = size_t{1} << 29;

inline constexpr size_t kCacheLineBytes = 64;

}  // namespace tray
