#include "span/span_index.hpp"

#include <algorithm>
#include <cstring>

#include "core/core.hpp"
#include "platform/platform.hpp"
#include "span/span.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

// Free runs by length, in bins cut at span_run_pages' lengths, so that every run in a bin
// holds a block of the bin's shortest length: each doubling above 32 pages has nine, for its
// power of two and one page and for its eight multiples of an eighth of that power. Runs of 32
// pages or less, which hold only blocks of debug mode, share bin 0, whose runs are looked
// through for one long enough.
constexpr unsigned kFirstBinShift = 5;
constexpr unsigned run_bin(size_t pages) {
  if (pages <= size_t{1} << kFirstBinShift) return 0;
  const unsigned e = floor_log2(pages - 1);
  const size_t base = size_t{1} << e;
  return 1 + 9 * (e - kFirstBinShift) + unsigned((pages - base) >> (e - 3));  // in eighths of base
}
constexpr size_t bin_pages(unsigned bin) {
  if (bin == 0) return 1;
  const size_t base = size_t{1} << (kFirstBinShift + (bin - 1) / 9);
  const size_t k = (bin - 1) % 9;
  return k == 0 ? base + 1 : base + k * (base / 8);
}
constexpr unsigned kBins = run_bin(kSpanChunkOsPages - 1) + 1;
static_assert(kBins <= 64, "a chunk's bins are the bits of one word, and SpanIndex counts 64");
static_assert(bin_pages(run_bin(33)) == 33 && bin_pages(run_bin(35)) == 33 && bin_pages(run_bin(36)) == 36 &&
              bin_pages(run_bin(64)) == 64 && bin_pages(run_bin(65)) == 65 && bin_pages(run_bin(1023)) == 960);
static_assert(run_bin(span_run_pages(500)) == run_bin(500) + 1 &&
              bin_pages(run_bin(span_run_pages(500))) == span_run_pages(500));

// For each chunk, the bins its free runs fall in, so that a search opens one chunk: one with a
// run in the smallest bin that holds the block. Walking every header (a TLB miss each, 4 MiB
// apart) cost 2.7 us a step with 300 chunks, where a block of 512 KiB was freed and another
// allocated in a loop; with an index of each chunk's longest run instead of bins, looking
// through the runs of every chunk that could hold the block for the smallest took 38% of
// `large_slots`' samples, and walking a chunk's runs after each change to learn its bins, 13%:
// each chunk counts its runs per bin (SpanChunk::bin_runs) as they come and go. Which chunk
// has a run in a bin is a bitmap per bin over the slots: a scan of the slots for the first
// with the bin took 10% of `large_threads`' samples (2 threads, 110 chunks). Slots and bitmaps
// share one mapping, grown by doubling.
size_t bitmap_words(size_t capacity) { return capacity / 64; }

uint64_t* slots_of_bin(const SpanIndex& index, unsigned b) {
  return index.bin_slots + b * bitmap_words(index.capacity);
}

void set_slot_bin(SpanIndex& index, size_t slot, unsigned b, bool in) {
  bitmap::set_range(slots_of_bin(index, b), slot, 1, in);
}

// The bins where the chunk has a free run, as a mask.
uint64_t bins_of(const SpanChunk* chunk) {
  uint64_t bins = 0;
  for (unsigned b = 0; b < kBins; ++b) bins |= uint64_t{chunk->bin_runs[b] != 0} << b;
  return bins;
}

// The chunk in `slot` gained its first run in bin b, or lost its last.
void count_bin(SpanIndex& index, size_t slot, unsigned b, bool in) {
  set_slot_bin(index, slot, b, in);
  index.bin_chunks[b] = in ? index.bin_chunks[b] + 1 : index.bin_chunks[b] - 1;
  index.bins = index.bin_chunks[b] != 0 ? index.bins | uint64_t{1} << b : index.bins & ~(uint64_t{1} << b);
}

// The chunk's first free run for which `fits` holds of its length.
template <typename Fits>
bool find_run(const SpanChunk* chunk, size_t* out_first, Fits fits) {
  return bitmap::for_each_run(chunk->free_bits, kSpanChunkOsPages, [&](size_t first, size_t length) {
    *out_first = first;
    return fits(length);
  });
}

size_t index_bytes(size_t capacity) {
  return capacity * sizeof(SpanChunk*) + kBins * bitmap_words(capacity) * sizeof(uint64_t);
}

}  // namespace

