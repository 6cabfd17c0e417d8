// The big classes' pass over their pages (tails.cpp), which sparse_pass (sparse.cpp) makes
// too: private to the heap layer.
#pragma once

#include <cstdint>

#include "heap/os_pages.hpp"
#include "heap/types.hpp"

namespace tray {

enum class TailsPass : uint8_t {
  kWhenDue,  // the tails of pages idle for the purge delay, and the oldest past the budget
  kAll,      // every free block's tail (a trim, a heap no thread holds)
};
// Gives back the tails of the big classes' free blocks that are due (tails.cpp), and sets what
// the heap may free before the next pass (Heap::big_free_room). True if any went.
bool tails_pass(Heap* heap, Geometry g, uint64_t now, TailsPass which, GiveBack& give_back);

}  // namespace tray
