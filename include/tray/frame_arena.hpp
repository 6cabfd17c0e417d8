// tray::FrameArena: bump allocation for data that lives for one frame (or one request), all of
// it dropped at once by reset(). Header-only, C++20.
//
// Thread safety: none; use one arena per thread.
//
// reset() runs no destructors, so create() and create_array() take only trivially
// destructible types. After a frame that outgrew the first block, reset() gives all blocks
// back and the next allocation takes one block as large as all of them together: a steady
// frame loop settles on a single block and stops calling the allocator. The arena keeps that
// high-water mark until it is destroyed.
//
// Debug mode (see pool_debug_enabled()): reset() fills the memory it drops with 0x1deadb0b, so
// a pointer kept past its frame reads the fill rather than plausible stale data.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <utility>

#include "tray/pool_common.hpp"

namespace tray {

class FrameArena {
 public:
  static constexpr size_t kDefaultBlockBytes = size_t{64} << 10;

  // Takes no memory until the first allocation, which gets a block of `block_bytes`.
  explicit FrameArena(size_t block_bytes = kDefaultBlockBytes) noexcept
      : block_bytes_(block_bytes), debug_(pool_debug_enabled()) {}

  ~FrameArena() { release_blocks(); }

  FrameArena(const FrameArena&) = delete;
  FrameArena& operator=(const FrameArena&) = delete;

  // `bytes` bytes aligned to `alignment` (a power of two; anything else aborts), valid until
  // the next reset(). Throws std::bad_alloc when no block can be had.
  [[nodiscard]] void* allocate(size_t bytes, size_t alignment = alignof(std::max_align_t)) {
    if (!std::has_single_bit(alignment)) {
      (pool_detail::FatalMessage{} << "tray::FrameArena: alignment " << alignment
                                   << " is not a power of two")
          .abort_process();
    }
    if (current_ != nullptr) {
      const size_t padding = padding_for(cursor_, alignment);
      if (padding <= size_t(limit_ - cursor_) && bytes <= size_t(limit_ - cursor_) - padding) {
        std::byte* result = cursor_ + padding;
        cursor_ = result + bytes;
        return result;
      }
    }
    return allocate_in_new_block(bytes, alignment);
  }

  template <class T, class... Args>
    requires std::is_trivially_destructible_v<T>
  [[nodiscard]] T* create(Args&&... args) {
    void* at = allocate(sizeof(T), alignof(T));
    return pool_detail::construct_at<T>(at, std::forward<Args>(args)...);
  }

  // `count` value-initialized Ts.
  template <class T>
    requires std::is_trivially_destructible_v<T>
  [[nodiscard]] std::span<T> create_array(size_t count) {
    if (count > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    T* first = static_cast<T*>(allocate(count * sizeof(T), alignof(T)));
    for (size_t i = 0; i < count; ++i) ::new (static_cast<void*>(first + i)) T();
    return {first, count};
  }

  // Drops everything allocated since the last reset().
  void reset() noexcept {
    if (current_ == nullptr) return;
    if (current_->previous != nullptr) {
      // The frame spilled: the next one starts in a single block large enough for all of it.
      block_bytes_ = reserved_;
      release_blocks();
      return;
    }
    if (debug_) pool_detail::fill_destroyed(data(current_), size_t(cursor_ - data(current_)));
    cursor_ = data(current_);
    used_in_earlier_blocks_ = 0;
  }

  // Bytes handed out since the last reset(), alignment padding included.
  size_t bytes_used() const noexcept {
    return used_in_earlier_blocks_ + (current_ ? size_t(cursor_ - data(current_)) : 0);
  }
  // Bytes of block space held now.
  size_t bytes_reserved() const noexcept { return reserved_; }

 private:
  struct Block {
    Block* previous;
  };
  static constexpr size_t kBlockAlign = alignof(std::max_align_t);
  static constexpr size_t kHeaderBytes =
      (sizeof(Block) + kBlockAlign - 1) / kBlockAlign * kBlockAlign;

  static std::byte* data(Block* block) noexcept {
    return reinterpret_cast<std::byte*>(block) + kHeaderBytes;
  }
  static size_t padding_for(const std::byte* at, size_t alignment) noexcept {
    return size_t(-reinterpret_cast<uintptr_t>(at)) & (alignment - 1);
  }

  void* allocate_in_new_block(size_t bytes, size_t alignment) {
    // Worst-case padding, so that the request fits whatever address the block gets.
    const size_t slack = alignment > kBlockAlign ? alignment - 1 : 0;
    if (bytes > SIZE_MAX - slack - kHeaderBytes) throw std::bad_alloc();
    const size_t usable = std::max(block_bytes_, bytes + slack);
    // The compiler learns the block's alignment only from assume_aligned. Without it, it takes
    // the padding of a request as unknown, so a cursor_ past limit_ looks possible, and GCC 12
    // at -O2 -Wall warns (-Wstringop-overflow) on a create_array after a spill into a block
    // that the spill filled (tests/install/frame_arena_spill.cpp).
    void* memory = std::assume_aligned<kBlockAlign>(
        ::operator new(kHeaderBytes + usable, std::align_val_t{kBlockAlign}));
    if (current_ != nullptr) used_in_earlier_blocks_ += size_t(cursor_ - data(current_));
    current_ = ::new (memory) Block{current_};
    reserved_ += usable;
    cursor_ = data(current_);
    limit_ = cursor_ + usable;
    std::byte* result = cursor_ + padding_for(cursor_, alignment);
    cursor_ = result + bytes;
    return result;
  }

  void release_blocks() noexcept {
    while (current_ != nullptr) {
      Block* previous = current_->previous;
      current_->~Block();
      ::operator delete(static_cast<void*>(current_), std::align_val_t{kBlockAlign});
      current_ = previous;
    }
    cursor_ = limit_ = nullptr;
    reserved_ = 0;
    used_in_earlier_blocks_ = 0;
  }

  Block* current_ = nullptr;  // the block being filled; earlier ones hang off its `previous`
  std::byte* cursor_ = nullptr;
  std::byte* limit_ = nullptr;
  size_t block_bytes_;
  size_t reserved_ = 0;
  size_t used_in_earlier_blocks_ = 0;
  bool debug_;
};

}  // namespace tray
