// The maps from an address to what traymalloc keeps there (segment.hpp): the chunk map, and
// the unit map with its leaves mapped as segments arrive.
#include "segment/address_maps.hpp"

#include "core/core.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "stats/stats.hpp"

namespace tray {

constinit uint8_t g_chunk_map[kChunkCount];
constinit Page g_foreign_page;

namespace {

// Before the root is filled: index 0 (null, and the lowest 128 GiB) reads the zero word.
alignas(uintptr_t) constinit const char g_unit_zero_word[sizeof(uintptr_t)] = {};
constinit const char* const g_unit_root_boot[1] = {g_unit_zero_word};
constinit const char* g_unit_root_table[kUnitRootEntries] = {};
uintptr_t g_unit_leaf_of_zeros = 0;
os::Mutex g_unit_map_lock;

// What a root entry holds for a leaf at `leaf`: its address less the offset of its range's
// first entry (see segment.hpp).
const char* root_entry_for(uintptr_t leaf, size_t root_index) {
  return reinterpret_cast<const char*>(leaf - root_index * kUnitLeafBytes);
}

}  // namespace

const char* const* g_unit_root = g_unit_root_boot;

void unit_map_reserve() {
  if (__atomic_load_n(&g_unit_root, __ATOMIC_ACQUIRE) == g_unit_root_table) return;
  os::LockGuard guard(g_unit_map_lock);
  if (g_unit_root == g_unit_root_table) return;
  void* zeros = os::map_read_only(kUnitLeafBytes);
  // Without the map every free would read past one word: stop here, with the reason.
  if (zeros == nullptr) fatal("cannot map 16 MiB of address space for the unit map (ulimit -v?)");
  count_add(g_totals.bytes_index, kUnitLeafBytes);
  g_unit_leaf_of_zeros = reinterpret_cast<uintptr_t>(zeros);
  for (size_t i = 0; i < kUnitRootEntries; ++i)
    g_unit_root_table[i] = root_entry_for(g_unit_leaf_of_zeros, i);
  __atomic_store_n(&g_unit_root, static_cast<const char* const*>(g_unit_root_table), __ATOMIC_RELEASE);
}

namespace {

// Before any thread can free: frees of memory from before the first allocation (another
// allocator's, under LD_PRELOAD) read the map too.
__attribute__((constructor(101))) void unit_map_at_start() { unit_map_reserve(); }

uintptr_t* unit_map_entries(const Segment* s) {
  return const_cast<uintptr_t*>(unit_entry_of(g_unit_root_table, reinterpret_cast<uintptr_t>(s)));
}

}  // namespace

void unit_map_set(const Segment* s, unsigned first, unsigned count, const Page* page) {
  const uintptr_t offset =
      page == nullptr ? 0 : reinterpret_cast<uintptr_t>(page) - reinterpret_cast<uintptr_t>(&g_foreign_page);
  uintptr_t* entries = unit_map_entries(s);
  for (unsigned u = first; u < first + count; ++u) __atomic_store_n(&entries[u], offset, __ATOMIC_RELAXED);
}

bool unit_map_prepare(const Segment* s) {
  unit_map_reserve();
  const size_t index = reinterpret_cast<uintptr_t>(s) >> kUnitLeafShift;
  const char* const zeros = root_entry_for(g_unit_leaf_of_zeros, index);
  if (__atomic_load_n(&g_unit_root_table[index], __ATOMIC_ACQUIRE) != zeros) return true;
  os::LockGuard guard(g_unit_map_lock);
  if (g_unit_root_table[index] != zeros) return true;
  void* leaf = os::map(kUnitLeafBytes);
  if (leaf == nullptr) return false;
  count_add(g_totals.bytes_index, kUnitLeafBytes);
  __atomic_store_n(&g_unit_root_table[index], root_entry_for(reinterpret_cast<uintptr_t>(leaf), index),
                   __ATOMIC_RELEASE);
  return true;
}

void chunk_map_set(const void* base, size_t bytes, bool large) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(base) >> kSegmentShift;
  const size_t count = div_ceil(bytes, kSegmentBytes);
  for (size_t k = 0; k < count; ++k) {
    uint8_t value = kChunkSegment;
    if (large) value = k < size_t(kChunkGuard - kChunkLarge) ? uint8_t(kChunkLarge + k) : kChunkLargeFar;
    __atomic_store_n(&g_chunk_map[first + k], value, __ATOMIC_RELAXED);
  }
}

void chunk_map_set_guard(const void* base, size_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(base) >> kSegmentShift;
  for (size_t k = 0; k < div_ceil(bytes, kSegmentBytes); ++k)
    __atomic_store_n(&g_chunk_map[first + k], kChunkGuard, __ATOMIC_RELAXED);
}

void chunk_map_clear(const void* base, size_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(base) >> kSegmentShift;
  const size_t count = div_ceil(bytes, kSegmentBytes);
  for (size_t k = 0; k < count; ++k)
    __atomic_store_n(&g_chunk_map[first + k], kChunkForeign, __ATOMIC_RELAXED);
}

}  // namespace tray
