// Runs of free units in segments, for the pool (segment.cpp), which holds its lock around
// every call: private to the segment layer.
#pragma once

#include <cstdint>

#include "segment/types.hpp"

namespace tray {

inline constexpr uint64_t kUsableUnits = ~uint64_t{1};  // unit 0 holds the header

// Bits first .. first + count - 1.
inline uint64_t run_mask(unsigned first, unsigned count) {
  return (count == 64 ? ~uint64_t{0} : ((uint64_t{1} << count) - 1)) << first;
}
// Every bit of `bits` that starts `count` consecutive set bits (count >= 1).
uint64_t run_starts(uint64_t bits, unsigned count);
// Lowest start of `count` consecutive set bits in `bits`, or -1.
int find_run(uint64_t bits, unsigned count);
// The first run of `units` free units of an empty segment, dirty ones first.
int first_fit(const Segment* s, unsigned units);
// Where a page of `units` units goes among the segments with free units (`partial`, linked
// through Segment::next): *found and *first; *clean when all of it would fault in. False if
// no segment has such a run.
bool find_units(Segment* partial, unsigned units, Segment** found, int* first, bool* clean);

}  // namespace tray
