// Span blocks a thread keeps for itself. A thread that frees a block of hundreds of KiB and
// then asks for one of about its size gets it back without its arena's lock: threads that each
// replace such blocks took turns at that lock for every allocation and free, and the one that
// waited slept (span.hpp). Each heap holds a SpanCache (heap/types.hpp); the heap layer hands the
// span layer its thread's, and the purger, trim and statistics reach every heap's through a
// list of their own, so the span layer needs nothing from the heaps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <atomic>

#include "core/core.hpp"
#include "segment/segment.hpp"
#include "span/config.hpp"

namespace tray {

// The span blocks one thread freed and keeps for its own next requests (span_cache.cpp). Only
// the owner puts a block in; the owner, to use it, and the purger or a trim, to give it back,
// take one out atomically (the owner with a compare-and-swap, the others with an exchange), so
// a block in a slot belongs to whichever took it.
struct alignas(kCacheLineBytes) SpanCache {
  // A kept block: its header's address, with its run's pages in the low 12 bits (the header is
  // page-aligned) and its touched pages from bit 48 (user addresses stay under 2^47); 0: none.
  std::atomic<uint64_t> slots[kSpanCacheBlocks] = {};
  // The owner's last span request (written by it alone): once kSpanIdleMs have passed, the
  // purger gives its blocks back.
  std::atomic<uint64_t> last_request_ms{0};
  // owner: when it last found arenas' locks held often enough to keep blocks (0: never), and
  // how many times it found one held since contention_since_ms (span_cache_contended).
  uint64_t contended_ms = 0;
  uint64_t contention_since_ms = 0;
  uint32_t contentions = 0;
  uint32_t put_serial[kSpanCacheBlocks] = {};  // owner: when each slot was filled, in puts
  uint32_t puts = 0;                     // owner
  SpanCache* next_registered = nullptr;  // every heap's cache, newest first; never unlinked
};

// The calling thread's cache; nullptr for threads without a heap and in debug mode.
extern __thread SpanCache* tls_span_cache;

// Puts a new heap's cache on the list the purger and trim walk (the heaps lock held).
void span_cache_register(SpanCache* cache);
// The calling thread's cache from now on, or none (nullptr), its blocks given back first.
void span_cache_attach(SpanCache* cache);
// A kept block of the calling thread's that a run of `run_pages` may be (see span_run_fits),
// taken out; nullptr if none. Notes the request for kSpanIdleMs.
LargeHeader* span_cache_take(size_t run_pages, uint64_t now_ms);
// The calling thread found an arena's lock held. Often enough (kSpanCacheContentions within
// kSpanCacheContendedMs), and it keeps blocks for the next kSpanCacheContendedMs.
void span_cache_contended(uint64_t now_ms);
// Keeps a freed block in the calling thread's cache, giving the oldest back to its arena to
// make room; false, and nothing done, if the block is not one to keep (too long or too
// touched, no cache, no span requested for kSpanIdleMs, or no other thread met at an arena's
// lock for kSpanCacheContendedMs while other threads asked for spans within kSpanIdleMs).
bool span_cache_put(LargeHeader* header, uint64_t now_ms);
// Every thread's kept blocks back to their arenas (trim).
void span_cache_flush_all();
// The purger's pass: the blocks of threads that asked for no span for kSpanIdleMs go back to
// their arenas. Returns when the next ones will be due (kNeverMs: none kept).
uint64_t span_cache_expire(uint64_t now_ms);
// Blocks kept in every thread's cache, and their touched bytes (for statistics; racy).
void span_cache_usage(size_t* blocks, size_t* touched_bytes);

}  // namespace tray
