// The unit map's writers, for the segment pool (segment.cpp); its readers and the chunk map
// are in segment.hpp.
#pragma once

#include "segment/types.hpp"

namespace tray {

// Units [first, first + count) of s belong to `page` (nullptr: the segment is going away).
void unit_map_set(const Segment* s, unsigned first, unsigned count, const Page* page);
// A new segment's leaf of the unit map, mapped if it is the first segment in its range; false
// if the OS refused. The leaf is published before the segment's entries are written, and a
// lookup of an address in the segment comes after the program got a block there.
bool unit_map_prepare(const Segment* s);

}  // namespace tray
