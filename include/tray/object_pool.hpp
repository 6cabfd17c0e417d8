// tray::ObjectPool<T>: a pool of objects of one type, for code that creates and destroys many
// of them: create() is O(1), destroy() searches only the pool's few chunks, the pool's memory
// cannot be taken by other allocations, and the live objects can be visited or destroyed all
// at once. Header-only, C++20.
//
// Thread safety: none. A pool, and every object it hands out, must be used by one thread at a
// time; give each thread its own pool, or guard a shared one with a mutex.
//
// Layout. Slots live in chunks, each one allocation that holds a header, an in-use bitmap (one
// bit per slot: liveness is never stored inside the objects, so for_each() needs no cooperation
// from T) and the slots, aligned for T. A free slot's first sizeof(void*) bytes hold the link
// to the next free slot of its chunk: the free lists need no memory of their own.
//
// Misuse. destroy() of anything but a live object of this pool (a double destroy, a pointer
// from elsewhere, a pointer into the middle of an object) writes the address and sizeof(T) to
// stderr and aborts, in every build: the chunk lookup and the bitmap bit that destroy() needs
// anyway make the check exact and nearly free.
//
// Debug mode (see pool_debug_enabled(): TRAY_OPTIONS=debug=1, or a build without NDEBUG): a
// destroyed slot is filled with 0x1deadb0b everywhere except its first sizeof(void*) bytes,
// where the free-list link lives; when create() reuses the slot the fill must be intact, else
// something wrote through a stale pointer and the process aborts with a message.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string_view>
#include <type_traits>
#include <utility>

#include "tray/pool_common.hpp"

namespace tray {

enum class PoolPolicy {
  fail,  // create() returns nullptr when every slot is live: a fixed memory budget
  grow,  // create() adds a chunk as large as the whole pool (capacity doubles); nothing moves
};

template <class T>
class ObjectPool {
  static_assert(std::is_object_v<T> && !std::is_array_v<T> && !std::is_const_v<T>,
                "ObjectPool<T> needs a non-const, non-array object type");
  static_assert(std::is_nothrow_destructible_v<T>, "destroy() and clear() cannot report a throw");

 public:
  // Takes storage for `capacity` objects (at least 1) at once. That first chunk is the pool's
  // budget under PoolPolicy::fail and is never given back; std::bad_alloc if it cannot be had.
  explicit ObjectPool(size_t capacity, PoolPolicy policy = PoolPolicy::fail)
      : policy_(policy), debug_(pool_debug_enabled()) {
    if (capacity == 0) fatal("capacity must be at least 1");
    first_chunk_ = add_chunk(capacity);
    if (first_chunk_ == nullptr) throw std::bad_alloc();
  }

  // Destroys the objects still alive, then returns every chunk.
  ~ObjectPool() {
    clear();
    for (size_t i = 0; i < chunk_count_; ++i) release_chunk(chunks_[i]);
  }

  ObjectPool(const ObjectPool&) = delete;
  ObjectPool& operator=(const ObjectPool&) = delete;

  // Constructs a T from `args` in a free slot, in O(1). nullptr when the pool is full under
  // PoolPolicy::fail, or when PoolPolicy::grow cannot get another chunk. If T's constructor
  // throws, the slot goes back to the pool and the exception propagates.
  template <class... Args>
  [[nodiscard]] T* create(Args&&... args) {
    const TakenSlot taken = take_slot();
    if (taken.slot == nullptr) return nullptr;
    SlotReturner returner{this, taken};
    T* object = pool_detail::construct_at<T>(taken.slot, std::forward<Args>(args)...);
    returner.cancel();
    mark_live(taken);
    return object;
  }

