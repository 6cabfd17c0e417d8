#include "large/large.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>

#include "core/core.hpp"
#include "large/config.hpp"
#include "large/large_cache.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "span/span.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

char* base_of(const LargeHeader* header) {
  return reinterpret_cast<char*>(const_cast<LargeHeader*>(header));
}

// Gives back the touched pages past `keep_bytes`. If the kernel refuses, they stay counted as
// touched: a later calloc must not take them for zero.
void purge_tail(LargeHeader* header, size_t keep_bytes) {
  if (!os::purge(base_of(header) + keep_bytes, header->dirty_bytes - keep_bytes)) return;
  count_add(g_totals.bytes_purged, header->dirty_bytes - keep_bytes);
  large_set_dirty_bytes(header, keep_bytes);
}

// The touched pages past the ends of live blocks (tail_of), which trim_tail bounds.
std::atomic<size_t> g_live_tail_bytes{0};

// What a live block's mapping keeps touched past the block's end; none for a span block, whose
// run is at most an eighth longer than the block.
size_t tail_of(const LargeHeader* header) {
  if (header->magic != kLargeMagic || header->dirty_bytes <= header->used_bytes) return 0;
  return header->dirty_bytes - header->used_bytes;
}

// Counts a live block's tail in (`in`) or out. Most blocks have none: the shared counter is
// left alone then, rather than bounced between the cores of threads that allocate spans.
void count_tail(const LargeHeader* header, bool in) {
  if (const size_t tail = tail_of(header); tail != 0) {
    if (in) g_live_tail_bytes.fetch_add(tail, std::memory_order_relaxed);
    else g_live_tail_bytes.fetch_sub(tail, std::memory_order_relaxed);
  }
}

// A block that reuses a mapping touched further keeps the touched pages past its end, for the
// next bigger block that reuses the mapping, while they are at most 1/kLargeCacheFitRatio of
// the block and, with the tails live blocks keep already, at most 1/kLargeTailLiveRatio of the
// live large bytes; past either, they go back now. The second bound is on the program's peak:
// when its large blocks are all live, what their mappings hold beyond them is resident for
// nothing (large_realloc: 6.5 MiB over 81.5 MiB live, its peak RSS 9.5% above glibc's).
// A span block's run is at most 1/8 longer than the block (span_run_pages): its touched tail
// stays.
void trim_tail(LargeHeader* header, size_t used_bytes) {
  if (header->magic != kLargeMagic || header->dirty_bytes <= used_bytes) return;
  const size_t tail = header->dirty_bytes - used_bytes;
  if (tail > used_bytes / kLargeCacheFitRatio ||
      g_live_tail_bytes.load(std::memory_order_relaxed) + tail >
          g_totals.bytes_large.load(std::memory_order_relaxed) / kLargeTailLiveRatio)
    purge_tail(header, used_bytes);
}

// Moves the pages of a reservation onto `target`, grown to new_bytes: in one call, else a
// chunk at a time, since a reservation made of joined mappings is several kernel mappings
// (meeting at chunk boundaries) that the kernel will not move in one. It used to be copied
// then: large_realloc copied a 12..20 MiB buffer in four of its six rounds.
bool move_reservation(LargeHeader* header, size_t old_bytes, size_t new_bytes, void* target) {
  return os::remap_to(header, old_bytes, new_bytes, target) ||
         os::remap_pieces_to(header, old_bytes, new_bytes, target, kSegmentBytes);
}

// Joins `upper`, a mapping out of the cache that lies right after `header`, to it. The dirty
// count becomes an upper bound, as in cache_coalesce.
void join_upper(LargeHeader* header, LargeHeader* upper) {
  const size_t upper_dirty = upper->dirty_bytes;
  const size_t old_reserve = header->reserve_bytes;
  header->dirty_bytes += upper_dirty;  // moved, not new: the totals stay
  upper->dirty_bytes = 0;
  large_set_dirty_bytes(header, old_reserve + upper_dirty);
  header->reserve_bytes = old_reserve + upper->reserve_bytes;
  chunk_map_set(header, header->reserve_bytes, true);
}

