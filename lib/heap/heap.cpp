#include "heap/heap.hpp"

#include <errno.h>

#include <new>

#include "events/events.hpp"
#include "heap/page.hpp"
#include "heap/program.hpp"
#include "heap/queue.hpp"
#include "heap/refill.hpp"
#include "heap/remote.hpp"
#include "heap/reuse.hpp"
#include "heap/sample_countdown.hpp"
#include "heap/sparse.hpp"
#include "large/large.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "span/span.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

void (*g_locked_heap_free)(Block*) = nullptr;

}  // namespace

constinit Heap g_empty_heap{&g_empty_page};
__thread Heap* tls_heap = &g_empty_heap;
__thread Heap* tls_own_heap = nullptr;

namespace {

// Heaps without a thread, a stack: an exiting thread pushes its heap with a compare-and-swap,
// and taking heaps off (one for a starting thread, or all of them to collect) holds the lock,
// so no popper can meet a heap that another popper took and pushed again in between (ABA).
os::Mutex g_heaps_lock;           // popping from g_parked, and metadata memory
std::atomic<Heap*> g_parked{nullptr};
std::atomic<Heap*> g_all_heaps{nullptr};
char* g_meta_cursor = nullptr;    // metadata bump allocation
char* g_meta_end = nullptr;
std::atomic<uint64_t> g_last_collect_ms{0};
// One collection of parked heaps at a time, taken before g_heaps_lock. A collection holds the
// heaps it works on off the stack, so a trim waits for one under way; the purger and threads'
// slow paths leave the work to it.
os::Mutex g_collect_lock;

// Returns every page of the heap that holds no live block (after taking in remote frees).
// A checked heap keeps them: a page that changed class could turn a stale pointer into a valid
// block of another size, and a double free into a free of somebody else's block.
bool release_empty_pages(Heap* heap) {
  remote_drain(heap);
  if (heap->checked) return false;
  heap_settle(heap);  // a slot's blocks are free blocks of its page
  bool released = sparse_give_back_big(heap);
  heap->big_free_held = false;
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    for (Page* page = heap->queues[c].head; page != nullptr;) {
      Page* next = page->next;
      if (live_blocks(heap, page) == 0) {
        release_page(heap, page);
        released = true;
      }
      page = next;
    }
  }
  return released;
}

void park(Heap* first, Heap* last) {
  Heap* head = g_parked.load(std::memory_order_relaxed);
  do {
    last->next_abandoned = head;
  } while (!g_parked.compare_exchange_weak(head, first, std::memory_order_release,
                                           std::memory_order_relaxed));
}

// Parked heaps get no slow path of their own: remote frees into them would wait for the next
// thread to start. Threads that need a page (and the idle purger) take them back now and then,
// and give back the empty pages of heaps that no thread adopted within kPurgeDelayMs. Returns
// when a parked heap's retained pages will be due, or kNeverMs. Only the heaps with work
// leave the parked stack, each going back as soon as it is done: a thread that starts during a
// collection still finds the others to adopt instead of making a new heap.
uint64_t collect_parked_locked(bool every_heap, bool* released) {
  const uint64_t now = os::now_ms();
  auto needs_work = [&](const Heap* heap) {
    return every_heap || heap->remote_free.load(std::memory_order_relaxed) != nullptr ||
           ((heap->retained_bytes != 0 || heap->big_free_held) && now - heap->parked_ms >= kPurgeDelayMs);
  };
  Heap* work = nullptr;
  {
    os::LockGuard guard(g_heaps_lock);
    Heap* taken = g_parked.exchange(nullptr, std::memory_order_acquire);
    if (taken == nullptr) return kNeverMs;
    Heap* idle_first = nullptr;
    Heap* idle_last = nullptr;
    for (Heap* heap = taken; heap != nullptr;) {
      Heap* next = heap->next_abandoned;
      if (needs_work(heap)) {
        heap->next_abandoned = work;
        work = heap;
      } else {
        heap->next_abandoned = idle_first;
        if (idle_first == nullptr) idle_last = heap;
        idle_first = heap;
      }
      heap = next;
    }
    if (idle_first != nullptr) park(idle_first, idle_last);
  }
  while (work != nullptr) {
    Heap* heap = work;
    work = heap->next_abandoned;
    *released |= release_empty_pages(heap);
    park(heap, heap);
  }
  // The stack holds every heap again but those adopted meanwhile, whose pages are their
  // threads' business now.
  uint64_t due = kNeverMs;
  os::LockGuard guard(g_heaps_lock);
  for (Heap* heap = g_parked.load(std::memory_order_acquire); heap != nullptr;
       heap = heap->next_abandoned)
    if (heap->retained_bytes != 0 || heap->big_free_held) due = std::min(due, heap->parked_ms + kPurgeDelayMs);
  return due;
}

