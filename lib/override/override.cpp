// The drop-in surface: malloc and friends, glibc's aliases and introspection calls, and every
// form of operator new and delete, all on top of the core's entry points (alloc.hpp). Exported
// by libtraymalloc.so (so LD_PRELOAD replaces libc's) and defined in libtraymalloc.a (so a
// program linking it uses ours everywhere). One translation unit on purpose: a reference to
// any of these symbols pulls in all of them from the static library, never half of them.
// This file keeps exceptions on: operator new must be able to throw std::bad_alloc.
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>

#include <climits>
#include <new>

#include "alloc.hpp"
#include "stats.hpp"
#include "traymalloc.h"

#define TRAY_PUBLIC extern "C" __attribute__((visibility("default")))
#define TRAY_ALIAS(name) __attribute__((alias(#name), visibility("default")))

using namespace tray;

// --- C ------------------------------------------------------------------------------------
TRAY_PUBLIC void* malloc(size_t size) noexcept { return alloc(size); }
TRAY_PUBLIC void free(void* p) noexcept { dealloc(p); }
TRAY_PUBLIC void* calloc(size_t count, size_t size) noexcept { return alloc_zeroed(count, size); }
TRAY_PUBLIC void* realloc(void* p, size_t size) noexcept { return reallocate(p, size); }
TRAY_PUBLIC void* reallocarray(void* p, size_t count, size_t size) noexcept {
  return tray_reallocarray(p, count, size);
}
TRAY_PUBLIC int posix_memalign(void** out, size_t alignment, size_t size) noexcept {
  return tray_posix_memalign(out, alignment, size);
}
TRAY_PUBLIC void* aligned_alloc(size_t alignment, size_t size) noexcept {
  return tray_aligned_alloc(alignment, size);
}
TRAY_PUBLIC void* memalign(size_t alignment, size_t size) noexcept {
  return tray_memalign(alignment, size);
}
TRAY_PUBLIC void* valloc(size_t size) noexcept { return tray_memalign(kOsPageBytes, size); }
TRAY_PUBLIC void* pvalloc(size_t size) noexcept {
  const size_t rounded = align_up(size == 0 ? 1 : size, kOsPageBytes);
  if (rounded < size) {
    errno = ENOMEM;
    return nullptr;
  }
  return tray_memalign(kOsPageBytes, rounded);
}
TRAY_PUBLIC size_t malloc_usable_size(void* p) noexcept { return usable_size(p); }
TRAY_PUBLIC void cfree(void* p) noexcept { dealloc(p); }
TRAY_PUBLIC void free_sized(void* p, size_t) noexcept { dealloc(p); }
TRAY_PUBLIC void free_aligned_sized(void* p, size_t, size_t) noexcept { dealloc(p); }

// glibc's internal names, which some programs and libraries call directly. The aliases share
// the targets' code; only the attributes glibc's headers put on the targets differ.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-attributes"
TRAY_PUBLIC void* __libc_malloc(size_t) noexcept TRAY_ALIAS(malloc);
TRAY_PUBLIC void __libc_free(void*) noexcept TRAY_ALIAS(free);
TRAY_PUBLIC void* __libc_calloc(size_t, size_t) noexcept TRAY_ALIAS(calloc);
TRAY_PUBLIC void* __libc_realloc(void*, size_t) noexcept TRAY_ALIAS(realloc);
TRAY_PUBLIC void* __libc_memalign(size_t, size_t) noexcept TRAY_ALIAS(memalign);
TRAY_PUBLIC void* __libc_valloc(size_t) noexcept TRAY_ALIAS(valloc);
TRAY_PUBLIC void* __libc_pvalloc(size_t) noexcept TRAY_ALIAS(pvalloc);
TRAY_PUBLIC int __posix_memalign(void**, size_t, size_t) noexcept TRAY_ALIAS(posix_memalign);
#pragma GCC diagnostic pop

// --- glibc introspection, answered with our numbers ----------------------------------------
TRAY_PUBLIC int malloc_trim(size_t) noexcept { return tray_trim(); }

// Page-granular: a block is counted "in use" from the moment its page belongs to a heap.
TRAY_PUBLIC struct mallinfo2 mallinfo2() noexcept {
  struct mallinfo2 info = {};
  const size_t in_pages = g_totals.bytes_in_pages.load(std::memory_order_relaxed);
  const size_t large = g_totals.bytes_large.load(std::memory_order_relaxed);
  const size_t segments = g_totals.segments_mapped.load(std::memory_order_relaxed) * kSegmentBytes;
  info.arena = segments;
  info.uordblks = in_pages;
  info.fordblks = segments > in_pages ? segments - in_pages : 0;
  info.hblkhd = large;
  info.hblks = large != 0;
  return info;
}

TRAY_PUBLIC struct mallinfo mallinfo() noexcept {
  const struct mallinfo2 wide = mallinfo2();
  auto clamp = [](size_t v) { return v > size_t(INT_MAX) ? INT_MAX : int(v); };
  struct mallinfo info = {};
  info.arena = clamp(wide.arena);
  info.uordblks = clamp(wide.uordblks);
  info.fordblks = clamp(wide.fordblks);
  info.hblkhd = clamp(wide.hblkhd);
  info.hblks = clamp(wide.hblks);
  return info;
}

