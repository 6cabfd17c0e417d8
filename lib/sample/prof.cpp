#include "sample/prof.hpp"

#include <bit>
#include <cstring>

#include "events/events.hpp"
#include "heap/heap.hpp"
#include "large/large.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

// The heap that sampled small blocks come from (heap_create_locked); nullptr until the first
// sample.
std::atomic<Heap*> g_prof_heap{nullptr};

// A live sampled allocation, in an open-addressing table keyed by the block's address.
struct LiveEntry {
  void* block;     // nullptr: the slot is empty
  uint64_t size;   // bytes requested
  uint64_t weight; // estimated allocations it stands for (kProfWeightOne)
  uint32_t stack;
  // The program heap a small block was allocated into (its large blocks are their owner's):
  // it frees the block with the rest. nullptr: none.
  const ProgramHeap* owner;
};

constexpr size_t kStackIndexSlots = kProfStackSlots * 2;  // at most half full
static_assert(std::has_single_bit(kProfLiveSlots) && std::has_single_bit(kProfLiveFirstSlots) &&
              kProfLiveFirstSlots <= kProfLiveSlots && std::has_single_bit(kStackIndexSlots));

// Small sampled blocks freed since the last take-in, linked through their first word. A free
// only pushes here, so freeing a sampled block takes no lock; the block reaches g_prof_heap
// again only after take_in_freed has removed it from the table under g_lock, so no address is
// handed out, sampled and recorded while the table still holds it.
std::atomic<Block*> g_freed{nullptr};

os::Mutex g_lock;                   // everything below, and allocation from g_prof_heap
ProfStack* g_stacks = nullptr;      // kProfStackSlots, filled in order
uint32_t* g_stack_index = nullptr;  // stack number + 1 by hash; 0: empty
LiveEntry* g_live = nullptr;
size_t g_live_slots = 0;            // a power of two, up to kProfLiveSlots
size_t g_live_used = 0;
Block* g_forgotten = nullptr;       // taken in from g_freed, not yet back in g_prof_heap
uint64_t g_live_estimate = 0;       // estimated bytes of every live sample
std::atomic<size_t> g_stack_count{0};
std::atomic<uint64_t> g_dropped{0};
std::atomic<uint64_t> g_peak_estimate{0};
std::atomic<uint64_t> g_rate{0};

// The tables and the heap, at the first sample (under g_lock).
bool ready() {
  if (g_live != nullptr) return true;
  Heap* heap = heap_create_locked(prof_free);
  auto* stacks = static_cast<ProfStack*>(map_metadata(kProfStackSlots * sizeof(ProfStack)));
  auto* index = static_cast<uint32_t*>(map_metadata(kStackIndexSlots * sizeof(uint32_t)));
  auto* live = static_cast<LiveEntry*>(map_metadata(kProfLiveFirstSlots * sizeof(LiveEntry)));
  if (heap == nullptr || stacks == nullptr || index == nullptr || live == nullptr) return false;
  g_prof_heap.store(heap, std::memory_order_relaxed);
  g_stacks = stacks;
  g_stack_index = index;
  g_live = live;
  g_live_slots = kProfLiveFirstSlots;
  return true;
}

// 1 - e^-x for x >= 0, without libm (see sample.cpp's log_unit for why): a series while x is
// small, where 1 - e^-x would cancel; otherwise e^-x = 2^-k * e^-r with r below ln 2.
double one_minus_exp_neg(double x) {
  // The series stop once a term no longer changes the sum: for the usual block, a small share
  // of the sampling interval, that is after a few terms, not twenty divisions.
  if (x < 0.5) {
    double term = x, sum = x;
    for (int n = 2; n < 20 && sum + term != sum; ++n) {
      term *= -x / n;
      sum += term;
    }
    return sum;
  }
  if (x > 700) return 1;
  constexpr double kLn2 = 0.6931471805599453;
  const int k = int(x / kLn2);
  const double r = x - k * kLn2;
  double term = 1, exp_neg_r = 1;
  for (int n = 1; n < 20 && exp_neg_r + term != exp_neg_r; ++n) {
    term *= -r / n;
    exp_neg_r += term;
  }
  const double scale = std::bit_cast<double>(uint64_t(1023 - k) << 52);  // 2^-k
  return 1 - exp_neg_r * scale;
}