uint64_t collect_parked(bool every_heap, bool* released) {
  if (every_heap) {
    os::LockGuard guard(g_collect_lock);
    return collect_parked_locked(true, released);
  }
  // The one collecting may leave retained pages that come due later: look again then.
  if (!g_collect_lock.try_lock()) return os::now_ms() + kPurgeDelayMs;
  const uint64_t due = collect_parked_locked(false, released);
  g_collect_lock.unlock();
  return due;
}

}  // namespace

void heap_collect_parked_when_due() {
  if (g_totals.heaps_abandoned.load(std::memory_order_relaxed) == 0) return;
  const uint64_t now = os::now_ms();
  uint64_t last = g_last_collect_ms.load(std::memory_order_relaxed);
  if (now - last < kPurgeDelayMs) return;
  if (!g_last_collect_ms.compare_exchange_strong(last, now, std::memory_order_relaxed)) return;
  bool released = false;
  collect_parked(false, &released);
}

namespace {

// A parked heap keeps at most kHeapRetainedBytes of empty pages, the pages its classes were
// allocating from counted in: those are not `retained`, and in classes of big blocks (pages of
// up to 16 units) a heap left with one per class held 5 MiB of empty pages in mstress while the
// threads still running took fresh ones from the pool. What goes back now waits there dirty,
// so the others reuse it without faulting it in.
void trim_parked_empty(Heap* heap) {
  if (heap->checked) return;
  size_t kept = heap->retained_bytes;
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    Page* page = class_page(heap, c);
    if (page == &g_empty_page || page->retained || live_blocks(heap, page) != 0) continue;
    const size_t bytes = size_t(page->unit_count) * kUnitBytes;
    if (kept + bytes <= kHeapRetainedBytes) kept += bytes;
    else release_page(heap, page);
  }
}

// --- thread life cycle -------------------------------------------------------------------
// A heap's kind is fixed before it joins the list, which dumps walk.
Heap* heap_new_locked(OwnerKind kind = OwnerKind::kThread) {
  const size_t bytes = align_up(sizeof(Heap), kCacheLineBytes);
  if (size_t(g_meta_end - g_meta_cursor) < bytes) {
    auto* chunk = static_cast<char*>(os::map(kMetaChunkBytes));
    if (chunk == nullptr) return nullptr;
    count_add(g_totals.bytes_metadata, kMetaChunkBytes);
    g_meta_cursor = chunk;
    g_meta_end = chunk + kMetaChunkBytes;
  }
  Heap* heap = new (g_meta_cursor) Heap(&g_empty_page);
  heap->kind = kind;
  heap_set_checked(heap, false);
  g_meta_cursor += bytes;
  span_cache_register(&heap->span_cache);
  count_add(g_totals.heaps_created, 1);
  heap->next_created = g_all_heaps.load(std::memory_order_relaxed);
  g_all_heaps.store(heap, std::memory_order_release);
  return heap;
}

}  // namespace

Heap* heap_create_part(bool checked) {
  os::LockGuard guard(g_heaps_lock);
  Heap* heap = heap_new_locked(OwnerKind::kPart);
  if (heap == nullptr) return nullptr;
  heap_set_checked(heap, checked);
  return heap;
}

void heap_page_event(Heap* heap, Page* page) noexcept {
  if (page->floating) page_unfloat(heap, page);
  if (page->used == 0) {  // never the head: its extra count keeps it above zero
    page_account(heap, page);
    const size_t bytes = size_t(page->unit_count) * kUnitBytes;
    if (heap->retained_bytes + bytes <= kHeapRetainedBytes || heap->checked) {
      page->retained = true;
      heap->retained_bytes += bytes;
      // Debug mode checks each block's link when it hands the block out again; a checked
      // heap's pages keep their lists as they are.
      if (page->came_home && !heap->checked) page_recarve(page);
    } else if (is_big_class(page->size_class)) {
      sparse_big_page_emptied(heap, page);  // its pages are bigger than the budget
    } else {
      release_page(heap, page);
    }
  }
}

