// The cache of freed large mappings (large.hpp): what it keeps, for how long, how a request
// is served from it, and the committed-bytes bookkeeping of every mapping, which its splits
// and joins move around. The blocks themselves (placement, growth, realloc) are large.cpp's.
#pragma once

#include <cstddef>

#include "segment/segment.hpp"

namespace tray {

// Sets the touched bytes of a mapping, which the statistics call committed, keeping the total
// in step.
void large_set_dirty_bytes(LargeHeader* header, size_t bytes);
// Gives a mapping (cached, evicted or retired) back to the OS.
void large_unmap_mapping(LargeHeader* header);

// The cached mapping to serve `used_bytes`: the smallest reservation that holds it, cut down
// to what the block needs; else the one with the most touched pages, for the caller to grow.
// nullptr if the cache is empty.
LargeHeader* large_cache_take(size_t used_bytes);
// Caches a freed mapping (`usable`: the block's bytes, live until now), or evicts it if it is
// more than the cache may hold.
void large_cache_put(LargeHeader* header, size_t usable);
// The cached mapping that starts at `address`, cut down to `bytes`, if it holds at least that
// many; nullptr if there is none.
LargeHeader* large_cache_take_at(const char* address, size_t bytes);

}  // namespace tray
