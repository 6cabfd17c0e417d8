#include "heap/program.hpp"

#include "heap/config.hpp"
#include "heap/heap.hpp"
#include "heap/page.hpp"
#include "heap/queue.hpp"
#include "heap/remote.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "stats/stats.hpp"

namespace tray {

__thread Heap* tls_part = nullptr;

__thread Heap* tls_last_part = nullptr;

namespace {

// Creating and reusing program heaps, and the list of every one ever made (outermost).
os::Mutex g_list_lock;
std::atomic<ProgramHeap*> g_created{nullptr};
ProgramHeap* g_spare_heaps = nullptr;
uint64_t g_serial = 0;
// Parts that serve no program heap (linked through next_part): taken by the next binding.
os::Mutex g_spare_lock;
Heap* g_spare_parts = nullptr;

void push_spare_part(Heap* part) {
  part->bound.store(nullptr, std::memory_order_relaxed);
  heap_set_owner_thread(part, 0);
  os::LockGuard guard(g_spare_lock);
  part->next_part = g_spare_parts;
  g_spare_parts = part;
}

Heap* take_spare_part() {
  os::LockGuard guard(g_spare_lock);
  Heap* part = g_spare_parts;
  if (part != nullptr) g_spare_parts = part->next_part;
  return part;
}

// The part's counters as they are now become its base. Dumps read the base while this runs.
void set_base(Heap* part) {
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    __atomic_store_n(&part->base.allocations[c], counter_read(part->counters.allocations[c]), __ATOMIC_RELAXED);
    __atomic_store_n(&part->base.frees[c], counter_read(part->counters.frees[c]), __ATOMIC_RELAXED);
  }
}

// The calling thread stops allocating into `part` if it did; its own heap takes over.
void stop_targeting(Heap* part) {
  if (tls_last_part == part) tls_last_part = nullptr;
  if (tls_part == part) program_target(nullptr);
}

// Takes `part` off the calling thread's list of bound parts.
void unlink_bound(Heap* own, Heap* part) {
  for (Heap** link = &own->bound_parts; *link != nullptr; link = &(*link)->next_bound) {
    if (*link == part) {
      *link = part->next_bound;
      part->next_bound = nullptr;
      return;
    }
  }
}

// Every page of the part, queued or full, leaves it: counted per class into `freed` (the
// blocks that were live), then carved afresh and kept, or given to the pool. With `keep` (a
// reset, or the part a destroying thread keeps for its next heap) the page each class
// allocated from stays, as in a running thread's heap, and other pages up to what a thread
// heap retains; without, none. Runs as the part's owner: its thread is not allocating (the
// program's promise).
void empty_part(Heap* part, bool keep, uint64_t* freed) {
  // Blocks freed earlier by other threads wait on the part's stack: back on their pages
  // first, and the slots' blocks too, so that what is left on a page is its live blocks; and
  // the frees of the part's own thread are counted before the pages start afresh.
  remote_drain(part);
  heap_settle(part);
  Page* heads[kSizeClassCount] = {};
  Page* pages = nullptr;  // every page, linked through `next`
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    if (keep && class_page(part, c) != &g_empty_page) heads[c] = class_page(part, c);
    while (Page* page = part->queues[c].head) {
      freed[c] += live_blocks(part, page);
      queue_remove(part, page);
      page->next = pages;
      pages = page;
    }
  }
  for (Page* page = part->full_pages; page != nullptr;) {
    Page* next = page->next;
    // A full page has every block carved and out; those freed since came back above and
    // took it back into its queue.
    freed[page->size_class] += page->capacity;
    page->next = pages;
    pages = page;
    page = next;
  }
  part->full_pages = nullptr;
  part->retained_bytes = 0;
  for (Page*& empty : part->big_empty) empty = nullptr;  // every page is dealt with below
  size_t kept = 0;
  while (Page* page = pages) {
    pages = page->next;
    page->next = page->prev = nullptr;
    page->used = 0;
    page->accounted = 0;
    page->retained = false;
    __atomic_store_n(&page->floating, false, __ATOMIC_RELAXED);  // takers read it atomically
    if (page == heads[page->size_class]) continue;  // back at the head below
    const size_t bytes = size_t(page->unit_count) * kUnitBytes;
    if (keep && kept + bytes <= kHeapRetainedBytes) {
      kept += bytes;
      page_recarve(page);
      page->retained = true;
      part->retained_bytes += bytes;
      queue_push_back(part, page);
    } else {
      page_release(page);
    }
  }
  // Each class allocates from the same page again, the next request without a slow path to
  // find one.
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    if (heads[c] == nullptr) continue;
    page_recarve(heads[c]);
    queue_push_front(part, heads[c]);
  }
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    part->sparse_head_free[c] = nullptr;
    part->sparse_head_since_ms[c] = 0;
  }
}