// Moves the pages of a cached mapping onto the part of `header`'s reservation past
// `old_reserve`, which growing it has just added and nothing has touched: the block grows
// into pages that are resident already instead of faulting in fresh ones, and the cache gives
// up pages it would otherwise keep beside the grown block (page tables move, the bytes do
// not). Touched pages past the block's `used_bytes` are kept as a reused mapping's are. Nothing
// changes if the cache has no mapping with touched pages to give, or the kernel refuses the
// move.
void fill_from_cache(LargeHeader* header, size_t old_reserve, size_t used_bytes) {
  const size_t room = header->reserve_bytes - old_reserve;
  LargeHeader* cached = large_cache_take(room);
  if (cached == nullptr) return;
  const size_t bytes = cached->reserve_bytes;
  const size_t moved_dirty = cached->dirty_bytes;
  bool moved = false;
  if (bytes <= room && moved_dirty > os::page_size()) {
    // Cleared before the move, as in grow_reservation; the target range was marked for
    // `header` when it grew.
    chunk_map_clear(cached, bytes);
    moved = move_reservation(cached, bytes, bytes, base_of(header) + old_reserve);
    if (!moved) chunk_map_set(cached, bytes, true);
  }
  if (!moved) {
    large_cache_put(cached, 0);
    return;
  }
  // Its header went with its pages and now lies inside the block: nothing reads it again.
  count_sub(g_totals.bytes_mapped, bytes);
  header->dirty_bytes += moved_dirty;  // moved, not new: the totals stay
  large_set_dirty_bytes(header, old_reserve + moved_dirty);
  if (header->dirty_bytes > used_bytes + used_bytes / kLargeCacheFitRatio)
    purge_tail(header, used_bytes);
}

// Grows the reservation of `header` to hold used_bytes (in whole chunks): by joining the cached
// mapping right after it (no system call), in place if the address space after it is free,
// else by moving its pages onto a fresh reservation (page tables move, the bytes do not); what
// growing added is then filled from the cache. The header where it now lies, or nullptr
// (nothing changed) if the OS refuses. `alignment` is the block's.
LargeHeader* grow_reservation(LargeHeader* header, size_t used_bytes, size_t alignment) {
  const size_t new_reserve = align_up(used_bytes, kSegmentBytes);
  const size_t old_reserve = header->reserve_bytes;
  const size_t extra = new_reserve - old_reserve;
  if (LargeHeader* upper = large_cache_take_at(base_of(header) + old_reserve, extra)) {
    join_upper(header, upper);
    return header;
  }
  // Only the last chunk is named to the kernel: it lies in the last of the kernel's mappings
  // that a joined reservation is made of (they meet at chunk boundaries), which is the one to
  // grow, and naming the whole range would fail for a joined one.
  char* last_chunk = base_of(header) + old_reserve - kSegmentBytes;
  if (os::remap_in_place(last_chunk, kSegmentBytes, kSegmentBytes + extra)) {
    chunk_map_set(header, new_reserve, true);
  } else {
    void* target = os::reserve_aligned(new_reserve, std::max(alignment, kSegmentBytes));
    if (target == nullptr) return nullptr;
    // Cleared before the move: once the old range is free, another thread may map it and
    // mark it in the chunk map, and a clear after the move would unmark that thread's block.
    chunk_map_clear(header, old_reserve);
    if (!move_reservation(header, old_reserve, new_reserve, target)) {
      chunk_map_set(header, old_reserve, true);
      os::unmap(target, new_reserve);
      return nullptr;
    }
    header = static_cast<LargeHeader*>(target);
    chunk_map_set(header, new_reserve, true);
  }
  header->reserve_bytes = new_reserve;
  count_add(g_totals.bytes_mapped, new_reserve);
  count_sub(g_totals.bytes_mapped, old_reserve);
  fill_from_cache(header, old_reserve, used_bytes);
  return header;
}

}  // namespace

