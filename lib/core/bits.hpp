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
// On declarations of globals the fast paths read: the compiler then addresses them directly
// instead of through the GOT (one load instead of two), as the definitions are hidden anyway.
#define TRAY_HIDDEN __attribute__((visibility("hidden")))

// Code-generation hints for the inline fast paths, where every instruction shows in the
// per-pair counts; neither emits an instruction. TRAY_OPAQUE(x) hides x's value from the
// optimizer, which then can neither rebuild x from what it was computed from nor merge two
// addresses computed from it into one `lea`. TRAY_IN_REG(x, "a") keeps x in the named x86-64
// register at that point (rax: the value returned; rdi: the size argument), which spares the
// register copies GCC otherwise adds; on other machines it is TRAY_OPAQUE.
#define TRAY_OPAQUE(x) asm("" : "+r"(x))
#if defined(__x86_64__)
#define TRAY_IN_REG(x, reg) asm("" : "+" reg(x))
#else
#define TRAY_IN_REG(x, reg) TRAY_OPAQUE(x)
#endif

#if defined(__SANITIZE_THREAD__)
#define TRAY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TRAY_TSAN 1
#endif
#endif

namespace tray {

constexpr bool is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }
constexpr size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }
constexpr uintptr_t align_down(uintptr_t x, size_t a) { return x & ~(uintptr_t(a) - 1); }
constexpr size_t div_ceil(size_t x, size_t d) { return (x + d - 1) / d; }
// Index of the highest set bit; x must not be 0.
constexpr unsigned floor_log2(size_t x) { return unsigned(std::bit_width(x)) - 1; }

// Set bits of x. Not std::popcount: without -mpopcnt that calls into libgcc, and the library
// links nothing but libc.
constexpr unsigned popcount64(uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555u);
  x = (x & 0x3333333333333333u) + ((x >> 2) & 0x3333333333333333u);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fu;
  return unsigned((x * 0x0101010101010101u) >> 56);
}
static_assert(popcount64(0) == 0 && popcount64(~uint64_t{0}) == 64 && popcount64(0x8001) == 2);

template <typename T>
TRAY_INLINE T* ptr_add(T* p, size_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + bytes);
}

}  // namespace tray
