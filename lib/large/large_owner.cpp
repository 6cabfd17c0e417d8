// Owners of large blocks: a table of headers per owner, so that freeing an owner's blocks
// all at once walks its blocks and nothing else, and a block freed on its own leaves the table
// in O(1) (the last entry moves into its slot). The table lives in memory of its own from the
// OS, never from the heaps it serves.
#include <cstring>

#include "large/large.hpp"
#include "platform/platform.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

constexpr uint32_t kFirstCapacity = 512;  // one OS page of pointers

size_t table_bytes(uint32_t capacity) {
  return align_up(size_t(capacity) * sizeof(LargeHeader*), os::page_size());
}

void free_table(LargeHeader** headers, uint32_t capacity) {
  if (headers == nullptr) return;
  os::unmap(headers, table_bytes(capacity));
  count_sub(g_totals.bytes_metadata, table_bytes(capacity));
}

// Doubles the table; false when the OS refuses.
bool grow(LargeOwner* owner) {
  const uint32_t capacity = owner->capacity == 0 ? kFirstCapacity : owner->capacity * 2;
  auto* headers = static_cast<LargeHeader**>(map_metadata(table_bytes(capacity)));
  if (headers == nullptr) return false;
  if (owner->count != 0) std::memcpy(headers, owner->headers, owner->count * sizeof(LargeHeader*));
  free_table(owner->headers, owner->capacity);
  owner->headers = headers;
  owner->capacity = capacity;
  return true;
}

}  // namespace

bool large_own(LargeOwner* owner, LargeHeader* header) {
  os::LockGuard guard(owner->lock);
  if (owner->count == owner->capacity && !grow(owner)) return false;
  header->owner = owner;
  header->owner_slot = owner->count;
  owner->headers[owner->count] = header;
  __atomic_store_n(&owner->count, owner->count + 1, __ATOMIC_RELAXED);  // dumps read it unlocked
  __atomic_store_n(&owner->bytes, owner->bytes + large_usable_size(header), __ATOMIC_RELAXED);
  return true;
}

void large_disown(LargeHeader* header) {
  LargeOwner* owner = header->owner;
  os::LockGuard guard(owner->lock);
  const uint32_t slot = header->owner_slot;
  TRAY_CHECK(slot < owner->count && owner->headers[slot] == header);
  LargeHeader* last = owner->headers[owner->count - 1];
  __atomic_store_n(&owner->count, owner->count - 1, __ATOMIC_RELAXED);
  owner->headers[slot] = last;
  last->owner_slot = slot;
  __atomic_store_n(&owner->bytes, owner->bytes - large_usable_size(header), __ATOMIC_RELAXED);
  header->owner = nullptr;
}

void large_owner_resized(LargeHeader* header, size_t old_usable) {
  LargeOwner* owner = header->owner;
  os::LockGuard guard(owner->lock);
  owner->headers[header->owner_slot] = header;
  __atomic_store_n(&owner->bytes, owner->bytes - old_usable + large_usable_size(header),
                   __ATOMIC_RELAXED);
}

void large_release_owned(LargeOwner* owner, void (*release)(LargeHeader*)) {
  LargeHeader** headers;
  uint32_t count, capacity;
  {
    os::LockGuard guard(owner->lock);
    headers = owner->headers;
    count = owner->count;
    capacity = owner->capacity;
    owner->headers = nullptr;
    __atomic_store_n(&owner->count, uint32_t{0}, __ATOMIC_RELAXED);
    owner->capacity = 0;
    __atomic_store_n(&owner->bytes, size_t{0}, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < count; ++i) headers[i]->owner = nullptr;
  }
  // Outside the lock: freeing takes the large cache's and the span arenas' locks.
  for (uint32_t i = 0; i < count; ++i) release(headers[i]);
  free_table(headers, capacity);
}

void large_owner_usage(const LargeOwner* owner, size_t* blocks, size_t* bytes) {
  *blocks = __atomic_load_n(&owner->count, __ATOMIC_RELAXED);
  *bytes = __atomic_load_n(&owner->bytes, __ATOMIC_RELAXED);
}

}  // namespace tray