namespace {

TRAY_NOINLINE void send_and_take_in(Heap* self, Page* page, Block* block) {
  if (reuse_wanted(self)) reuse_free(self, page, block);
  else remote_send(self, page, block);
  remote_drain(self);
}

// heap_free_remote's cases other than a thread with a heap freeing another heap's block.
TRAY_NOINLINE void free_remote_unusual(Page* page, Block* block) {
  // A thread that frees what others allocated, and never allocated itself (a consumer), gets a
  // heap here: without buckets to gather in, each block went home alone, a compare-and-swap on
  // the owner's stack per free and a one-block run for the owner to take in.
  if (TRAY_UNLIKELY(tls_heap == &g_empty_heap) && tls_own_heap == nullptr) heap_attach_thread(HeapUse::kFastPaths);
  // A thread whose default is a program heap frees as itself: its part counts only the
  // program heap's blocks, and gathers nothing for other owners.
  Heap* self = tls_heap->kind == OwnerKind::kPart ? tls_own_heap : tls_heap;
  if (page->owner_kind == OwnerKind::kPart) return program_free_block(self, page, block, false);
  // A block of the thread's own heap (freed while a program heap is its default) is counted
  // with its page (page_account), as the fast path's frees are.
  if (page->heap != self || heap_counts_at_call(self)) heap_count_free(self, page);
  if (TRAY_UNLIKELY(page->owner_kind == OwnerKind::kLocked)) return g_locked_heap_free(block);
  heap_free_block(self, page, block);
  if (has_remote_frees(self)) remote_drain(self);
}

}  // namespace

// The common case ends in a tail call to remote_send, and the rest leaves through another:
// with calls in its body, every foreign free saved and restored three registers here.
void heap_free_remote(Page* page, Block* block) noexcept {
  free_key_check_and_set(page, block);
  Heap* self = tls_heap;
  Heap* owner = page->heap;
  // A block of a program heap freed by the thread that allocated it, with another heap as its
  // default: what the fast path does, one test later.
  if (page->owner_kind == OwnerKind::kPart && owner->bound.load(std::memory_order_relaxed) == tls_own_heap &&
      tls_own_heap != nullptr)
    return page_free_local(owner, page, block);
  if (TRAY_UNLIKELY(self == &g_empty_heap || owner == self ||
                    page->owner_kind != OwnerKind::kThread || self->kind != OwnerKind::kThread))
    return free_remote_unusual(page, block);
  counter_add(self->counters.frees[page->size_class], 1);
  counter_add(self->counters.remote_frees, 1);
  if (TRAY_UNLIKELY(has_remote_frees(self))) return send_and_take_in(self, page, block);
  if (TRAY_UNLIKELY(reuse_wanted(self))) return reuse_free(self, page, block);
  remote_send(self, page, block);
}

void heap_free_home(Heap* self, Page* page, Block* block) noexcept {
  free_key_check_and_set(page, block);
  // Big classes' pages carry no thread: their frees come here (tails.cpp).
  if (is_big_class(page->size_class)) sparse_big_freed(self, page);
  page_free_local(self, page, block);
}

void heap_count_free(Heap* self, const Page* page) noexcept {
  if (self == &g_empty_heap) {
    g_totals.classes[page->size_class].unowned_frees.fetch_add(1, std::memory_order_relaxed);
    count_add(g_totals.unowned_remote_frees, 1);
    return;
  }
  counter_add(self->counters.frees[page->size_class], 1);
  // A block of a part bound to this thread is its own, even while another heap is its default.
  if (page->heap != self && page->heap->bound.load(std::memory_order_relaxed) != self)
    counter_add(self->counters.remote_frees, 1);
}

void heap_free_block(Heap* self, Page* page, Block* block) noexcept {
  Heap* owner = page->heap;
  if (owner == self) return page_free_local(self, page, block);
  free_key_set(page, block);
  if (page->owner_kind == OwnerKind::kPart) return program_free_block(self, page, block, true);
  remote_send(self, page, block);
}

Heap* heap_attach_thread(HeapUse use) {
  Heap* heap;
  {
    os::LockGuard guard(g_heaps_lock);
    heap = g_parked.load(std::memory_order_acquire);
    while (heap != nullptr && !g_parked.compare_exchange_weak(heap, heap->next_abandoned,
                                                              std::memory_order_acquire)) {
    }
    if (heap != nullptr) {
      heap->next_abandoned = nullptr;
      count_sub(g_totals.heaps_abandoned, 1);
    } else {
      heap = heap_new_locked();
      if (heap == nullptr) return nullptr;
    }
  }
  tls_own_heap = heap;
  // Set on a new heap only: debug mode is fixed before the first heap, so an adopted one has
  // it already, and other threads' frees into it read it (remote.cpp) while it is adopted.
  const bool checked = use == HeapUse::kChecked;
  if (heap->checked != checked) heap_set_checked(heap, checked);
  if (!checked) {
    tls_heap = heap;
    heap_set_owner_thread(heap, os::thread_pointer());
    span_cache_attach(&heap->span_cache);
  }
  if (!tls_in_purger) count_add(g_totals.threads_attached, 1);
  g_events.heap_attached(heap);
  return heap;
}