// How many allocations of `size` bytes one sample stands for at mean interval `rate`: one in
// 1 / (1 - e^(-size/rate)) of them is sampled (the chance that a point of the sampler's
// Poisson process falls in its bytes), so weighting each by that keeps the sums unbiased.
uint64_t weight_of(uint64_t size, uint64_t rate) {
  const double chance = one_minus_exp_neg(double(size != 0 ? size : 1) / double(rate));
  return uint64_t(double(kProfWeightOne) / chance + 0.5);
}

uint64_t estimate_of(uint64_t size, uint64_t weight) {
  return uint64_t((unsigned __int128)size * weight / kProfWeightOne);
}

uint64_t hash_stack(void* const* frames, int depth) {
  uint64_t hash = 0x9E3779B97F4A7C15ULL ^ uint64_t(depth);
  for (int i = 0; i < depth; ++i) {
    hash ^= reinterpret_cast<uintptr_t>(frames[i]);
    hash *= 0xBF58476D1CE4E5B9ULL;
    hash ^= hash >> 29;
  }
  return hash;
}

constexpr uint32_t kNoStack = ~uint32_t{0};

uint32_t find_or_add_stack(void* const* frames, int depth) {
  const uint64_t hash = hash_stack(frames, depth);
  for (size_t slot = hash & (kStackIndexSlots - 1);; slot = (slot + 1) & (kStackIndexSlots - 1)) {
    const uint32_t entry = g_stack_index[slot];
    if (entry == 0) break;
    const ProfStack& stack = g_stacks[entry - 1];
    if (stack.hash == hash && stack.depth == depth &&
        std::memcmp(stack.frames, frames, size_t(depth) * sizeof(void*)) == 0)
      return entry - 1;
  }
  const size_t count = g_stack_count.load(std::memory_order_relaxed);
  if (count == kProfStackSlots) return kNoStack;
  ProfStack& stack = g_stacks[count];
  stack.hash = hash;
  stack.depth = depth;
  std::memcpy(stack.frames, frames, size_t(depth) * sizeof(void*));
  size_t slot = hash & (kStackIndexSlots - 1);
  while (g_stack_index[slot] != 0) slot = (slot + 1) & (kStackIndexSlots - 1);
  g_stack_index[slot] = uint32_t(count + 1);
  g_stack_count.store(count + 1, std::memory_order_release);  // dumps may read it now
  return uint32_t(count);
}

size_t live_home(const void* block) {
  const uint64_t key = (reinterpret_cast<uintptr_t>(block) >> 4) * 0x9E3779B97F4A7C15ULL;
  return size_t(key >> (64 - std::countr_zero(g_live_slots)));
}

size_t live_next(size_t slot) { return (slot + 1) & (g_live_slots - 1); }

void live_insert(const LiveEntry& entry) {
  size_t slot = live_home(entry.block);
  while (g_live[slot].block != nullptr) slot = live_next(slot);
  g_live[slot] = entry;
}

// Room for one more live sample: the table doubles when three quarters full, up to
// kProfLiveSlots. False when it is full at that size (or no memory is left).
bool live_room() {
  if (g_live_used < g_live_slots / 4 * 3) return true;
  if (g_live_slots == kProfLiveSlots) return false;
  auto* bigger = static_cast<LiveEntry*>(map_metadata(g_live_slots * 2 * sizeof(LiveEntry)));
  if (bigger == nullptr) return false;
  LiveEntry* old = g_live;
  const size_t old_slots = g_live_slots;
  g_live = bigger;
  g_live_slots = old_slots * 2;
  for (size_t i = 0; i < old_slots; ++i)
    if (old[i].block != nullptr) live_insert(old[i]);
  os::unmap(old, old_slots * sizeof(LiveEntry));
  count_sub(g_totals.bytes_metadata, old_slots * sizeof(LiveEntry));
  return true;
}

