#include "debug/debug.hpp"

#include <errno.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "core/core.hpp"
#include "debug/config.hpp"
#include "heap/heap.hpp"
#include "large/large.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "stats/stats.hpp"
#include "traymalloc.h"

namespace tray {

namespace {

constexpr uint32_t kFreedPattern = TRAY_FREED_PATTERN;
constexpr uint32_t kAllocPattern = TRAY_ALLOC_PATTERN;
constexpr uint8_t kCanaryByte = TRAY_CANARY_BYTE;
// Block states in a page's table; a live block's state is its requested size + 1.
constexpr uint32_t kStateNever = 0;  // carved, never handed out
constexpr uint32_t kStateFreed = UINT32_MAX;
// A block out of quarantine holds its free-list link and, once handed out again, a cleared
// free key (see heap/hardening.hpp): the fill is checked past both words.
constexpr size_t kLinkBytes = 2 * sizeof(uint64_t);
constexpr size_t kNone = SIZE_MAX;

std::atomic<LargeHeader*> g_retired_large[kDebugRetiredLargeCount];
std::atomic<size_t> g_retired_next{0};

// --- reports -----------------------------------------------------------------------------
// One line on stderr, a backtrace, then abort, or (debug_abort=0) count it and go on.
class Report {
 public:
  Report() : out_(storage_, sizeof storage_) { out_.str("traymalloc: "); }
  TextBuffer& text() { return out_; }
  TRAY_COLD void finish() {
    out_.chr('\n');
    os::write_text(STDERR_FILENO, out_);
    os::write_backtrace(STDERR_FILENO);
    if (option(Option::kDebugAbort) != 0) {
      static constexpr char kHint[] =
          "traymalloc: aborting (TRAY_OPTIONS=debug_abort=0 reports and goes on)\n";
      os::write_fd(STDERR_FILENO, kHint, sizeof kHint - 1);
      os::abort_process();
    }
    count_add(g_totals.debug_errors, 1);
  }

