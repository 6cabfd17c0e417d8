// A heap's page queues: which page each class allocates from, and the pages it keeps. Only
// the heap's owner touches them (its thread; a parked heap's collector; a program heap's
// resetter, while no thread allocates into it).
#pragma once

#include "heap/types.hpp"
#include "segment/segment.hpp"

namespace tray {

// Shared by every empty queue; never written: it has no free block, so a fast-path
// allocation that reaches it falls through to the slow path.
extern constinit Page g_empty_page;

// Points direct[c] at the queue's head, moving the head's extra count (see queue.cpp).
void queue_changed(Heap* heap, unsigned c);
// Blocks of a queued page that are live or in the heap's remote list.
uint32_t live_blocks(const Heap* heap, const Page* page);
void queue_remove(Heap* heap, Page* page);
void queue_push_front(Heap* heap, Page* page);
void queue_push_back(Heap* heap, Page* page);
// Takes an empty page out of its queue and gives it to the pool.
void release_page(Heap* heap, Page* page);
// A full page leaves its queue (floating, with a count of 1: the next free brings it back);
// a part also lists it, for a reset to find.
void page_float(Heap* heap, Page* page);
// The first free into a floating page: back at the end of its queue, with its true count.
void page_unfloat(Heap* heap, Page* page);

}  // namespace tray