void add(std::atomic<uint64_t>& counter, uint64_t n) {
  counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
void sub(std::atomic<uint64_t>& counter, uint64_t n) {
  counter.store(counter.load(std::memory_order_relaxed) - n, std::memory_order_relaxed);
}

// The live counts of every stack, kept as the peak profile (prof_peak=1).
void copy_peak() {
  const size_t count = g_stack_count.load(std::memory_order_relaxed);
  for (size_t i = 0; i < count; ++i) {
    ProfStack& stack = g_stacks[i];
    stack.peak_count.store(stack.live_count.load(std::memory_order_relaxed), std::memory_order_relaxed);
    stack.peak_bytes.store(stack.live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  g_peak_estimate.store(g_live_estimate, std::memory_order_relaxed);
}

void remember(void* block, uint64_t size, uint32_t stack_number, uint64_t rate) {
  const uint64_t weight = weight_of(size, rate);
  const uint64_t estimate = estimate_of(size, weight);
  const ProgramHeap* owner = nullptr;
  if (tls_part != nullptr && chunk_kind(block) == kChunkSegment)
    owner = tls_part->program.load(std::memory_order_relaxed);
  live_insert(LiveEntry{block, size, weight, stack_number, owner});
  ++g_live_used;
  ProfStack& stack = g_stacks[stack_number];
  add(stack.live_count, 1);
  add(stack.live_bytes, size);
  add(stack.live_weight, weight);
  add(stack.live_estimate, estimate);
  add(stack.total_count, 1);
  add(stack.total_bytes, size);
  g_live_estimate += estimate;
  const uint64_t peak = g_peak_estimate.load(std::memory_order_relaxed);
  if (option(Option::kProfPeak) != 0 && g_live_estimate > peak + peak / 100 * kProfPeakStepPercent)
    copy_peak();
}

// Linear probing with backward-shift deletion: no tombstones to slow later lookups.
void erase_slot(size_t hole) {
  for (size_t next = live_next(hole); g_live[next].block != nullptr; next = live_next(next)) {
    const size_t home = live_home(g_live[next].block);
    // Move the entry back unless its home lies cyclically in (hole, next].
    const bool stays = hole <= next ? (home > hole && home <= next) : (home > hole || home <= next);
    if (!stays) {
      g_live[hole] = g_live[next];
      hole = next;
    }
  }
  g_live[hole].block = nullptr;
  --g_live_used;
}

// Removes the block's sample from the table (under g_lock); a block not in it is ignored.
void forget(const void* block) {
  for (size_t slot = live_home(block); g_live[slot].block != nullptr; slot = live_next(slot)) {
    if (g_live[slot].block != block) continue;
    const LiveEntry entry = g_live[slot];
    const uint64_t estimate = estimate_of(entry.size, entry.weight);
    ProfStack& stack = g_stacks[entry.stack];
    sub(stack.live_count, 1);
    sub(stack.live_bytes, entry.size);
    sub(stack.live_weight, entry.weight);
    sub(stack.live_estimate, estimate);
    g_live_estimate -= estimate;
    erase_slot(slot);
    return;
  }
}

// The blocks freed since the last take-in leave the table (under g_lock). They wait in
// g_forgotten for return_forgotten: a dump may run this in a signal handler, where the
// heap's page events (which can reach the segment pool's lock) must not run.
// Their links, like free lists', are encoded with the key of the block's page and checked
// when followed (heap/hardening.hpp): a sampled block written after its free must not lead
// the take-in to write elsewhere.
void take_in_freed() {
  Heap* heap = g_prof_heap.load(std::memory_order_relaxed);
  Block* block = g_freed.exchange(nullptr, std::memory_order_acquire);
  if (block != nullptr) page_of_linked_block(heap, block, nullptr);
  while (block != nullptr) {
    const Page* page = unit_page_of(block);
    Block* next = link_load(page, block);
    if (next != nullptr) page_of_linked_block(heap, next, block);
    forget(block);
    link_store(page, block, g_forgotten);
    g_forgotten = block;
    block = next;
  }
}

// The forgotten blocks go back to g_prof_heap, whose every use is under g_lock (held here):
// a local free of its owner, with no atomics.
void return_forgotten() {
  Heap* heap = g_prof_heap.load(std::memory_order_relaxed);
  while (g_forgotten != nullptr) {
    Block* block = g_forgotten;
    Page* page = unit_page_of(block);
    g_forgotten = link_load(page, block);
    if (g_forgotten != nullptr) page_of_linked_block(heap, g_forgotten, block);
    page_free_local(heap, page, block);
  }
}

// A block for the sample: small ones from g_prof_heap, in the smallest class that gives the
// alignment, large ones marked in their header.
void* place(size_t size, size_t alignment, bool zero) {
  if (size <= kMaxSmallBytes && alignment <= kUnitBytes) {
    for (unsigned c = size_class_of(size); c < kSizeClassCount; ++c) {
      if (sample_class_alignment(c) < alignment) continue;
      void* p = heap_refill_pop(g_prof_heap.load(std::memory_order_relaxed), c);
      if (zero && p != nullptr) std::memset(p, 0, size);
      return p;
    }
  }
  void* p = large_alloc(size, alignment, zero);
  if (p != nullptr) large_mapping_of(p, chunk_kind(p))->prof_sampled = 1;
  return p;
}

}  // namespace

namespace {

// Takes the stack, then under the lock a block from `place_block` recorded as a sample of
// `size` bytes; nullptr when the stack, the tables or the block are missing.
template <typename Place>
void* record_sample(size_t size, Place place_block) {
  void* frames[kProfMaxFrames];
  const int depth = os::capture_stack(frames, kProfMaxFrames);
  const auto rate = uint64_t(option(Option::kProfSample));
  if (depth == 0 || rate == 0) return nullptr;
  os::LockGuard guard(g_lock);
  // Refilling prof's heap can free pages and want the purger started, whose thread creation
  // allocates, and that allocation could be sampled: it would wait for g_lock forever.
  PurgerHold hold;
  if (!ready()) return nullptr;
  take_in_freed();
  return_forgotten();
  const uint32_t stack = find_or_add_stack(frames, depth);
  if (stack == kNoStack || !live_room()) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  void* block = place_block();
  if (block != nullptr) {
    g_rate.store(rate, std::memory_order_relaxed);
    remember(block, size, stack, rate);
  }
  return block;
}

}  // namespace

void* prof_alloc(size_t size, size_t sampled_bytes, size_t alignment, bool zero) {
  return record_sample(sampled_bytes, [&] { return place(size, alignment, zero); });
}

void prof_large_resized(const void* old_block, LargeHeader* header, bool sampled) {
  if (header->prof_sampled != 0) {
    header->prof_sampled = 0;
    prof_forget(old_block);
  }
  if (sampled) {
    record_sample(header->requested, [header] {
      header->prof_sampled = 1;
      return header->user;
    });
  }
}

void prof_forget(const void* block) {
  os::LockGuard guard(g_lock);
  forget(block);
}

// Taken before the heaps' locks, in the order a sample takes them (api/process.cpp).
void prof_lock_for_fork() { g_lock.lock(); }
void prof_unlock_after_fork() { g_lock.unlock(); }

void prof_free(Block* block) {
  const Page* page = unit_page_of(block);
  Block* head = g_freed.load(std::memory_order_relaxed);
  do link_store(page, block, head);
  while (!g_freed.compare_exchange_weak(head, block, std::memory_order_release, std::memory_order_relaxed));
}

void prof_release_owned(const ProgramHeap* owner) {
  os::LockGuard guard(g_lock);
  if (g_live == nullptr) return;
  PurgerHold hold;
  take_in_freed();
  // An entry's removal shifts later ones back into its slot: look at the slot again.
  for (size_t slot = 0; slot < g_live_slots;) {
    void* block = g_live[slot].block;
    if (block == nullptr || g_live[slot].owner != owner) {
      ++slot;
      continue;
    }
    forget(block);
    link_store(unit_page_of(block), static_cast<Block*>(block), g_forgotten);
    g_forgotten = static_cast<Block*>(block);
  }
  return_forgotten();
}

const ProgramHeap* prof_owner_of(const void* block) {
  os::LockGuard guard(g_lock);
  if (g_live == nullptr) return nullptr;
  for (size_t slot = live_home(block); g_live[slot].block != nullptr; slot = live_next(slot))
    if (g_live[slot].block == block) return g_live[slot].owner;
  return nullptr;
}

void prof_take_in_freed(bool wait) {
  if (wait) g_lock.lock();
  else if (!g_lock.try_lock()) return;
  if (g_live != nullptr) take_in_freed();
  g_lock.unlock();
}

void prof_forget_large(LargeHeader* header) {
  header->prof_sampled = 0;  // the mapping may be reused for a block that is not sampled
  prof_forget(header->user);
}

size_t prof_stack_count() { return g_stack_count.load(std::memory_order_acquire); }
const ProfStack* prof_stacks() { return g_stacks; }
uint64_t prof_dropped() { return g_dropped.load(std::memory_order_relaxed); }
uint64_t prof_peak_estimate() { return g_peak_estimate.load(std::memory_order_relaxed); }

uint64_t prof_rate() {
  const uint64_t rate = g_rate.load(std::memory_order_relaxed);
  return rate != 0 ? rate : uint64_t(option(Option::kProfSample));
}

}  // namespace tray