Heap* heap_create_locked(void (*free_block)(Block*)) {
  os::LockGuard guard(g_heaps_lock);
  TRAY_CHECK(g_locked_heap_free == nullptr);  // one per process
  Heap* heap = heap_new_locked(OwnerKind::kLocked);
  if (heap == nullptr) return nullptr;
  g_locked_heap_free = free_block;
  return heap;
}

// The heap keeps its retained empty pages: the next thread to start adopts them with the heap,
// instead of taking them back from the pool (collect_parked gives them back if none comes).
void heap_detach_thread(Heap* heap) {
  // First: the thread pointer may come back for a thread created after this one ends.
  heap_set_owner_thread(heap, 0);
  program_detach_thread(heap);
  reuse_spill_all(heap);
  heap->reuse_on = false;  // the next thread shows what it does before it keeps anything
  heap->reuse_epochs = 0;
  heap->reuse_left = 1;
  remote_flush(heap);
  remote_drain(heap);
  // Settling returns what a slot holds: a slot's list of another heap's blocks goes home.
  heap_settle(heap);
  remote_flush(heap);
  trim_parked_empty(heap);
  if (tls_span_cache == &heap->span_cache) span_cache_attach(nullptr);
  if (tls_heap == heap) tls_heap = &g_empty_heap;
  if (tls_own_heap == heap) tls_own_heap = nullptr;
  // The purger stays while the program has a thread with a heap (purge/purger.cpp): when the last
  // one ends, it must not keep the process alive.
  if (!tls_in_purger &&
      g_totals.threads_attached.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
      g_purger_state.load(std::memory_order_relaxed) == PurgerState::kRunning)
    purger_wake();
  count_add(g_totals.threads_exited, 1);
  // Read before parking: from then on the next thread to start may own the heap.
  heap->big_free_held = sparse_big_free_held(heap);
  const bool holds_pages = heap->retained_bytes != 0 || heap->big_free_held;
  heap->parked_ms = os::now_ms();
  count_add(g_totals.heaps_abandoned, 1);
  park(heap, heap);
  if (holds_pages) purger_notify();
}

bool heap_threads_attached() {
  return g_totals.threads_attached.load(std::memory_order_seq_cst) != 0;
}

void heap_sample_peak(unsigned size_class) {
  ClassTotals& totals = g_totals.classes[size_class];
  uint64_t live = 0;
  for (const Heap* heap = heap_list(); heap != nullptr; heap = heap->next_created)
    live += counter_read(heap->counters.allocations[size_class]) -
            counter_read(heap->counters.frees[size_class]);
  live -= totals.unowned_frees.load(std::memory_order_relaxed);
  // Counters read while their threads run can be a little off, or even add up to less than
  // zero for a moment; a peak is only a high-water mark, so such a sample is skipped.
  if (int64_t(live) > 0) count_max(totals.peak_live_blocks, live);
}

const Heap* heap_list() { return g_all_heaps.load(std::memory_order_acquire); }

bool heap_trim() {
  bool released = false;
  if (Heap* own = tls_own_heap; own != nullptr) {
    reuse_spill_all(own);
    remote_flush(own);
    released |= release_empty_pages(own);
    released |= sparse_pass(own, true);
    for (Heap* part = own->bound_parts; part != nullptr; part = part->next_bound) {
      if (part->program.load(std::memory_order_relaxed) == nullptr) continue;
      released |= release_empty_pages(part);
      released |= sparse_pass(part, true);
    }
    released |= program_trim_thread(own);
  }
  collect_parked(true, &released);
  return released;
}

void heap_exchange_remote() noexcept {
  Heap* heap = tls_own_heap;
  if (heap == nullptr || heap->checked) return;
  remote_flush(heap);
  if (heap->remote_free.load(std::memory_order_relaxed) != nullptr) remote_drain(heap);
  sparse_pass(heap, false);
}

uint64_t heap_collect_idle() {
  if (g_totals.heaps_abandoned.load(std::memory_order_relaxed) == 0) return kNeverMs;
  bool released = false;
  return collect_parked(false, &released);
}

void heap_lock_for_fork() {
  g_collect_lock.lock();
  g_heaps_lock.lock();
}

void heap_forget_threads_after_fork(uintptr_t keep) {
  for (Heap* heap = g_all_heaps.load(std::memory_order_relaxed); heap != nullptr; heap = heap->next_created)
    if (heap->owner_thread != keep) heap->owner_thread = 0;
}

// In the child, threads other than the forking one do not exist. Their heaps may have been
// caught halfway through a fast-path update, so they are left as they are, never parked or
// handed out again: their pages stay allocated, and freeing their blocks works (remote frees).
void heap_unlock_after_fork() {
  g_heaps_lock.unlock();
  g_collect_lock.unlock();
}

}  // namespace tray
