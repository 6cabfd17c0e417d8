#include "sample/guard.hpp"

#include <unistd.h>

#include <atomic>
#include <cstring>

#include "core/core.hpp"
#include "heap/heap.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "sample/config.hpp"
#include "segment/segment.hpp"

namespace tray {

namespace {

// The region: an inaccessible page, then per slot kGuardMaxBlockBytes of data pages and another
// inaccessible page, so every slot has a guard page on both sides. Data pages are accessible
// only while the slot's block is live, and only those the block spans.
enum class SlotState : uint8_t { kUnused, kLive, kFreed };

struct Stack {
  int thread = 0;
  int depth = 0;
  void* frames[kGuardStackFrames] = {};
};

struct GuardSlot {
  uintptr_t block = 0;
  size_t size = 0;
  uintptr_t mapped = 0;       // the block's pages, made accessible while it is live
  size_t mapped_bytes = 0;
  SlotState state = SlotState::kUnused;
  // The program heap the block was allocated into (heap/program.hpp), which frees it with the
  // rest; nullptr: none.
  const ProgramHeap* owner = nullptr;
  Stack allocated;
  Stack freed;
};

enum class Fault { kOverflow, kUseAfterFree, kDoubleFree, kInvalidFree, kWild };



void release_slot(GuardSlot* slot, const Stack& freed);

os::Mutex g_lock;  // the slots and the queue; the fault handler reads without it
std::atomic<bool> g_ready{false};
std::atomic<bool> g_prepared{false};
// Set once, under g_lock, before the chunk map marks the region: whoever reaches guard code
// through a pointer into it (a free, a fault) sees them.
uintptr_t g_base = 0;
size_t g_region_bytes = 0;
size_t g_page_bytes = 0;
size_t g_slot_bytes = 0;  // data pages per slot, in bytes
size_t g_slot_count = 0;
// constinit: in .bss, untouched until used. Initialized at load instead, the table (312 KiB)
// was resident in every process, guard_sample set or not.
constinit GuardSlot g_slots[kGuardMaxSlots];
// Slots ready for a block, oldest freed first: a freed block stays inaccessible as long as
// possible, so a use long after the free still faults.
uint32_t g_queue[kGuardMaxSlots];
size_t g_queue_head = 0;
size_t g_queue_size = 0;
uint64_t g_placed = 0;  // even: the block ends at the guard page after it; odd: starts after one
// This thread is inside guard code: an allocation made meanwhile (by the unwinder, say) is not
// guarded, so the lock is never taken twice.
__thread bool tls_busy = false;

uintptr_t slot_start(size_t index) {
  return g_base + g_page_bytes + index * (g_slot_bytes + g_page_bytes);
}

// Fills the padding around a block: an odd value, neither 0 nor a small integer or ASCII, so a
// stray write is unlikely to store it.
constexpr uint8_t kCanaryByte = 0xd3;
constexpr uint64_t kCanaryWord = 0x0101010101010101ULL * kCanaryByte;

void fill_padding(uintptr_t from, uintptr_t to) {
  std::memset(reinterpret_cast<void*>(from), kCanaryByte, to - from);
}

// The first byte of [from, to) that lost its canary; `to` if none did. A word at a time where
// it can: the padding is up to two pages, checked at every free of a guarded block.
uintptr_t first_changed(uintptr_t from, uintptr_t to) {
  uintptr_t a = from;
  for (; a < to && a % 8 != 0; ++a)
    if (*reinterpret_cast<const uint8_t*>(a) != kCanaryByte) return a;
  for (; a + 8 <= to; a += 8)
    if (*reinterpret_cast<const uint64_t*>(a) != kCanaryWord) break;
  for (; a < to; ++a)
    if (*reinterpret_cast<const uint8_t*>(a) != kCanaryByte) return a;
  return to;
}

void capture(Stack& stack) {
  stack.thread = os::thread_id();
  stack.depth = os::capture_stack(stack.frames, int(kGuardStackFrames));
}

void write_stack(TextBuffer& text, const char* what, const Stack& stack) {
  text.clear();
  text.str("traymalloc: ").str(what).str(" by thread ").dec(uint64_t(stack.thread)).str(":\n");
  os::write_text(STDERR_FILENO, text);
  os::write_frames(STDERR_FILENO, stack.frames, stack.depth);
}

// Everything known about the access at `address` to the slot's block, then abort. `now` names
// what the calling stack is doing ("accessed" in the SIGSEGV handler, "freed" in free). Writes
// to stderr, allocates nothing.
[[noreturn]] void report(Fault fault, const GuardSlot* slot, uintptr_t address, const char* now) {
  char storage[320];
  TextBuffer text(storage, sizeof storage);
  text.str("traymalloc: ");
  switch (fault) {
    case Fault::kOverflow: text.str("heap-buffer-overflow"); break;
    case Fault::kUseAfterFree: text.str("use-after-free"); break;
    case Fault::kDoubleFree: text.str("double free"); break;
    case Fault::kInvalidFree: text.str("invalid free"); break;
    case Fault::kWild: text.str("access to an unused guarded slot"); break;
  }
  text.str(" at ").ptr(reinterpret_cast<void*>(address));
  if (slot != nullptr && slot->state != SlotState::kUnused) {
    const int64_t offset = int64_t(address - slot->block);
    text.str(": block ").ptr(reinterpret_cast<void*>(slot->block)).str(" of ").count(slot->size, "byte", "bytes");
    text.str(" (guarded), offset ").sdec(offset);
    if (offset < 0) text.str(", ").count(uint64_t(-offset), "byte", "bytes").str(" before it");
    else if (uint64_t(offset) >= slot->size) text.str(", ").count(uint64_t(offset) - slot->size, "byte", "bytes").str(" after it");
    if (slot->state == SlotState::kFreed) text.str(", freed");
  }
  os::write_text(STDERR_FILENO, text.chr('\n'));
  if (slot != nullptr && slot->state != SlotState::kUnused) {
    write_stack(text, "allocated", slot->allocated);
    if (slot->state == SlotState::kFreed) write_stack(text, "freed", slot->freed);
  }
  text.clear();
  os::write_text(STDERR_FILENO, text.str("traymalloc: ").str(now).str(" by thread ").dec(uint64_t(os::thread_id())).str(":\n"));
  os::write_backtrace(STDERR_FILENO);
  os::abort_process();
}

bool create_region() {
  const int64_t slots = option(Option::kGuardSlots);  // 1..kGuardMaxSlots (options.cpp)
  const size_t page = os::page_size();
  const size_t slot_bytes = align_up(kGuardMaxBlockBytes, page);
  const size_t region = page + size_t(slots) * (slot_bytes + page);
  // Whole chunks, so that no other memory shares the chunk map's word for them.
  const size_t reserved = align_up(region, kSegmentBytes);
  void* base = os::reserve_aligned(reserved, kSegmentBytes);
  if (base == nullptr) return false;
  g_page_bytes = page;
  g_slot_bytes = slot_bytes;
  g_slot_count = size_t(slots);
  g_region_bytes = region;
  for (size_t i = 0; i < g_slot_count; ++i) g_queue[i] = uint32_t(i);
  g_queue_size = g_slot_count;
  g_base = reinterpret_cast<uintptr_t>(base);
  chunk_map_set_guard(base, reserved);
  return true;
}

void* place(size_t size, size_t alignment, const Stack& allocated) {
  if (g_queue_size == 0) return nullptr;  // every slot holds a live block
  const uint32_t index = g_queue[g_queue_head];
  const uintptr_t start = slot_start(index);
  uintptr_t block = start;
  if (g_placed % 2 == 0) block = align_down(start + g_slot_bytes - size, alignment);
  const uintptr_t mapped = align_down(block, g_page_bytes);
  const uintptr_t mapped_end = align_up(block + size, g_page_bytes);
  if (!os::protect_read_write(reinterpret_cast<void*>(mapped), mapped_end - mapped)) return nullptr;
  g_queue_head = (g_queue_head + 1) % g_slot_count;
  --g_queue_size;
  ++g_placed;
  // Freed slots give their pages back (guard_free), but the kernel may have refused, so the
  // block is zeroed: what a previous block left there lies at other offsets now, and a copy of
  // the free key at the new block's second word would make its next owner's free look like a
  // double free (hardening.hpp). The rest of its pages holds the canary, checked at free.
  std::memset(reinterpret_cast<void*>(block), 0, size);
  fill_padding(mapped, block);
  fill_padding(block + size, mapped_end);
  GuardSlot& slot = g_slots[index];
  slot.block = block;
  slot.size = size;
  slot.mapped = mapped;
  slot.mapped_bytes = mapped_end - mapped;
  slot.state = SlotState::kLive;
  slot.owner = tls_part != nullptr ? tls_part->program.load(std::memory_order_relaxed) : nullptr;
  slot.allocated = allocated;
  return reinterpret_cast<void*>(block);
}

// The slot whose data pages hold `address`; nullptr in a guard page or outside the region.
GuardSlot* slot_holding(uintptr_t address) {
  if (g_base == 0 || address < g_base + g_page_bytes || address >= g_base + g_region_bytes) return nullptr;
  const uintptr_t offset = address - g_base - g_page_bytes;
  const size_t stride = g_slot_bytes + g_page_bytes;
  if (offset % stride >= g_slot_bytes) return nullptr;
  return &g_slots[offset / stride];
}

// How far `address` lies from the slot's block (0 inside it); SIZE_MAX for an unused slot.
size_t distance(const GuardSlot& slot, uintptr_t address) {
  if (slot.state == SlotState::kUnused) return SIZE_MAX;
  if (address < slot.block) return slot.block - address;
  return address < slot.block + slot.size ? 0 : address - (slot.block + slot.size) + 1;
}

// The slot an access at `address` was meant for: the one holding it, or for a guard page the
// neighbour whose block lies closer.
const GuardSlot* slot_for_fault(uintptr_t address) {
  if (const GuardSlot* slot = slot_holding(address); slot != nullptr) return slot;
  const size_t stride = g_slot_bytes + g_page_bytes;
  const size_t after = (address - g_base) / stride;  // the slot after this guard page
  const GuardSlot* before = after > 0 ? &g_slots[after - 1] : nullptr;
  const GuardSlot* next = after < g_slot_count ? &g_slots[after] : nullptr;
  if (before == nullptr) return next;
  if (next == nullptr) return before;
  return distance(*before, address) <= distance(*next, address) ? before : next;
}

void on_fault(void* address) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  if (g_base == 0 || a < g_base || a >= g_base + g_region_bytes) return;
  const GuardSlot* slot = slot_for_fault(a);
  if (slot == nullptr || slot->state == SlotState::kUnused) report(Fault::kWild, slot, a, "accessed");
  report(slot->state == SlotState::kFreed ? Fault::kUseAfterFree : Fault::kOverflow, slot, a, "accessed");
}

// At start-up (a constructor: the unwinder must not be loaded from inside malloc).
__attribute__((constructor)) void guard_at_start() {
  if (option(Option::kGuardSample) != 0) guard_prepare();
}

}  // namespace