  // Runs ~T and frees the slot; nullptr is ignored. Finding the chunk is a binary search over
  // the chunks, of which a pool that grew from capacity c to n has at most log2(n / c) + 1.
  void destroy(T* object) noexcept {
    if (object == nullptr) return;
    auto* slot = reinterpret_cast<std::byte*>(object);
    Chunk* chunk = chunk_holding(slot);
    const size_t offset = chunk ? size_t(slot - chunk->first_slot) : 0;
    const size_t index = offset / kSlotBytes;
    // Slots past handed_out were never created, or were dropped by clear().
    if (chunk == nullptr || offset % kSlotBytes != 0 || index >= chunk->handed_out) {
      fatal("destroy of ", slot, " which is not an object of this pool");
    }
    uint64_t& word = in_use(chunk)[index / kBitsPerWord];
    const uint64_t bit = uint64_t{1} << (index % kBitsPerWord);
    if ((word & bit) == 0) fatal("double destroy of ", slot);
    word &= ~bit;
    --chunk->live;
    --size_;
    object->~T();
    give_back({chunk, slot});
  }

  // Calls visit(T&) on every live object, in address order within each chunk. visit may
  // create and destroy objects of this pool: one destroyed before its turn is not visited, one
  // created during the walk may or may not be. It must not call clear() or shrink_to_fit().
  template <class Visit>
  void for_each(Visit&& visit) {
    walk_live([&](T* object) { visit(*object); });
  }
  template <class Visit>
  void for_each(Visit&& visit) const {
    walk_live([&](T* object) { visit(std::as_const(*object)); });
  }

  // Destroys every live object (their destructors may destroy other objects of this pool) and
  // makes all slots free again; capacity and peak() stay.
  void clear() noexcept {
    for (size_t i = 0; i < chunk_count_; ++i) {
      Chunk* chunk = chunks_[i];
      uint64_t* words = in_use(chunk);
      for (size_t w = 0; w * kBitsPerWord < chunk->handed_out; ++w) {
        // Re-read the word each time: a destructor may have destroyed its neighbours.
        while (words[w] != 0) {
          const size_t index = w * kBitsPerWord + size_t(std::countr_zero(words[w]));
          words[w] &= words[w] - 1;
          --chunk->live;
          --size_;
          object_at(chunk, index)->~T();
          if (debug_) fill_after_link(slot_at(chunk, index));
        }
      }
    }
    // Every slot is free now: forget the free lists and hand slots out from the start again.
    available_ = nullptr;
    for (size_t i = chunk_count_; i-- > 0;) {
      Chunk* chunk = chunks_[i];
      chunk->free = nullptr;
      chunk->handed_out = 0;
      chunk->listed = true;
      chunk->next_available = available_;
      available_ = chunk;
    }
  }

  // Returns to the allocator every chunk with no live object, except the first one.
  void shrink_to_fit() noexcept {
    size_t kept = 0;
    for (size_t i = 0; i < chunk_count_; ++i) {
      Chunk* chunk = chunks_[i];
      if (chunk->live == 0 && chunk != first_chunk_) {
        release_chunk(chunk);
      } else {
        chunks_[kept++] = chunk;
      }
    }
    chunk_count_ = kept;
    available_ = nullptr;
    for (size_t i = chunk_count_; i-- > 0;) {
      if (chunks_[i]->listed) {
        chunks_[i]->next_available = available_;
        available_ = chunks_[i];
      }
    }
  }

  size_t size() const noexcept { return size_; }          // live objects
  size_t capacity() const noexcept { return capacity_; }  // slots in all chunks
  size_t peak() const noexcept { return peak_; }          // largest size() so far

 private:
  struct FreeSlot {
    FreeSlot* next;
  };

