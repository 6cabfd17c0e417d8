#include "heap/hardening.hpp"

#include <atomic>

#include "core/core.hpp"
#include "platform/platform.hpp"

namespace tray {

namespace {

// Drawn from the OS at the first page; every page's keys mix it with the page's address and a
// count, so that no two pages, in this process or another, share a key.
constinit std::atomic<uint64_t> g_link_secret{0};
constinit std::atomic<uint64_t> g_pages_armed{0};

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The inverse of an odd number modulo 2^64, by Newton's iteration: each step doubles the bits
// that are right, and an odd x is its own inverse to 3 bits.
uint64_t inverse_of_odd(uint64_t x) {
  uint64_t inverse = x;
  for (int i = 0; i < 5; ++i) inverse *= 2 - x * inverse;
  return inverse;
}

[[noreturn]] void report_and_abort(const char* what, const void* block, const Page* page,
                                   const char* detail) {
  char storage[320];
  TextBuffer text(storage, sizeof storage);
  text.str("traymalloc: ").str(what).ptr(block).str(" (size class ");
  text.dec(page->block_bytes).str(" B)").str(detail).str("\n");
  fatal_misuse(text);
}

}  // namespace

void page_arm_checks(Page* page) {
  page->limit = reinterpret_cast<uintptr_t>(page->blocks) + uintptr_t(page->reserved) * page->block_bytes;
  page->start_divisor = ~uint64_t{0} / page->block_bytes + 1;
  page->start_bound = page->start_divisor - 1;
  if constexpr (!kHardening) return;
  uint64_t secret = g_link_secret.load(std::memory_order_relaxed);
  if (secret == 0) {
    // Two threads may race here; each page keeps the keys it was given, so either value works.
    secret = os::random_u64() | 1;
    g_link_secret.store(secret, std::memory_order_relaxed);
  }
  const uint64_t count = g_pages_armed.fetch_add(1, std::memory_order_relaxed);
  page->link_key = mix64(secret ^ mix64(reinterpret_cast<uintptr_t>(page) + count)) | 1;
  page->link_unkey = inverse_of_odd(page->link_key);
}

void report_corrupted_list(const Page* page, const void* link, const void* holder) {
  char storage[320];
  TextBuffer text(storage, sizeof storage);
  text.str("traymalloc: free list corrupted: a write after free or an overflow (size class ");
  text.dec(page->block_bytes).str(" B, page of blocks at ").ptr(page->blocks).str("): ");
  if (holder != nullptr) text.str("the link in free block ").ptr(holder).str(" leads to ");
  else text.str("the next block to hand out would be ");
  text.ptr(link).str(", outside the page\n");
  fatal_misuse(text);
}

Page* page_of_linked_block(const Heap* owner, Block* target, const Block* holder) {
  if constexpr (kHardening) {
    // Past the 48-bit space the unit map has no entry (segment.hpp).
    if (TRAY_UNLIKELY(reinterpret_cast<uintptr_t>(target) >> kUnitMapAddressBits != 0))
      report_corrupted_list(unit_page_of(holder), target, holder);
  }
  Page* page = unit_page_of(target);
  if constexpr (kHardening) {
    if (TRAY_UNLIKELY(page->heap != owner || !is_free_block(page, target)))
      report_corrupted_list(holder != nullptr ? unit_page_of(holder) : page, target, holder);
  }
  return page;
}

#if TRAY_HARDENING
void report_release_double_free(const void* block, const Page* page) {
  report_and_abort("double free of ", block, page, "");
}

void report_release_realloc_of_freed(const void* block, const Page* page) {
  report_and_abort("realloc of freed block ", block, page, "");
}

void report_interior_free(const char* call, const void* pointer, const Page* page) {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(pointer) - reinterpret_cast<uintptr_t>(page->blocks);
  const void* block = page->blocks + offset / page->block_bytes * page->block_bytes;
  char storage[320];
  TextBuffer text(storage, sizeof storage);
  text.str("traymalloc: ").str(call).str(" of invalid pointer ").ptr(pointer);
  text.str(": not the start of a block (").dec(offset % page->block_bytes).str(" bytes into block ");
  text.ptr(block).str(" of size class ").dec(page->block_bytes).str(" B)\n");
  fatal_misuse(text);
}
#endif

void report_sparse_block_reused(const void* block, const Page* page) {
  report_and_abort("double free of ", block, page, ", or a write after free: its OS page had been given back");
}

}  // namespace tray