void guard_lock_for_fork() { g_lock.lock(); }
void guard_unlock_after_fork() { g_lock.unlock(); }

void guard_prepare() {
  if (g_prepared.exchange(true)) return;
  os::prepare_backtrace();
  g_ready.store(true, std::memory_order_release);
}

void* guard_alloc(size_t size, size_t alignment, bool) {
  if (!g_ready.load(std::memory_order_acquire) || tls_busy) return nullptr;
  if (size > kGuardMaxBlockBytes || alignment > os::page_size()) return nullptr;
  if (size == 0) size = 1;  // a distinct pointer, with a byte to overflow from
  tls_busy = true;
  // Stacks are taken outside g_lock: capture_stack may wait for the loader's lock, whose
  // holder may be freeing a guarded block (dlclose frees under it).
  Stack allocated;
  capture(allocated);
  void* block = nullptr;
  {
    os::LockGuard lock(g_lock);
    if (g_base != 0 || (create_region() && os::set_fault_hook(on_fault)))
      block = place(size, alignment, allocated);
  }
  tls_busy = false;
  return block;
}

void guard_free(void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  Stack freed;  // outside g_lock, as in guard_alloc
  capture(freed);
  os::LockGuard lock(g_lock);
  GuardSlot* slot = slot_holding(address);
  if (slot == nullptr || slot->block != address || slot->state == SlotState::kUnused)
    report(Fault::kInvalidFree, slot, address, "freed");
  if (slot->state == SlotState::kFreed) report(Fault::kDoubleFree, slot, address, "freed again");
  release_slot(slot, freed);
}