 private:
  char storage_[512];
  TextBuffer out_;
};

TextBuffer& size_class_text(TextBuffer& out, const Page* page) {
  return out.str("size class ").dec(page->block_bytes).str(" B");
}

TRAY_COLD void report_write_after_free(const void* block, const Page* page, size_t offset,
                                       uint32_t found) {
  Report report;
  report.text().str("write after free: block ").ptr(block).str(" (");
  size_class_text(report.text(), page).str(") modified at offset ").dec(offset);
  report.text().str(" (found 0x").hex(found, 8).str(", expected 0x").hex(kFreedPattern, 8).chr(')');
  report.finish();
}

TRAY_COLD void report_broken_link(const void* block, const Page* page, const void* link) {
  Report report;
  report.text().str("write after free: block ").ptr(block).str(" (");
  size_class_text(report.text(), page).str(") modified at offset 0 (found ").ptr(link);
  report.text().str(", expected a free-list link to a free block of its page)");
  report.finish();
}

TRAY_COLD void report_double_free(const char* op, const void* p, const Page* page,
                                  const LargeHeader* header) {
  Report report;
  if (op[0] == 'f') report.text().str("double free of ").ptr(p).str(" (");
  else report.text().str(op).str(" of freed block ").ptr(p).str(" (");
  if (page != nullptr) size_class_text(report.text(), page);
  else report.text().str("large block of ").count(header->requested, "requested byte", "requested bytes");
  report.text().chr(')');
  report.finish();
}

TRAY_COLD void report_overflow(const void* p, size_t requested, size_t offset, const Page* page) {
  Report report;
  report.text().str("heap buffer overflow: block ").ptr(p).str(" of ");
  report.text().count(requested, "requested byte", "requested bytes").str(" written at offset ").dec(offset).str(" (");
  if (page != nullptr) size_class_text(report.text(), page).chr(')');
  else report.text().str("large block)");
  report.finish();
}

// "<op> of invalid pointer P: <why>"; the caller writes the why into the returned report.
class InvalidPointer : public Report {
 public:
  InvalidPointer(const char* op, const void* p) {
    text().str(op).str(" of invalid pointer ").ptr(p).str(": ");
  }
};

// --- fills -------------------------------------------------------------------------------
// Native 32-bit words from `from` (a multiple of 4) up to `to`; a partial last word gets the
// pattern's first bytes, so the fill reads the same at every word boundary.
void fill_words(uint8_t* p, size_t from, size_t to, uint32_t word) {
  size_t i = from;
  for (; i + 4 <= to; i += 4) std::memcpy(p + i, &word, 4);
  if (i < to) std::memcpy(p + i, &word, to - i);
}

// The pattern's bytes over [from, to), each where a fill from offset 0 would have put it.
void fill_pattern(uint8_t* p, size_t from, size_t to, uint32_t word) {
  uint8_t bytes[4];
  std::memcpy(bytes, &word, 4);
  size_t i = from;
  for (; i < to && i % 4 != 0; ++i) p[i] = bytes[i % 4];
  fill_words(p, i, to, word);
}

// Compares 64 bytes at a time while they match, one branch for eight words (with a branch per
// word this check took half of vim's time in debug mode), then 8 bytes at a time (from and to
// are multiples of 8 for every block) to find the 32-bit word that differs.
size_t first_changed_word(const uint8_t* p, size_t from, size_t to, uint32_t word,
                          uint32_t* found) {
  const uint64_t pair = uint64_t(word) << 32 | word;
  size_t i = from;
  for (; i + 64 <= to; i += 64) {
    uint64_t differs = 0;
    for (size_t j = 0; j < 64; j += 8) {
      uint64_t both;
      std::memcpy(&both, p + i + j, 8);
      differs |= both ^ pair;
    }
    if (differs != 0) break;
  }
  for (; i + 8 <= to; i += 8) {
    uint64_t both;
    std::memcpy(&both, p + i, 8);
    if (both == pair) continue;
    std::memcpy(found, p + i, 4);
    if (*found != word) return i;
    std::memcpy(found, p + i + 4, 4);
    return i + 4;
  }
  return kNone;
}

// 8 bytes at a time where they match (a canary spans up to a quarter of a block), then the byte.
size_t first_changed_byte(const uint8_t* p, size_t from, size_t to, uint8_t byte) {
  const uint64_t eight = uint64_t{0x0101010101010101} * byte;
  size_t i = from;
  for (; i + 8 <= to; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    if (word != eight) break;
  }
  for (; i < to; ++i)
    if (p[i] != byte) return i;
  return kNone;
}

// --- block states ------------------------------------------------------------------------
uint32_t* states_of(Page* page) {
  uint32_t*& states = page_debug_states(page);
  if (states == nullptr) {
    const size_t bytes = page_debug_states_bytes(page);
    void* table = map_metadata(bytes);  // zero: every block starts as never handed out
    if (table == nullptr) return nullptr;
    states = static_cast<uint32_t*>(table);
  }
  return states;
}

uint32_t state_load(const Page* page, size_t index) {
  const uint32_t* states = page_debug_states(page);
  return states == nullptr ? kStateNever : __atomic_load_n(&states[index], __ATOMIC_ACQUIRE);
}

uint32_t block_index(const Page* page, const void* block) {
  return uint32_t(size_t(static_cast<const uint8_t*>(block) - page->blocks) / page->block_bytes);
}

// A free-list link the allocator could have written: the list's end, or a carved, non-live block of the
// same page.
bool link_is_valid(const Page* page, const Block* link) {
  if (link == list_end()) return true;
  const auto address = reinterpret_cast<uintptr_t>(link);
  const auto start = reinterpret_cast<uintptr_t>(page->blocks);
  if (address < start) return false;
  const size_t offset = address - start;
  if (offset % page->block_bytes != 0 || offset / page->block_bytes >= page->capacity) return false;
  const uint32_t state = state_load(page, offset / page->block_bytes);
  return state == kStateNever || state == kStateFreed;
}

Heap* own_heap() {
  Heap* heap = tls_own_heap;
  return heap != nullptr ? heap : heap_attach_thread(HeapUse::kChecked);
}

// --- the live block behind a pointer -------------------------------------------------------
struct LiveBlock {
  Page* page = nullptr;             // a small block...
  LargeHeader* header = nullptr;    // ...or a large one
  uint32_t state = 0;               // small: requested + 1
  size_t requested = 0;
  size_t block_bytes = 0;           // usable bytes (up to where the canary ends)
};

bool find_small(const char* op, void* p, LiveBlock* out, bool report) {
  Page* page = unit_page_of(p);
  const auto* bytes = static_cast<const uint8_t*>(p);
  if (page->heap == nullptr || bytes < page->blocks) {
    if (report) {
      InvalidPointer error(op, p);
      error.text().str("it lies in traymalloc memory that holds no block");
      error.finish();
    }
    return false;
  }
  const size_t offset = size_t(bytes - page->blocks);
  if (offset % page->block_bytes != 0) {
    if (report) {
      InvalidPointer error(op, p);
      error.text().str("not the start of a block (").count(offset % page->block_bytes, "byte", "bytes");
      error.text().str(" into block ").ptr(bytes - offset % page->block_bytes).str(" of ");
      size_class_text(error.text(), page).chr(')');
      error.finish();
    }
    return false;
  }
  const uint32_t state = state_load(page, offset / page->block_bytes);
  if (state == kStateFreed) {
    if (report) report_double_free(op, p, page, nullptr);
    return false;
  }
  if (state == kStateNever) {
    if (report) {
      InvalidPointer error(op, p);
      error.text().str("a block of ");
      size_class_text(error.text(), page).str(" that was never allocated");
      error.finish();
    }
    return false;
  }
  *out = LiveBlock{page, nullptr, state, state - 1, page->block_bytes};
  return true;
}

bool find_large(const char* op, void* p, uint8_t kind, LiveBlock* out, bool report) {
  LargeHeader* header = large_mapping_of(p, kind);
  if (header == nullptr || (header->user != p && header->user != nullptr)) {
    if (report) {
      InvalidPointer error(op, p);
      error.text().str("not the start of a block (it lies inside a large block");
      if (header != nullptr) error.text().str(" at ").ptr(header->user);
      error.text().chr(')');
      error.finish();
    }
    return false;
  }
  if (header->user == nullptr) {
    if (report) report_double_free(op, p, nullptr, header);
    return false;
  }
  *out = LiveBlock{nullptr, header, 0, header->requested, large_usable_size(header)};
  return true;
}

bool find_live(const char* op, void* p, LiveBlock* out, bool report) {
  const uint8_t kind = chunk_kind(p);
  if (kind == kChunkSegment) return find_small(op, p, out, report);
  if (kind != kChunkForeign) return find_large(op, p, kind, out, report);
  if (report) {
    InvalidPointer error(op, p);
    error.text().str("not allocated by traymalloc");
    error.finish();
  }
  return false;
}

void check_canary(const void* p, const LiveBlock& live) {
  const size_t changed =
      first_changed_byte(static_cast<const uint8_t*>(p), live.requested, live.block_bytes, kCanaryByte);
  if (changed != kNone) report_overflow(p, live.requested, changed, live.page);
}

// --- quarantine --------------------------------------------------------------------------
// The block leaves quarantine: its fill must be whole, then it goes back to its page.
void release_block(Heap* heap, Block* block) {
  Page* page = unit_page_of(block);
  uint32_t found;
  const size_t changed =
      first_changed_word(reinterpret_cast<uint8_t*>(block), 0, page->block_bytes, kFreedPattern, &found);
  if (changed != kNone) {
    report_write_after_free(block, page, changed, found);
    // debug_abort=0 goes on: restore the fill so that the reuse check does not report it again.
    fill_words(reinterpret_cast<uint8_t*>(block), 0, page->block_bytes, kFreedPattern);
  }
  heap_free_block(heap, page, block);
}

void release_oldest(Heap* heap, Quarantine* q) {
  Block* block = q->blocks[q->oldest];
  q->oldest = (q->oldest + 1) % kDebugQuarantineBlocks;
  --q->count;
  q->bytes -= unit_page_of(block)->block_bytes;
  release_block(heap, block);
}

Quarantine* quarantine_of(Heap* heap) {
  if (heap->quarantine == nullptr) heap->quarantine = new_metadata<Quarantine>();
  return heap->quarantine;
}

void quarantine_push(Heap* heap, Page* page, Block* block) {
  Quarantine* q = quarantine_of(heap);
  if (q == nullptr) return release_block(heap, block);
  if (q->count == kDebugQuarantineBlocks) release_oldest(heap, q);
  q->blocks[(q->oldest + q->count) % kDebugQuarantineBlocks] = block;
  ++q->count;
  q->bytes += page->block_bytes;
  while (q->bytes > kDebugQuarantineBytes && q->count > 1) release_oldest(heap, q);
}

// Where a freed large block was freed, for the report of a later access to it: in its
// header's OS page past the header, which stays readable (debug mode aligns large blocks to an
// OS page, so nothing else lives there).
struct FreeStack {
  int depth;
  void* frames[kDebugFreeStackFrames];
};
static_assert(kLargeHeaderBytes + sizeof(FreeStack) <= 4096);

FreeStack* free_stack_of(const LargeHeader* header) {
  return reinterpret_cast<FreeStack*>(const_cast<char*>(reinterpret_cast<const char*>(header)) +
                                      kLargeHeaderBytes);
}

// An access to a retired large block faults (its pages are inaccessible): the report names
// the block, its size and where it was freed, then the access's stack, and stops the program
// (going on would fault again). Any other fault is not ours.
void on_fault(void* address) {
  const uint8_t kind = chunk_kind(address);
  if (kind == kChunkForeign || kind == kChunkSegment || kind == kChunkGuard) return;
  const LargeHeader* header = large_mapping_of(address, kind);
  if (header == nullptr || header->user != nullptr || header->freed_offset == 0) return;
  const char* base = reinterpret_cast<const char*>(header);
  const char* block = base + header->freed_offset;
  const auto* at = static_cast<const char*>(address);
  if (at < base + os::page_size() || at >= base + header->reserve_bytes) return;
  char storage[384];
  TextBuffer text(storage, sizeof storage);
  text.str("traymalloc: use after free: access at ").ptr(address);
  if (at >= block) text.str(", ").count(size_t(at - block), "byte", "bytes").str(" into");
  else text.str(", before");
  text.str(" large block ").ptr(block).str(" of ");
  text.count(header->requested, "requested byte", "requested bytes").str(", freed at:\n");
  os::write_text(STDERR_FILENO, text);
  const FreeStack* freed = free_stack_of(header);
  os::write_frames(STDERR_FILENO, freed->frames, freed->depth);
  static constexpr char kAccessed[] = "traymalloc: accessed at:\n";
  os::write_fd(STDERR_FILENO, kAccessed, sizeof kAccessed - 1);
  os::write_backtrace(STDERR_FILENO);
  os::abort_process();
}

// Freed large mappings stay, inaccessible, until kDebugRetiredLargeCount newer ones follow.
void retire_large(LargeHeader* header, void* user) {
  large_retire(header, user);
  const size_t slot = g_retired_next.fetch_add(1, std::memory_order_relaxed) % kDebugRetiredLargeCount;
  LargeHeader* evicted = g_retired_large[slot].exchange(header, std::memory_order_acq_rel);
  if (evicted != nullptr) large_unmap_retired(evicted);
}

// --- allocation --------------------------------------------------------------------------
// The class for `padded` bytes whose blocks all have the alignment; -1 if no class serves.
int debug_class(size_t padded, size_t alignment) {
  if (padded > kMaxSmallBytes || alignment > kUnitBytes) return -1;
  const size_t need = padded < alignment ? alignment : padded;
  for (unsigned c = size_class_of(need); c < kSizeClassCount; ++c)
    if (alignment <= kNaturalAlignment || class_size(c) % alignment == 0) return int(c);
  return -1;
}

void* alloc_small(unsigned size_class, size_t size, bool zero) {
  // Into the program heap the thread allocates into, if any (heap/program.hpp).
  Heap* heap = tls_part != nullptr ? tls_part : own_heap();
  if (heap == nullptr) return nullptr;
  auto* block = static_cast<uint8_t*>(heap_alloc_from(heap, size_class, size));
  if (block == nullptr) return nullptr;
  heap_count_allocation(heap, size_class, size);
  Page* page = unit_page_of(block);
  // The pop just followed this block's link: it must lead to a free block of the page.
  AllocSlot& slot = heap->slots[size_class];
  if (!link_is_valid(page, slot.head)) {
    const Block* link = slot.head;
    slot.head = list_end();  // the rest of the list is lost, but never handed out
    report_broken_link(block, page, link);
  }
  uint32_t* states = states_of(page);
  if (states == nullptr) {
    heap_count_free(heap, page);
    heap_free_block(heap, page, reinterpret_cast<Block*>(block));
    errno = ENOMEM;
    return nullptr;
  }
  const uint32_t index = block_index(page, block);
  if (__atomic_load_n(&states[index], __ATOMIC_ACQUIRE) == kStateFreed) {
    uint32_t found;
    const size_t changed = first_changed_word(block, kLinkBytes, page->block_bytes, kFreedPattern, &found);
    if (changed != kNone) report_write_after_free(block, page, changed, found);
  }
  __atomic_store_n(&states[index], uint32_t(size + 1), __ATOMIC_RELEASE);
  if (zero) std::memset(block, 0, size);
  else fill_words(block, 0, size, kAllocPattern);
  std::memset(block + size, kCanaryByte, page->block_bytes - size);
  return block;
}

// `capacity` (at least size) is what the block must hold: more than size when realloc leaves
// room to grow into; the canary covers the room.
void* alloc_large(size_t size, size_t capacity, size_t alignment, bool zero) {
  // At least page-aligned, so the block starts past the header's page: retire_large can then
  // make every page of the block inaccessible.
  if (alignment < os::page_size()) alignment = os::page_size();
  auto* p = static_cast<uint8_t*>(large_alloc(capacity + 1, alignment, zero));
  if (p == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  LargeHeader* header = large_mapping_of(p, chunk_kind(p));
  header->requested = size;
  if (!program_adopt_large(p)) {
    large_free(header);
    errno = ENOMEM;
    return nullptr;
  }
  if (!zero) fill_words(p, 0, size, kAllocPattern);
  std::memset(p + size, kCanaryByte, large_usable_size(header) - size);
  return p;
}

void* alloc_with_room(size_t size, size_t capacity, size_t alignment, bool zero) {
  if (capacity >= kMaxRequestBytes) {
    errno = ENOMEM;
    return nullptr;
  }
  const int size_class = debug_class(capacity + 1, alignment);
  if (size_class >= 0) return alloc_small(unsigned(size_class), size, zero);
  return alloc_large(size, capacity, alignment, zero);
}

// realloc's new size for a block that keeps its address: the bytes it gains read the
// allocation fill, the bytes it loses become canary. Only the canary it takes over is checked
// here (the whole of it would cost as much as a move: a block keeps room for half its size);
// the rest stays, and is checked at the block's free.
void resize_in_place(void* p, const LiveBlock& live, size_t size) {
  auto* bytes = static_cast<uint8_t*>(p);
  if (size > live.requested) {
    const size_t changed = first_changed_byte(bytes, live.requested, size, kCanaryByte);
    if (changed != kNone) report_overflow(p, live.requested, changed, live.page);
    fill_pattern(bytes, live.requested, size, kAllocPattern);
  } else {
    std::memset(bytes + size, kCanaryByte, live.requested - size);
  }
  if (live.header != nullptr) {
    live.header->requested = size;
    return;
  }
  uint32_t* state = &page_debug_states(live.page)[block_index(live.page, p)];
  uint32_t seen = live.state;
  // A free racing with the realloc (a bug of the program's) has marked the block free: leave it.
  __atomic_compare_exchange_n(state, &seen, uint32_t(size + 1), false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

}  // namespace

void* debug_alloc(size_t size, size_t alignment, bool zero) noexcept {
  if (tls_part == nullptr) return alloc_with_room(size, size, alignment, zero);
  program_check_alive(tls_part);
  // Seen by a reset or destroy of the heap meanwhile, which the program promised not to do.
  ProgramHeap* heap = tls_part->program.load(std::memory_order_relaxed);
  heap->allocating.fetch_add(1, std::memory_order_acq_rel);
  void* p = alloc_with_room(size, size, alignment, zero);
  heap->allocating.fetch_sub(1, std::memory_order_acq_rel);
  return p;
}

bool debug_retire_block(Page* page, Block* block) noexcept {
  uint32_t* state = &page_debug_states(page)[block_index(page, block)];
  uint32_t seen = state_load(page, block_index(page, block));
  // Not live, or freed meanwhile by a thread the program let run (that free has it).
  if (seen == kStateNever || seen == kStateFreed ||
      !__atomic_compare_exchange_n(state, &seen, kStateFreed, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return false;
  fill_words(reinterpret_cast<uint8_t*>(block), 0, page->block_bytes, kFreedPattern);
  return true;
}

void debug_free(void* p) noexcept {
  if (p == nullptr) return;
  LiveBlock live;
  if (!find_live("free", p, &live, true)) return;
  if (live.header != nullptr) {
    void* expected = p;
    // Exact even when two threads free the block at once: one of them finds it gone.
    if (!__atomic_compare_exchange_n(&live.header->user, &expected, nullptr, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return report_double_free("free", p, nullptr, live.header);
    check_canary(p, live);
    FreeStack* stack = free_stack_of(live.header);
    stack->depth = os::capture_stack(stack->frames, kDebugFreeStackFrames);
    retire_large(live.header, p);
    return;
  }
  Page* page = live.page;
  uint32_t* state = &page_debug_states(page)[block_index(page, p)];
  uint32_t seen = live.state;
  while (!__atomic_compare_exchange_n(state, &seen, kStateFreed, false, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE)) {
    if (seen == kStateFreed) return report_double_free("free", p, page, nullptr);
  }
  check_canary(p, live);
  fill_words(static_cast<uint8_t*>(p), 0, page->block_bytes, kFreedPattern);
  Heap* heap = own_heap();
  if (heap == nullptr) {  // out of memory for a heap: give the block back unquarantined
    heap_count_free(&g_empty_heap, page);
    heap_free_block(&g_empty_heap, page, static_cast<Block*>(p));
    return;
  }
  heap_count_free(heap, page);
  quarantine_push(heap, page, static_cast<Block*>(p));
}

void* debug_realloc(void* p, size_t size) noexcept {
  if (p == nullptr) return debug_alloc(size, 0, false);
  LiveBlock live;
  if (!find_live("realloc", p, &live, true)) {
    errno = EINVAL;
    return nullptr;
  }
  if (size == 0) {
    debug_free(p);
    return nullptr;
  }
  // In place: room for the size and a canary byte after it, and not a shrink that would leave
  // most of the block unused.
  if (size > kDebugReallocMoveBytes && size < live.block_bytes && size >= live.block_bytes / 2) {
    resize_in_place(p, live, size);
    return p;
  }
  // Moves: a caller that keeps using the old address reads the freed fill.
  const size_t room = size > kDebugReallocMoveBytes && size < kMaxRequestBytes
                          ? size / 100 * kDebugReallocRoomPercent : 0;
  const int saved_errno = errno;
  // A block of a program heap moves within it.
  TargetScope into(live.page != nullptr ? program_heap_of_page(live.page) : program_heap_of_large(live.header));
  void* fresh = alloc_with_room(size, size + room, 0, false);
  if (fresh == nullptr && room != 0) {  // no room to spare: the size alone, errno as it was
    errno = saved_errno;
    fresh = alloc_with_room(size, size, 0, false);
  }
  if (fresh == nullptr) return nullptr;
  std::memcpy(fresh, p, size < live.requested ? size : live.requested);
  debug_free(p);
  return fresh;
}

size_t debug_usable_size(const void* p) noexcept {
  LiveBlock live;
  return p != nullptr && find_live("", const_cast<void*>(p), &live, false) ? live.requested : 0;
}

void debug_prepare() noexcept {
  os::prepare_backtrace();
  os::set_fault_hook(on_fault);
}

namespace {
// At load time, before any report can be needed, while allocating is still harmless.
__attribute__((constructor)) void prepare_at_load() {
  if (option(Option::kDebug) != 0) debug_prepare();
}
}  // namespace

}  // namespace tray