// What a reset or destroy freed is counted as freed by the calling thread, so that the
// process's live counts (allocations less frees, over every heap) fall with it; the heap's
// own count starts again from its parts' counters now.
void count_emptied(ProgramHeap* heap, const uint64_t* freed) {
  Heap* own = tls_own_heap;
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    heap->freed[c].store(0, std::memory_order_relaxed);
    if (freed[c] == 0) continue;
    if (own != nullptr) counter_add(own->counters.frees[c], freed[c]);
    else g_totals.classes[c].unowned_frees.fetch_add(freed[c], std::memory_order_relaxed);
  }
  for (Heap* part = heap->parts; part != nullptr; part = part->next_part) set_base(part);
}

// A checked part keeps every page, in its class, with its list (HeapUse::kChecked): its live
// blocks go onto their pages' lists, marked freed by the debug layer. Blocks in quarantines
// stay out: they come back when they leave it.
void empty_checked_part(Heap* part, RetireBlock retire, uint64_t* freed) {
  remote_drain(part);
  heap_settle(part);
  while (Page* page = part->full_pages) {
    part->full_pages = page->next;
    if (page->next != nullptr) page->next->prev = nullptr;
    page->next = page->prev = nullptr;
    __atomic_store_n(&page->floating, false, __ATOMIC_RELAXED);  // takers read it atomically
    page->used = page->capacity;  // every carved block is out
    queue_push_back(part, page);
  }
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    for (Page* page = part->queues[c].head; page != nullptr; page = page->next) {
      for (uint32_t i = 0; i < page->capacity; ++i) {
        auto* block = reinterpret_cast<Block*>(page->blocks + size_t(i) * page->block_bytes);
        if (!retire(page, block)) continue;
        link_store(page, block, page->free);
        page->free = block;
        --page->used;
        ++freed[c];
      }
      if (live_blocks(part, page) == 0 && page != class_page(part, c) && !page->retained) {
        page->retained = true;
        part->retained_bytes += size_t(page->unit_count) * kUnitBytes;
      }
    }
  }
}

// A reset keeps pages in every part; a destroy only in `keeper` (nullptr: none).
void empty_all(ProgramHeap* heap, bool reset, const Heap* keeper, RetireBlock retire) {
  uint64_t freed[kSizeClassCount] = {};
  for (Heap* part = heap->parts; part != nullptr; part = part->next_part) {
    if (part->checked) {
      TRAY_CHECK(retire != nullptr);
      empty_checked_part(part, retire, freed);
    } else {
      empty_part(part, reset || part == keeper, freed);
    }
  }
  count_emptied(heap, freed);
}

}  // namespace

ProgramHeap* program_heap_new() {
  os::LockGuard guard(g_list_lock);
  ProgramHeap* heap = g_spare_heaps;
  if (heap != nullptr) {
    g_spare_heaps = heap->next_spare;
    heap->next_spare = nullptr;
  } else {
    heap = new_metadata<ProgramHeap>();
    if (heap == nullptr) return nullptr;
    heap->next_created = g_created.load(std::memory_order_relaxed);
    g_created.store(heap, std::memory_order_release);
  }
  __atomic_store_n(&heap->serial, ++g_serial, __ATOMIC_RELAXED);  // dumps read it unlocked
  heap->magic.store(ProgramHeap::kLive, std::memory_order_release);
  return heap;
}

bool program_heap_live(const ProgramHeap* heap) {
  return heap != nullptr && heap->magic.load(std::memory_order_acquire) == ProgramHeap::kLive;
}

Heap* program_target(Heap* part) {
  Heap* previous = tls_part;
  tls_part = part;
  Heap* own = tls_own_heap;
  // A checked heap's thread keeps the empty heap on its fast paths (debug mode).
  if (own != nullptr && !own->checked) tls_heap = part != nullptr ? part : own;
  return previous;
}

