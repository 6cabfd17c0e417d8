// Filling a class's slot when it runs dry (refill.cpp), private to the heap layer: the
// common refill from the blocks freed into the class's page, sample points, and the page
// changes behind them, the queue's search for a page with blocks.
#pragma once

#include "heap/types.hpp"

namespace tray {

// Parked heaps' remote frees taken in, and their empty pages given back once due, at most
// every kPurgeDelayMs (heap.cpp): before a thread takes a page from the pool.
void heap_collect_parked_when_due();

}  // namespace tray