void guard_release_owned(const ProgramHeap* owner) {
  if (!g_ready.load(std::memory_order_acquire)) return;
  Stack freed;
  capture(freed);
  os::LockGuard lock(g_lock);
  for (size_t i = 0; i < g_slot_count; ++i) {
    GuardSlot& slot = g_slots[i];
    if (slot.state == SlotState::kLive && slot.owner == owner) release_slot(&slot, freed);
  }
}

namespace {

// A live slot's block is freed (under g_lock): its padding checked, its pages inaccessible.
void release_slot(GuardSlot* slot, const Stack& freed) {
  const uintptr_t end = slot->block + slot->size;
  if (uintptr_t bad = first_changed(slot->mapped, slot->block); bad != slot->block)
    report(Fault::kOverflow, slot, bad, "found at free");
  if (uintptr_t bad = first_changed(end, slot->mapped + slot->mapped_bytes); bad != slot->mapped + slot->mapped_bytes)
    report(Fault::kOverflow, slot, bad, "found at free");
  slot->freed = freed;
  os::protect_no_access(reinterpret_cast<void*>(slot->mapped), slot->mapped_bytes);
  // Inaccessible pages need no contents: giving them back keeps the resident cost of guarded
  // sampling to the live guarded blocks (kept, freed slots held up to guard_slots × 5 pages:
  // 1.25 MiB at the default 64). One madvise per guarded free, once per guard_sample bytes.
  os::purge(reinterpret_cast<void*>(slot->mapped), slot->mapped_bytes);
  slot->state = SlotState::kFreed;
  slot->owner = nullptr;
  g_queue[(g_queue_head + g_queue_size) % g_slot_count] = uint32_t(slot - g_slots);
  ++g_queue_size;
}

}  // namespace

const ProgramHeap* guard_owner_of(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  os::LockGuard lock(g_lock);
  const GuardSlot* slot = slot_holding(address);
  return slot != nullptr && slot->block == address && slot->state == SlotState::kLive ? slot->owner : nullptr;
}

size_t guard_usable_size(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  os::LockGuard lock(g_lock);
  const GuardSlot* slot = slot_holding(address);
  return slot != nullptr && slot->block == address && slot->state == SlotState::kLive ? slot->size : 0;
}

}  // namespace tray