void* large_alloc(size_t size, size_t alignment, bool zero) {
  TRAY_ASSERT(is_pow2(alignment));
  if (size > kMaxRequestBytes || alignment > kMaxAlignmentBytes) return nullptr;
  // The header sits at the mapping's start; the block starts at the first suitably aligned
  // address after it (for alignments of a segment or more, the mapping itself is aligned so).
  const size_t offset = alignment <= kLargeHeaderBytes ? kLargeHeaderBytes : alignment;
  // At least one byte: a block of size 0 aligned to the whole reservation would otherwise
  // start at its end, in the next chunk, which the allocator does not own.
  const size_t used_bytes = align_up(offset + std::max<size_t>(size, 1), os::page_size());
  const size_t map_alignment = alignment > kSegmentBytes ? alignment : kSegmentBytes;
  // As if none of it were resident yet: near the limit, giving back purges what is cached.
  if (!limit_admit(used_bytes)) return nullptr;
  LargeHeader* header = nullptr;
  // A run starts on a page: alignments up to a page (debug mode's) need no more.
  if (alignment <= kOsPageBytes && used_bytes <= kSpanMaxBytes) header = span_alloc(used_bytes);
  else if (map_alignment == kSegmentBytes) header = large_cache_take(used_bytes);
  if (header != nullptr && header->reserve_bytes < used_bytes) {
    LargeHeader* grown = grow_reservation(header, used_bytes, alignment);
    // What it held stays cached for another request; this one gets a fresh mapping.
    if (grown == nullptr) large_cache_put(header, 0);
    header = grown;
  }
  if (header != nullptr) {
    // Reused: only what it touched before can hold old data; the rest still reads as zero.
    trim_tail(header, used_bytes);
    if (zero && header->dirty_bytes > offset)
      std::memset(base_of(header) + offset, 0, std::min(size, header->dirty_bytes - offset));
    large_set_dirty_bytes(header, std::max(header->dirty_bytes, used_bytes));
  } else {
    const size_t reserve_bytes = align_up(used_bytes, kSegmentBytes);
    header = static_cast<LargeHeader*>(os::map_aligned(reserve_bytes, map_alignment));
    if (header == nullptr) return nullptr;
    thp_advise_large(header, reserve_bytes);
    header->magic = kLargeMagic;
    header->reserve_bytes = reserve_bytes;
    header->dirty_bytes = 0;
    large_set_dirty_bytes(header, used_bytes);
    chunk_map_set(header, reserve_bytes, true);
    count_add(g_totals.bytes_mapped, reserve_bytes);
  }
  header->used_bytes = used_bytes;
  header->prof_sampled = 0;  // a header cut from a cached mapping lies on old block bytes
  header->alignment_shift = uint8_t(std::countr_zero(alignment));
  header->owner = nullptr;
  header->user = base_of(header) + offset;
  header->requested = size;
  count_tail(header, true);
  count_add(g_totals.large_allocations, 1);
  count_add(g_totals.bytes_large, large_usable_size(header));
  count_max(g_totals.bytes_large_peak, g_totals.bytes_large.load(std::memory_order_relaxed));
  segment_large_grew();
  return header->user;
}

LargeHeader* large_mapping_of(const void* p, uint8_t chunk_kind) {
  if (chunk_kind < kChunkLarge || chunk_kind >= kChunkGuard) return nullptr;
  const uintptr_t chunk = align_down(reinterpret_cast<uintptr_t>(p), kSegmentBytes);
  auto* header =
      reinterpret_cast<LargeHeader*>(chunk - size_t(chunk_kind - kChunkLarge) * kSegmentBytes);
  if (header->magic == kSpanChunkMagic) return span_block_of(header, p);
  TRAY_CHECK(header->magic == kLargeMagic || header->magic == kSpanBlockMagic);
  return header;
}

size_t large_usable_size(const LargeHeader* header) {
  return size_t(base_of(header) + header->used_bytes - static_cast<char*>(header->user));
}

// p's offset from the start of header's mapping, or 0 where that is not below 4 GiB.
uint32_t offset_in_mapping(const LargeHeader* header, const void* p) {
  const size_t offset = size_t(static_cast<const char*>(p) - base_of(header));
  return offset <= UINT32_MAX ? uint32_t(offset) : 0;
}

void large_free(LargeHeader* header) {
  if (header->owner != nullptr) large_disown(header);
  const size_t usable = large_usable_size(header);
  count_sub(g_totals.bytes_large, usable);
  count_add(g_totals.large_frees, 1);
  header->freed_offset = offset_in_mapping(header, header->user);
  header->user = nullptr;  // a second free of the block no longer finds it
  count_tail(header, false);
  if (header->magic == kSpanBlockMagic) span_free(header);
  else large_cache_put(header, usable);
}