bool span_index_reserve(SpanIndex& index) {
  if (index.count < index.capacity) return true;
  const size_t capacity = std::max<size_t>(256, 2 * index.capacity);
  auto* memory = static_cast<char*>(os::map(index_bytes(capacity)));
  if (memory == nullptr) return false;
  auto* chunks = reinterpret_cast<SpanChunk**>(memory);
  auto* bin_slots = reinterpret_cast<uint64_t*>(memory + capacity * sizeof(SpanChunk*));
  if (index.chunks != nullptr) {
    std::memcpy(chunks, index.chunks, index.count * sizeof(SpanChunk*));
    for (unsigned b = 0; b < kBins; ++b)
      std::memcpy(bin_slots + b * bitmap_words(capacity), slots_of_bin(index, b),
                  bitmap_words(index.capacity) * sizeof(uint64_t));
    os::unmap(index.chunks, index_bytes(index.capacity));
    count_sub(g_totals.bytes_metadata, index_bytes(index.capacity));
  }
  count_add(g_totals.bytes_metadata, index_bytes(capacity));
  index.chunks = chunks;
  index.bin_slots = bin_slots;
  index.capacity = capacity;
  return true;
}

void span_index_add(SpanIndex& index, SpanChunk* chunk) {
  TRAY_CHECK(index.count < index.capacity);
  std::memset(chunk->bin_runs, 0, sizeof(chunk->bin_runs));
  chunk->slot = uint32_t(index.count++);
  index.chunks[chunk->slot] = chunk;
}

// The last slot's chunk moves into the one that leaves.
void span_index_remove(SpanIndex& index, const SpanChunk* chunk) {
  const size_t slot = chunk->slot;
  for (uint64_t bins = bins_of(chunk); bins != 0; bins &= bins - 1)
    count_bin(index, slot, unsigned(__builtin_ctzll(bins)), false);
  const size_t last = --index.count;
  if (last == slot) return;
  SpanChunk* moved = index.chunks[last];
  for (uint64_t bins = bins_of(moved); bins != 0; bins &= bins - 1) {
    set_slot_bin(index, last, unsigned(__builtin_ctzll(bins)), false);
    set_slot_bin(index, slot, unsigned(__builtin_ctzll(bins)), true);
  }
  index.chunks[slot] = moved;
  moved->slot = uint32_t(slot);
}

void span_index_run_added(SpanIndex& index, SpanChunk* chunk, size_t pages) {
  const unsigned b = run_bin(pages);
  if (chunk->bin_runs[b]++ == 0) count_bin(index, chunk->slot, b, true);
}

void span_index_run_removed(SpanIndex& index, SpanChunk* chunk, size_t pages) {
  const unsigned b = run_bin(pages);
  TRAY_ASSERT(chunk->bin_runs[b] != 0);
  if (--chunk->bin_runs[b] == 0) count_bin(index, chunk->slot, b, false);
}

bool span_index_find(const SpanIndex& index, size_t count, SpanChunk** out_chunk, size_t* out_first) {
  const unsigned own_bin = run_bin(count);
  if (bin_pages(own_bin) != count) {
    const uint64_t* slots = slots_of_bin(index, own_bin);
    for (size_t slot = bitmap::next_with(slots, index.count, 0, true); slot < index.count;
         slot = bitmap::next_with(slots, index.count, slot + 1, true)) {
      SpanChunk* chunk = index.chunks[slot];
      if (find_run(chunk, out_first, [&](size_t length) { return length >= count && run_bin(length) == own_bin; })) {
        *out_chunk = chunk;
        return true;
      }
    }
  }
  const unsigned low_bin = bin_pages(own_bin) == count ? own_bin : own_bin + 1;
  const uint64_t bins = low_bin < kBins ? index.bins & ~uint64_t{0} << low_bin : 0;
  if (bins == 0) return false;
  const unsigned best_bin = unsigned(__builtin_ctzll(bins));
  const size_t slot = bitmap::next_with(slots_of_bin(index, best_bin), index.count, 0, true);
  TRAY_ASSERT(slot < index.count);
  *out_chunk = index.chunks[slot];
  return find_run(*out_chunk, out_first, [&](size_t length) { return run_bin(length) == best_bin; });
}

void span_index_check([[maybe_unused]] const SpanIndex& index, [[maybe_unused]] SpanChunk* chunks) {
#ifndef NDEBUG
  size_t count = 0;
  for (const SpanChunk* c = chunks; c != nullptr; c = c->next, ++count) {
    uint16_t runs[kBins] = {};
    bitmap::for_each_run(c->free_bits, kSpanChunkOsPages, [&](size_t, size_t pages) {
      ++runs[run_bin(pages)];
      return false;
    });
    for (unsigned b = 0; b < kBins; ++b) {
      TRAY_ASSERT(runs[b] == c->bin_runs[b]);
      TRAY_ASSERT(bitmap::count_range(slots_of_bin(index, b), c->slot, 1) == size_t{runs[b] != 0});
    }
    TRAY_ASSERT(index.chunks[c->slot] == c);
  }
  TRAY_ASSERT(count == index.count);
  uint64_t bins = 0;
  for (unsigned b = 0; b < kBins; ++b) {
    const size_t with_bin = bitmap::count_range(slots_of_bin(index, b), 0, index.capacity);
    TRAY_ASSERT(with_bin == index.bin_chunks[b]);
    bins |= uint64_t{with_bin != 0} << b;
  }
  TRAY_ASSERT(bins == index.bins);
#endif
}

}  // namespace tray