  static constexpr size_t kSlotAlign = std::max(alignof(T), alignof(FreeSlot));
  static constexpr size_t kSlotBytes =
      (std::max(sizeof(T), sizeof(FreeSlot)) + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  static constexpr size_t kLinkBytes = sizeof(FreeSlot);  // at the start of a free slot
  static constexpr size_t kBitsPerWord = 64;

  // Each chunk added by PoolPolicy::grow holds at least as many slots as all older chunks
  // still present, so 64 chunks would exceed any address space.
  static constexpr size_t kMaxChunks = 64;

  struct Chunk {
    size_t slots;
    size_t handed_out;  // slots [0, handed_out) have been used since the chunk was new or cleared
    size_t live;
    FreeSlot* free;         // slots destroyed since, most recent first
    Chunk* next_available;  // next chunk in the list of those with a slot to give
    bool listed;            // on that list
    std::byte* first_slot;
    // the in-use bitmap follows, then the slots from first_slot on
  };

  struct TakenSlot {
    Chunk* chunk;
    std::byte* slot;
  };

  // Gives a taken slot back unless the object was constructed in it.
  struct SlotReturner {
    ObjectPool* pool;
    TakenSlot taken;
    void cancel() noexcept { pool = nullptr; }
    ~SlotReturner() {
      if (pool != nullptr) pool->give_back(taken);
    }
  };

  static constexpr size_t bitmap_words(size_t slots) noexcept {
    return (slots + kBitsPerWord - 1) / kBitsPerWord;
  }
  static constexpr size_t first_slot_offset(size_t slots) noexcept {
    const size_t header = sizeof(Chunk) + bitmap_words(slots) * sizeof(uint64_t);
    return (header + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  }
  static constexpr std::align_val_t chunk_alignment() noexcept {
    return std::align_val_t{std::max(kSlotAlign, alignof(Chunk))};
  }
  static uint64_t* in_use(Chunk* chunk) noexcept {
    return reinterpret_cast<uint64_t*>(chunk + 1);
  }
  static std::byte* slot_at(Chunk* chunk, size_t index) noexcept {
    return chunk->first_slot + index * kSlotBytes;
  }
  static T* object_at(Chunk* chunk, size_t index) noexcept {
    return std::launder(reinterpret_cast<T*>(slot_at(chunk, index)));
  }
  static void fill_after_link(std::byte* slot) noexcept {
    pool_detail::fill_destroyed(slot + kLinkBytes, kSlotBytes - kLinkBytes);
  }
  static bool fill_after_link_intact(const std::byte* slot) noexcept {
    return pool_detail::holds_destroyed_fill(slot + kLinkBytes, kSlotBytes - kLinkBytes);
  }

  // Chunks come from ::operator new rather than mmap: they then belong to whatever allocator
  // the process uses (traymalloc's statistics and trimming, or a sanitizer's leak and bounds
  // checks), and big chunks still end up in mappings of their own inside any malloc.
  Chunk* add_chunk(size_t slots) noexcept {
    if (chunk_count_ == kMaxChunks) return nullptr;
    const size_t offset = first_slot_offset(slots);
    if (slots > (SIZE_MAX - offset) / kSlotBytes) return nullptr;
    void* memory = ::operator new(offset + slots * kSlotBytes, chunk_alignment(), std::nothrow);
    if (memory == nullptr) return nullptr;
    auto* chunk = ::new (memory) Chunk{slots, 0, 0, nullptr, available_, true,
                                       static_cast<std::byte*>(memory) + offset};
    std::memset(in_use(chunk), 0, bitmap_words(slots) * sizeof(uint64_t));
    available_ = chunk;
    // Keep chunks_ sorted by address for the binary search in chunk_holding().
    Chunk** end = chunks_.data() + chunk_count_;
    Chunk** at = std::upper_bound(chunks_.data(), end, chunk, address_less);
    std::move_backward(at, end, end + 1);
    *at = chunk;
    ++chunk_count_;
    capacity_ += slots;
    return chunk;
  }

  void release_chunk(Chunk* chunk) noexcept {
    capacity_ -= chunk->slots;
    chunk->~Chunk();
    // Unsized: sized deallocation is off by default in some compilers (clang before 19).
    ::operator delete(static_cast<void*>(chunk), chunk_alignment());
  }

  static bool address_less(const void* a, const void* b) noexcept {
    return reinterpret_cast<uintptr_t>(a) < reinterpret_cast<uintptr_t>(b);
  }

  Chunk* chunk_holding(const std::byte* slot) const noexcept {
    Chunk* const* begin = chunks_.data();
    Chunk* const* after = std::upper_bound(begin, begin + chunk_count_, slot, address_less);
    if (after == begin) return nullptr;
    Chunk* chunk = after[-1];
    const auto address = reinterpret_cast<uintptr_t>(slot);
    const auto first = reinterpret_cast<uintptr_t>(chunk->first_slot);
    return address >= first && address - first < chunk->slots * kSlotBytes ? chunk : nullptr;
  }

  TakenSlot take_slot() noexcept {
    Chunk* chunk = available_;
    if (chunk == nullptr) {
      if (policy_ == PoolPolicy::fail) return {nullptr, nullptr};
      chunk = add_chunk(capacity_);
      if (chunk == nullptr) return {nullptr, nullptr};
    }
    std::byte* slot;
    if (chunk->free != nullptr) {
      slot = reinterpret_cast<std::byte*>(chunk->free);
      chunk->free = chunk->free->next;
      if (debug_ && !fill_after_link_intact(slot)) {
        fatal("", slot, " was written after it was destroyed");
      }
    } else {
      slot = slot_at(chunk, chunk->handed_out++);
    }
    if (chunk->free == nullptr && chunk->handed_out == chunk->slots) {
      available_ = chunk->next_available;
      chunk->listed = false;
    }
    return {chunk, slot};
  }

  void give_back(TakenSlot taken) noexcept {
    if (debug_) fill_after_link(taken.slot);
    Chunk* chunk = taken.chunk;
    chunk->free = ::new (static_cast<void*>(taken.slot)) FreeSlot{chunk->free};
    if (!chunk->listed) {
      chunk->listed = true;
      chunk->next_available = available_;
      available_ = chunk;
    }
  }

  void mark_live(TakenSlot taken) noexcept {
    const size_t index = size_t(taken.slot - taken.chunk->first_slot) / kSlotBytes;
    in_use(taken.chunk)[index / kBitsPerWord] |= uint64_t{1} << (index % kBitsPerWord);
    ++taken.chunk->live;
    peak_ = std::max(peak_, ++size_);
  }

  template <class Visit>
  void walk_live(Visit&& visit) const {
    // Walk a copy of the chunk list: a chunk that visit() makes the pool add must not shift it.
    std::array<Chunk*, kMaxChunks> chunks;
    const size_t chunk_count = chunk_count_;
    std::copy_n(chunks_.begin(), chunk_count, chunks.begin());
    for (size_t i = 0; i < chunk_count; ++i) {
      Chunk* chunk = chunks[i];
      const uint64_t* words = in_use(chunk);
      for (size_t w = 0; w * kBitsPerWord < chunk->handed_out; ++w) {
        for (uint64_t pending = words[w]; pending != 0;) {
          const unsigned bit = unsigned(std::countr_zero(pending));
          visit(object_at(chunk, w * kBitsPerWord + bit));
          // Re-read: visit() may have destroyed or created objects in this word.
          pending = words[w] & (~uint64_t{0} << bit << 1);
        }
      }
    }
  }

  [[noreturn]] static void fatal(std::string_view before, const void* address = nullptr,
                                 std::string_view after = {}) noexcept {
    pool_detail::FatalMessage message;
    message << "tray::ObjectPool (sizeof(T) = " << sizeof(T) << "): " << before;
    if (address != nullptr) message << address;
    (message << after).abort_process();
  }

  std::array<Chunk*, kMaxChunks> chunks_{};  // sorted by address
  size_t chunk_count_ = 0;
  Chunk* available_ = nullptr;  // chunks with a free or never-used slot
  Chunk* first_chunk_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  size_t peak_ = 0;
  PoolPolicy policy_;
  bool debug_;
};

}  // namespace tray
