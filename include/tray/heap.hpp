// C++ face of traymalloc's heaps (traymalloc.h, "heaps"): tray::Heap owns one, tray::HeapScope
// makes one the thread's default for a scope, tray::HeapAllocator<T> puts a container's memory
// into one. Header-only, C++20; the program links traymalloc (the library or traymalloc_core).
//
// The point of a heap is the release: tray_heap_reset and tray_heap_destroy free every block of
// the heap at a cost that follows its pages, not its blocks, so data built for one request,
// frame or job can be dropped at once instead of block by block. Blocks of a heap are still
// ordinary blocks until then: free, realloc and operator delete take them from any thread.
//
// Lifetime rule, for everything below: no destructor runs when a heap is reset or destroyed.
// An object or container whose memory is in the heap must either be destroyed before that, or
// never again (abandoned: its memory goes with the heap). Destroying it afterwards frees its
// blocks a second time.
//
// Thread safety: as traymalloc.h says. Several threads may allocate into one heap; nobody may
// allocate into it, or have it as the default, while it is being reset or destroyed.
#pragma once

#include <cstddef>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>

#include "traymalloc.h"

namespace tray {

namespace heap_detail {

// Alignment every plain malloc of traymalloc gives; anything stricter goes through the aligned
// entry point, which costs a little more.
inline constexpr size_t kPlainAlignment = alignof(std::max_align_t);

inline void* allocate_aligned(tray_heap_t* heap, size_t bytes, size_t alignment) noexcept {
  return alignment <= kPlainAlignment ? tray_heap_malloc(heap, bytes)
                                      : tray_heap_aligned_alloc(heap, alignment, bytes);
}

}  // namespace heap_detail

// Owns one heap: created by the constructor, destroyed (with every block still in it) by the
// destructor. Move-only; a moved-from Heap owns nothing, and may only be assigned to, reset or
// destroyed (its get() is nullptr, which the allocation calls do not take).
class Heap {
 public:
  // std::bad_alloc if no heap can be had.
  Heap() : heap_(tray_heap_new()) {
    if (heap_ == nullptr) throw std::bad_alloc();
  }

  // Takes ownership of a heap from tray_heap_new (or from release()); nullptr gives an empty Heap.
  [[nodiscard]] static Heap adopt(tray_heap_t* heap) noexcept { return Heap(heap, Adopt{}); }

  ~Heap() { tray_heap_destroy(heap_); }

  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  Heap(Heap&& other) noexcept : heap_(std::exchange(other.heap_, nullptr)) {}
  Heap& operator=(Heap&& other) noexcept {
    if (this != &other) {
      tray_heap_destroy(heap_);
      heap_ = std::exchange(other.heap_, nullptr);
    }
    return *this;
  }

  // Frees every block; the heap stays, empty, and keeps some memory for the next round.
  void reset() noexcept { tray_heap_reset(heap_); }

  // Gives up ownership: the caller must tray_heap_destroy the result (or adopt it again).
  [[nodiscard]] tray_heap_t* release() noexcept { return std::exchange(heap_, nullptr); }

  tray_heap_t* get() const noexcept { return heap_; }
  explicit operator bool() const noexcept { return heap_ != nullptr; }

  // The C functions, into this heap: nullptr when out of memory, as malloc does. The blocks go
  // back with free / tray_free, or all at once with reset() or the destructor.
  [[nodiscard]] void* malloc(size_t bytes) noexcept { return tray_heap_malloc(heap_, bytes); }
  [[nodiscard]] void* calloc(size_t count, size_t bytes) noexcept {
    return tray_heap_calloc(heap_, count, bytes);
  }
  // The result is a block of this heap even when p was a block of another one.
  [[nodiscard]] void* realloc(void* p, size_t bytes) noexcept {
    return tray_heap_realloc(heap_, p, bytes);
  }
  [[nodiscard]] void* aligned_alloc(size_t alignment, size_t bytes) noexcept {
    return tray_heap_aligned_alloc(heap_, alignment, bytes);
  }

  // Whether p is a block of this heap (false for nullptr and for blocks of thread heaps).
  bool owns(const void* p) const noexcept { return p != nullptr && tray_heap_of(p) == heap_; }