Heap* program_part(ProgramHeap* heap) {
  Heap* own = tls_own_heap;
  if (Heap* last = tls_last_part;
      last != nullptr && last->program.load(std::memory_order_relaxed) == heap)
    return last;
  for (Heap** link = &own->bound_parts; *link != nullptr;) {
    Heap* part = *link;
    ProgramHeap* program = part->program.load(std::memory_order_acquire);
    if (program == heap) {
      tls_last_part = part;
      return part;
    }
    // Its heap was destroyed by another thread: spare now, unless this thread still has it
    // as its default, where the next allocation reports the destroyed heap.
    if (program == nullptr && part != tls_part) {
      *link = part->next_bound;
      part->next_bound = nullptr;
      if (tls_last_part == part) tls_last_part = nullptr;
      push_spare_part(part);
      continue;
    }
    link = &part->next_bound;
  }
  os::LockGuard guard(heap->lock);
  Heap* part = heap->parts;
  while (part != nullptr && part->bound.load(std::memory_order_relaxed) != nullptr) part = part->next_part;
  if (part == nullptr) {
    part = own->spare_part;
    own->spare_part = nullptr;
    if (part == nullptr) part = take_spare_part();
    if (part == nullptr) part = heap_create_part(own->checked);
    if (part == nullptr) return nullptr;
    set_base(part);
    part->next_part = heap->parts;
    heap->parts = part;
    part->program.store(heap, std::memory_order_release);
  }
  part->bound.store(own, std::memory_order_relaxed);
  heap_set_owner_thread(part, own->checked ? 0 : os::thread_pointer());
  part->next_bound = own->bound_parts;
  own->bound_parts = part;
  tls_last_part = part;
  return part;
}

void program_heap_reset(ProgramHeap* heap, RetireBlock retire) {
  os::LockGuard guard(heap->lock);
  empty_all(heap, true, nullptr, retire);
}

void program_heap_destroy(ProgramHeap* heap, RetireBlock retire) {
  {
    os::LockGuard guard(heap->lock);
    heap->magic.store(0, std::memory_order_release);
    Heap* own = tls_own_heap;
    // The caller's part keeps the pages its thread used (as a reset would), for the thread's
    // next heap: a heap per request then reuses the same warm pages, where taking them from
    // the pool each time moved them between threads, cold (request_heap --release destroy,
    // 2 threads: 17.6k requests/s, against 30.8k freeing block by block).
    Heap* keeper = nullptr;
    if (own != nullptr && own->spare_part == nullptr && !own->checked) {
      for (Heap* part = heap->parts; part != nullptr; part = part->next_part)
        if (part->bound.load(std::memory_order_relaxed) == own) keeper = part;
    }
    empty_all(heap, false, keeper, retire);
    for (Heap* part = heap->parts; part != nullptr;) {
      Heap* next = part->next_part;
      part->program.store(nullptr, std::memory_order_release);
      Heap* bound = part->bound.load(std::memory_order_relaxed);
      if (bound == own && own != nullptr) {
        stop_targeting(part);
        unlink_bound(own, part);
        if (part == keeper) {
          part->bound.store(nullptr, std::memory_order_relaxed);
          heap_set_owner_thread(part, 0);  // until the thread binds it for its next heap
          own->spare_part = part;
        } else {
          push_spare_part(part);
        }
      } else if (bound == nullptr) {
        push_spare_part(part);
      }
      // Bound to another thread: it takes the part off its list when it next looks there
      // (program_part) or ends.
      part = next;
    }
    heap->parts = nullptr;
  }
  os::LockGuard guard(g_list_lock);
  heap->next_spare = g_spare_heaps;
  g_spare_heaps = heap;
}

bool program_adopt_large(void* p) {
  Heap* part = tls_part;
  if (part == nullptr || p == nullptr) return true;
  const uint8_t kind = chunk_kind(p);
  if (kind == kChunkSegment || kind == kChunkGuard || kind == kChunkForeign) return true;
  return large_own(&part->program.load(std::memory_order_relaxed)->large, large_mapping_of(p, kind));
}

Heap* program_thread_heap() {
  if (Heap* own = tls_own_heap; own != nullptr) return own;
  return heap_attach_thread(debug_mode() ? HeapUse::kChecked : HeapUse::kFastPaths);
}

TargetScope::TargetScope(ProgramHeap* heap) {
  if (heap != nullptr && program_thread_heap() != nullptr) part_ = program_part(heap);
  if (part_ != nullptr) previous_ = program_target(part_);
}

ProgramHeap* program_heap_of_large(const LargeHeader* header) {
  if (header->owner == nullptr) return nullptr;
  return reinterpret_cast<ProgramHeap*>(reinterpret_cast<char*>(header->owner) - offsetof(ProgramHeap, large));
}

ProgramHeap* program_heap_of_page(const Page* page) {
  if (page->owner_kind != OwnerKind::kPart) return nullptr;
  return page->heap->program.load(std::memory_order_relaxed);
}

