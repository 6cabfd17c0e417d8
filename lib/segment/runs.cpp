#include "segment/runs.hpp"

#include <bit>

#include "core/core.hpp"
#include "platform/platform.hpp"

namespace tray {

// The starts of `count` consecutive set bits: each step doubles the length the set bits
// stand for (at most `count` - 1 more), so a run of 56 units takes 6 steps, not 55: a big
// page's search looks at every segment with free units, under the pool lock.
uint64_t run_starts(uint64_t bits, unsigned count) {
  uint64_t starts = bits;
  for (unsigned have = 1; have < count && starts != 0;) {
    const unsigned step = have < count - have ? have : count - have;
    starts &= starts >> step;
    have += step;
  }
  return starts;
}

int find_run(uint64_t bits, unsigned count) {
  const uint64_t starts = run_starts(bits, count);
  return starts == 0 ? -1 : std::countr_zero(starts);
}

int first_fit(const Segment* s, unsigned units) {
  int first = find_run(s->free_units & s->dirty_units, units);
  if (first < 0) first = find_run(s->free_units, units);
  TRAY_CHECK(first >= 1);
  return first;
}

namespace {

// A page of a big class (20..56 units) takes the run whose units hold the most resident
// memory: a freed big page leaves dirty only the units its blocks touched (segment_return_page),
// so a run of them is seldom all dirty. *clean: what was found would all fault in.
bool find_big_units(Segment* partial, unsigned units, Segment** found, int* first, bool* clean) {
  int best_dirty = -1;
  for (Segment* s = partial; s != nullptr; s = s->next) {
    for (uint64_t starts = run_starts(s->free_units, units); starts != 0; starts &= starts - 1) {
      const auto start = unsigned(std::countr_zero(starts));
      const int dirty = popcount64(s->dirty_units & run_mask(start, units));
      if (dirty > best_dirty) {
        best_dirty = dirty;
        *found = s;
        *first = int(start);
        if (dirty == int(units)) break;  // none can hold more
      }
    }
    if (best_dirty == int(units)) break;
  }
  *clean = best_dirty == 0;
  return best_dirty >= 0;
}

}  // namespace

// Dirty units first: reusing them costs no page faults. *clean: what was found would all
// fault in. A page of the other classes (16 units at most) goes into a segment that holds
// pages already before it cuts into an empty one, which a big class's page needs nearly whole.
bool find_units(Segment* partial, unsigned units, Segment** found, int* first, bool* clean) {
  if (units > kUnitsPerSegment / 4) return find_big_units(partial, units, found, first, clean);
  for (int pass = 0; pass < 2; ++pass) {
    Segment* empty = nullptr;
    int empty_start = -1;
    for (Segment* s = partial; s != nullptr; s = s->next) {
      const uint64_t candidates = pass == 0 ? (s->free_units & s->dirty_units) : s->free_units;
      const int start = find_run(candidates, units);
      if (start < 0) continue;
      if (s->free_units == kUsableUnits) {
        if (empty == nullptr) {
          empty = s;
          empty_start = start;
        }
        continue;
      }
      *found = s;
      *first = start;
      *clean = pass == 1;
      return true;
    }
    if (empty != nullptr) {
      *found = empty;
      *first = empty_start;
      *clean = pass == 1;
      return true;
    }
  }
  return false;
}

}  // namespace tray