void large_retire(LargeHeader* header, void* user) {
  if (header->owner != nullptr) large_disown(header);
  count_sub(g_totals.bytes_large, size_t(base_of(header) + header->used_bytes - static_cast<char*>(user)));
  count_add(g_totals.large_frees, 1);
  header->freed_offset = offset_in_mapping(header, user);
  header->user = nullptr;
  count_tail(header, false);
  const size_t header_bytes = os::page_size();
  os::protect_none(base_of(header) + header_bytes, header->reserve_bytes - header_bytes);
  large_set_dirty_bytes(header, header_bytes);
}

void large_unmap_retired(LargeHeader* header) {
  if (header->magic != kSpanBlockMagic) return large_unmap_mapping(header);
  // Its pages go back to the chunk for other blocks, readable again and purged (a retired
  // block's pages count as not resident, see large_retire). Pages the kernel leaves
  // inaccessible cannot serve a block: they stay out of use.
  const size_t header_bytes = os::page_size();
  char* rest = base_of(header) + header_bytes;
  if (!os::protect_read_write(rest, header->reserve_bytes - header_bytes)) return;
  os::purge(rest, header->reserve_bytes - header_bytes);
  span_free(header);
}

void* large_resize(LargeHeader* header, size_t new_size) {
  if (new_size > kMaxRequestBytes) return nullptr;
  const size_t offset = size_t(static_cast<char*>(header->user) - base_of(header));
  const size_t old_used = header->used_bytes;
  const size_t new_used = align_up(offset + new_size, os::page_size());
  const size_t old_usable = large_usable_size(header);
  const size_t old_reserve = header->reserve_bytes;
  if (new_used > old_used && !limit_admit(new_used - old_used)) return nullptr;
  // Out of the total while it changes, so that trim_tail, if growing calls it, sees the others.
  count_tail(header, false);
  if (header->magic == kSpanBlockMagic) {
    // Pages past the end go back to the chunk; growth takes the free pages after the block, or
    // the caller moves it (past kSpanMaxBytes, into a mapping of its own).
    if (new_used <= old_reserve) span_shrink(header, new_used);
    else if (new_used > kSpanMaxBytes || !span_grow(header, new_used)) return nullptr;
  } else if (new_used <= old_reserve) {
    // Inside the reservation: no system call to grow. A tail that shrinking leaves behind goes
    // back to the OS when it is most of the block.
    if (new_used <= old_used / 2) purge_tail(header, new_used);
  } else {
    LargeHeader* grown = grow_reservation(header, new_used, size_t{1} << header->alignment_shift);
    if (grown == nullptr) {
      count_tail(header, true);
      return nullptr;
    }
    header = grown;
    header->user = base_of(header) + offset;
  }
  header->used_bytes = new_used;
  large_set_dirty_bytes(header, std::max(header->dirty_bytes, new_used));
  header->requested = new_size;
  count_tail(header, true);
  count_add(g_totals.bytes_large, large_usable_size(header));
  count_sub(g_totals.bytes_large, old_usable);
  count_max(g_totals.bytes_large_peak, g_totals.bytes_large.load(std::memory_order_relaxed));
  if (header->owner != nullptr) large_owner_resized(header, old_usable);
  return header->user;
}

void large_report_bad_free(const char* op, const LargeHeader* header, const void* p) {
  char storage[384];
  TextBuffer text(storage, sizeof storage);
  text.str("traymalloc: ");
  const bool is_free = op[0] == 'f';
  const auto* address = static_cast<const char*>(p);
  const char* user = header != nullptr ? static_cast<const char*>(header->user) : nullptr;
  const char* end = header != nullptr ? base_of(header) + header->used_bytes : nullptr;
  if (header != nullptr && user == nullptr && header->freed_offset != 0 &&
      header->freed_offset == offset_in_mapping(header, p)) {
    text.str(is_free ? "double free of " : "realloc of freed block ").ptr(p).str(" (large block)\n");
  } else if (user != nullptr && address > user && address < end) {
    text.str(op).str(" of invalid pointer ").ptr(p).str(": not the start of a block (");
    text.count(size_t(address - user), "byte", "bytes").str(" into large block ").ptr(user);
    text.str(" of ").count(size_t(end - user), "byte", "bytes").str(")\n");
  } else {
    // A span block's pages go back to its chunk at once, its header with them.
    text.str(op).str(" of invalid pointer ").ptr(p);
    text.str(": no live block starts there (freed already, or never allocated)\n");
  }
  fatal_misuse(text);
}

}  // namespace tray