void program_free_block(Heap* self, Page* page, Block* block, bool counted) noexcept {
  Heap* part = page->heap;
  if (!counted) heap_count_free(self, page);
  if (ProgramHeap* program = part->program.load(std::memory_order_relaxed); program != nullptr)
    program->freed[page->size_class].fetch_add(1, std::memory_order_relaxed);
  // The part's own thread comes here only from debug mode's quarantine: its other frees of
  // the part's blocks take heap_free_remote's shortcut.
  if (Heap* own = tls_own_heap; own != nullptr && part->bound.load(std::memory_order_relaxed) == own)
    return page_free_local(part, page, block);
  // Alone onto the part's stack, never into a bucket: a reset finds there every block freed
  // before it, where a bucket could still hold one and send it after the page changed hands.
  remote_send(&g_empty_heap, page, block);
}

void program_check_alive(Heap* part) {
  if (part->program.load(std::memory_order_acquire) != nullptr) return;
  fatal("traymalloc: allocation into a destroyed heap: another thread destroyed the heap that "
        "this thread had as its default (tray_heap_set_default)");
}

void program_detach_thread(Heap* own) {
  while (Heap* part = own->bound_parts) {
    own->bound_parts = part->next_bound;
    part->next_bound = nullptr;
    heap_set_owner_thread(part, 0);
    if (ProgramHeap* program = part->program.load(std::memory_order_acquire); program != nullptr) {
      os::LockGuard guard(program->lock);
      // Still its heap's (no destroy came in between): unbound, for another thread to take,
      // with its pages and the blocks on them, its counts exact meanwhile.
      if (part->program.load(std::memory_order_relaxed) == program) {
        heap_settle(part);
        part->bound.store(nullptr, std::memory_order_relaxed);
        continue;
      }
    }
    push_spare_part(part);
  }
  tls_last_part = nullptr;
  if (tls_part != nullptr) program_target(nullptr);
  program_trim_thread(own);
}

bool program_trim_thread(Heap* own) {
  Heap* spare = own->spare_part;
  if (spare == nullptr) return false;
  own->spare_part = nullptr;
  uint64_t freed[kSizeClassCount] = {};  // a spare part holds no live block
  empty_part(spare, false, freed);
  push_spare_part(spare);
  return true;
}

void program_lock_for_fork() {
  g_list_lock.lock();
  for (ProgramHeap* heap = g_created.load(std::memory_order_acquire); heap != nullptr;
       heap = heap->next_created) {
    heap->lock.lock();
    heap->large.lock.lock();  // a leaf: its holders take nothing under it
  }
  g_spare_lock.lock();
}

void program_unlock_after_fork() {
  g_spare_lock.unlock();
  for (ProgramHeap* heap = g_created.load(std::memory_order_acquire); heap != nullptr;
       heap = heap->next_created) {
    heap->large.lock.unlock();
    heap->lock.unlock();
  }
  g_list_lock.unlock();
}

const ProgramHeap* program_heap_list() { return g_created.load(std::memory_order_acquire); }

bool program_heap_usage(const ProgramHeap* heap, ProgramHeapUsage* out) {
  if (!program_heap_live(heap)) return false;
  *out = ProgramHeapUsage{};
  out->serial = __atomic_load_n(&heap->serial, __ATOMIC_RELAXED);
  uint64_t units = 0;
  int64_t live[kSizeClassCount] = {};
  const Heap* own = tls_own_heap;
  for (const Heap* part = heap_list(); part != nullptr; part = part->next_created) {
    if (part->kind != OwnerKind::kPart || part->program.load(std::memory_order_relaxed) != heap) continue;
    const Heap* bound = part->bound.load(std::memory_order_relaxed);
    if (bound != nullptr) ++out->parts;
    units += counter_read(part->page_units);
    // A part of the calling thread's is read exactly; another thread's counts what its slots
    // hold as live, and not the frees into its pages since it last looked at them.
    Uncounted uncounted;
    if (bound == own && own != nullptr) heap_uncounted(part, &uncounted);
    for (unsigned c = 0; c < kSizeClassCount; ++c) {
      live[c] += int64_t(counter_read(part->counters.allocations[c]) - counter_read(part->base.allocations[c]));
      live[c] -= int64_t(counter_read(part->counters.frees[c]) - counter_read(part->base.frees[c]));
      live[c] += int64_t(uncounted.allocations[c]) - int64_t(uncounted.frees[c]);
    }
  }
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    live[c] -= int64_t(heap->freed[c].load(std::memory_order_relaxed));
    if (live[c] <= 0) continue;  // read while threads run: a moment's skew
    out->live_blocks += uint64_t(live[c]);
    out->live_bytes += uint64_t(live[c]) * class_size(c);
  }
  out->page_bytes = units * kUnitBytes;
  size_t blocks, bytes;
  large_owner_usage(&heap->large, &blocks, &bytes);
  out->large_blocks = blocks;
  out->large_bytes = bytes;
  return true;
}

}  // namespace tray
