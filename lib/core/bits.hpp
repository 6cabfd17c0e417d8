// Small bit and arithmetic helpers shared by every layer.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#define TRAY_LIKELY(x) __builtin_expect(!!(x), 1)
#define TRAY_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define TRAY_INLINE inline __attribute__((always_inline))
#define TRAY_NOINLINE __attribute__((noinline))
#define TRAY_COLD __attribute__((noinline, cold))

namespace tray {

constexpr bool is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }
constexpr size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }
constexpr uintptr_t align_down(uintptr_t x, size_t a) { return x & ~(uintptr_t(a) - 1); }
constexpr size_t div_ceil(size_t x, size_t d) { return (x + d - 1) / d; }
// Index of the highest set bit; x must not be 0.
constexpr unsigned floor_log2(size_t x) { return unsigned(std::bit_width(x)) - 1; }

template <typename T>
TRAY_INLINE T* ptr_add(T* p, size_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + bytes);
}

}  // namespace tray