// --- memory that is not ours goes back to the C library --------------------------------
namespace {
// After the C library is initialised and before main: resolving symbols inside malloc would
// re-enter malloc, and the loader may call us before it can resolve anything.
__attribute__((constructor(101))) void install_foreign_handlers() {
  ForeignHandlers next{};
  next.free = reinterpret_cast<void (*)(void*)>(dlsym(RTLD_NEXT, "free"));
  next.realloc = reinterpret_cast<void* (*)(void*, size_t)>(dlsym(RTLD_NEXT, "realloc"));
  next.usable_size = reinterpret_cast<size_t (*)(void*)>(dlsym(RTLD_NEXT, "malloc_usable_size"));
  if (next.free == nullptr || next.realloc == nullptr || next.usable_size == nullptr) return;
  if (next.free == &free) return;  // no other allocator behind us
  set_foreign_handlers(next);
}
}  // namespace

// --- C++ ----------------------------------------------------------------------------------
namespace {

// What the standard asks of operator new when memory runs out: call the new-handler and try
// again, or throw std::bad_alloc when there is none.
TRAY_NOINLINE void* new_slow(size_t size, size_t alignment) {
  for (;;) {
    void* p = alignment == 0 ? alloc(size) : alloc_aligned(size, alignment, false);
    if (p != nullptr) return p;
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) throw std::bad_alloc();
    handler();
  }
}

TRAY_NOINLINE void* new_slow_nothrow(size_t size, size_t alignment) noexcept {
  try {
    return new_slow(size, alignment);
  } catch (...) {
    return nullptr;
  }
}

TRAY_INLINE void* new_fast(size_t size) {
  void* p = alloc(size);
  return TRAY_LIKELY(p != nullptr) ? p : new_slow(size, 0);
}

TRAY_INLINE void* new_fast_nothrow(size_t size) noexcept {
  void* p = alloc(size);
  return TRAY_LIKELY(p != nullptr) ? p : new_slow_nothrow(size, 0);
}

TRAY_INLINE void* new_aligned(size_t size, std::align_val_t alignment) {
  const size_t a = static_cast<size_t>(alignment);
  void* p = alloc_aligned(size, a, false);
  return TRAY_LIKELY(p != nullptr) ? p : new_slow(size, a);
}

TRAY_INLINE void* new_aligned_nothrow(size_t size, std::align_val_t alignment) noexcept {
  const size_t a = static_cast<size_t>(alignment);
  void* p = alloc_aligned(size, a, false);
  return TRAY_LIKELY(p != nullptr) ? p : new_slow_nothrow(size, a);
}

}  // namespace

#define TRAY_NEW __attribute__((visibility("default")))
using std::align_val_t;
using std::nothrow_t;

TRAY_NEW void* operator new(size_t n) { return new_fast(n); }
TRAY_NEW void* operator new[](size_t n) { return new_fast(n); }
TRAY_NEW void* operator new(size_t n, const nothrow_t&) noexcept { return new_fast_nothrow(n); }
TRAY_NEW void* operator new[](size_t n, const nothrow_t&) noexcept { return new_fast_nothrow(n); }
TRAY_NEW void* operator new(size_t n, align_val_t a) { return new_aligned(n, a); }
TRAY_NEW void* operator new[](size_t n, align_val_t a) { return new_aligned(n, a); }
TRAY_NEW void* operator new(size_t n, align_val_t a, const nothrow_t&) noexcept {
  return new_aligned_nothrow(n, a);
}
TRAY_NEW void* operator new[](size_t n, align_val_t a, const nothrow_t&) noexcept {
  return new_aligned_nothrow(n, a);
}

TRAY_NEW void operator delete(void* p) noexcept { dealloc(p); }
TRAY_NEW void operator delete[](void* p) noexcept { dealloc(p); }
TRAY_NEW void operator delete(void* p, const nothrow_t&) noexcept { dealloc(p); }
TRAY_NEW void operator delete[](void* p, const nothrow_t&) noexcept { dealloc(p); }
TRAY_NEW void operator delete(void* p, size_t) noexcept { dealloc(p); }
TRAY_NEW void operator delete[](void* p, size_t) noexcept { dealloc(p); }
TRAY_NEW void operator delete(void* p, align_val_t) noexcept { dealloc(p); }
TRAY_NEW void operator delete[](void* p, align_val_t) noexcept { dealloc(p); }
TRAY_NEW void operator delete(void* p, align_val_t, const nothrow_t&) noexcept { dealloc(p); }
TRAY_NEW void operator delete[](void* p, align_val_t, const nothrow_t&) noexcept { dealloc(p); }
TRAY_NEW void operator delete(void* p, size_t, align_val_t) noexcept { dealloc(p); }
TRAY_NEW void operator delete[](void* p, size_t, align_val_t) noexcept { dealloc(p); }