  // Constructs a T in this heap. std::bad_alloc when out of memory; if T's constructor throws,
  // the block is freed and the exception propagates. reset() and the destructor do not run
  // ~T: for a T that needs it, call destroy_object before then (or never, if abandoning the
  // object is fine).
  template <class T, class... Args>
  [[nodiscard]] T* make(Args&&... args) {
    static_assert(std::is_object_v<T> && !std::is_array_v<T>, "make<T> builds one object");
    void* block = heap_detail::allocate_aligned(heap_, sizeof(T), alignof(T));
    if (block == nullptr) throw std::bad_alloc();
    try {
      // Braces for aggregates: not every compiler of C++20 takes parentheses for them yet.
      if constexpr (std::is_constructible_v<T, Args&&...>) {
        return ::new (block) T(std::forward<Args>(args)...);
      } else {
        return ::new (block) T{std::forward<Args>(args)...};
      }
    } catch (...) {
      tray_free(block);
      throw;
    }
  }

  // Runs ~T and frees the block of an object from make() (nullptr is ignored). Any Heap can do
  // it: the block knows its heap.
  template <class T>
  static void destroy_object(T* object) noexcept {
    if (object == nullptr) return;
    object->~T();
    tray_free(const_cast<void*>(static_cast<const volatile void*>(object)));
  }

 private:
  struct Adopt {};
  Heap(tray_heap_t* heap, Adopt) noexcept : heap_(heap) {}

  tray_heap_t* heap_;
};

// Makes a heap the calling thread's default for the lifetime of the scope: malloc, operator new
// and so every std container with std::allocator allocate into it. The destructor puts back the
// default that was in place before, so scopes nest (inner ones end first, as C++ scopes do).
//
// Neither copyable nor movable: the default belongs to the thread that set it, and a scope that
// ended on another thread, or out of order, would put back the wrong default. The heap must
// outlive the scope, and so must the heap of any enclosing scope (the one put back).
//
// Only allocations that reach traymalloc's malloc move: a program that links traymalloc_core
// alone, with the C library's malloc still in place, sees no change in malloc or new.
class [[nodiscard]] HeapScope {
 public:
  explicit HeapScope(tray_heap_t* heap) noexcept : previous_(tray_heap_set_default(heap)) {}
  explicit HeapScope(Heap& heap) noexcept : HeapScope(heap.get()) {}
  ~HeapScope() { tray_heap_set_default(previous_); }

  HeapScope(const HeapScope&) = delete;
  HeapScope& operator=(const HeapScope&) = delete;

  // The default the destructor puts back (nullptr: the thread's own heap).
  tray_heap_t* previous() const noexcept { return previous_; }

 private:
  tray_heap_t* previous_;
};

// A standard allocator whose memory comes from one heap, named at construction: containers get
// the heap's fast release (abandon them, then reset the heap), or simply keep their data
// together. Blocks are given back one by one with tray_free when the container frees them.
//
// No default constructor: a container must be told which heap to use, so none lands in one by
// accident. Copies and rebound copies use the same heap and compare equal exactly when their
// heaps are the same.
//
// Propagation. All three propagate traits are true: copy assignment, move assignment and swap
// carry the allocator (the heap) along with the elements, so a container's blocks always belong
// to the heap its allocator names, and moving a container never copies elements because two
// heaps differ. The price is that after `a = b` container a allocates into b's heap; a program
// that wants a to stay in its own heap copies elements explicitly (a.assign(b.begin(), b.end())).
// Copy construction shares the source's heap (the default select_on_container_copy_construction).
//
// Over-aligned T (alignof(T) above alignof(std::max_align_t)) is served by
// tray_heap_aligned_alloc; everything else by tray_heap_malloc.
template <class T>
class HeapAllocator {
 public:
  using value_type = T;
  using size_type = size_t;
  using difference_type = std::ptrdiff_t;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;

  // heap must stay alive while any container uses it.
  explicit HeapAllocator(tray_heap_t* heap) noexcept : heap_(heap) {}
  explicit HeapAllocator(const Heap& heap) noexcept : heap_(heap.get()) {}

  HeapAllocator(const HeapAllocator&) noexcept = default;
  HeapAllocator& operator=(const HeapAllocator&) noexcept = default;

  template <class U>
  HeapAllocator(const HeapAllocator<U>& other) noexcept : heap_(other.heap()) {}

  [[nodiscard]] T* allocate(size_t n) {
    if (n > std::numeric_limits<size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    void* block = heap_detail::allocate_aligned(heap_, n * sizeof(T), alignof(T));
    if (block == nullptr) throw std::bad_alloc();
    return static_cast<T*>(block);
  }

  void deallocate(T* p, size_t) noexcept { tray_free(p); }

  tray_heap_t* heap() const noexcept { return heap_; }

  template <class U>
  bool operator==(const HeapAllocator<U>& other) const noexcept {
    return heap_ == other.heap();
  }

 private:
  tray_heap_t* heap_;
};

}  // namespace tray
