// The drop-in surface: malloc and friends, glibc's aliases and introspection calls, every
// form of operator new and delete, all on top of the core's entry points (api/api.hpp), and
// unshare and setns, which must not meet our thread. Exported by libtraymalloc.so (so
// LD_PRELOAD replaces libc's) and defined in libtraymalloc.a (so a program linking it uses ours
// everywhere). One translation unit on purpose: a reference to any of these symbols pulls in
// all of them from the static library, never half of them.
#include <errno.h>
#include <malloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include <atomic>
#include <climits>
#include <new>

#include "api/api.hpp"
#include "platform/platform.hpp"
#include "purge/purge.hpp"
#include "report/report.hpp"
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
TRAY_PUBLIC void* valloc(size_t size) noexcept { return tray_memalign(os::page_size(), size); }
TRAY_PUBLIC void* pvalloc(size_t size) noexcept {
  const size_t page = os::page_size();
  const size_t rounded = align_up(size == 0 ? 1 : size, page);
  if (rounded < size) {
    errno = ENOMEM;
    return nullptr;
  }
  return tray_memalign(page, rounded);
}
TRAY_PUBLIC size_t malloc_usable_size(void* p) noexcept { return usable_size(p); }
TRAY_PUBLIC void cfree(void* p) noexcept { dealloc(p); }
TRAY_PUBLIC void free_sized(void* p, size_t) noexcept { dealloc(p); }
TRAY_PUBLIC void free_aligned_sized(void* p, size_t, size_t) noexcept { dealloc(p); }

// glibc's internal names, which some programs and libraries call directly. The aliases share
// the targets' code; only the attributes glibc's headers put on the targets differ.
#pragma GCC diagnostic push
#if !defined(__clang__)  // clang has no such warning
#pragma GCC diagnostic ignored "-Wmissing-attributes"
#endif
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

// glibc's field meanings: arena and fordblks count the pages of the size classes, uordblks
// their live blocks, ordblks their free blocks; hblks/hblkhd are the large blocks.
TRAY_PUBLIC struct mallinfo2 mallinfo2() noexcept {
  tray_stats stats;
  stats.version = TRAY_STATS_VERSION;
  stats_collect(&stats);
  struct mallinfo2 info = {};
  for (unsigned c = 0; c < stats.class_count; ++c) {
    const tray_class_stats& entry = stats.classes[c];
    const size_t capacity = entry.pages * entry.blocks_per_page;
    info.arena += entry.pages * entry.page_bytes;
    info.uordblks += entry.live_blocks * entry.block_bytes;
    info.ordblks += capacity > entry.live_blocks ? capacity - entry.live_blocks : 0;
  }
  info.fordblks = info.arena > info.uordblks ? info.arena - info.uordblks : 0;
  info.hblks = stats.large.live_blocks;
  info.hblkhd = stats.large.live_bytes;
  return info;
}

TRAY_PUBLIC void malloc_stats() noexcept {
  stats_dump("malloc_stats", nullptr, nullptr, DumpFormat::kMallocStats);
}

namespace {
void write_to_stream(void* stream, const char* text, size_t length) {
  fwrite(text, 1, length, static_cast<FILE*>(stream));
}
}  // namespace

TRAY_PUBLIC int malloc_info(int options, FILE* stream) noexcept {
  if (options != 0 || stream == nullptr) {
    errno = EINVAL;
    return -1;
  }
  stats_dump("malloc_info", write_to_stream, stream, DumpFormat::kMallocInfoXml);
  return 0;
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
  info.ordblks = clamp(wide.ordblks);
  return info;
}

// --- memory that is not ours goes back to the C library --------------------------------
namespace {
// After the C library is initialised and before main: resolving symbols inside malloc would
// re-enter malloc, and the loader may call us before it can resolve anything.
__attribute__((constructor(101))) void install_foreign_handlers() {
  ForeignHandlers next{};
  next.free = reinterpret_cast<void (*)(void*)>(os::next_symbol("free"));
  next.realloc = reinterpret_cast<void* (*)(void*, size_t)>(os::next_symbol("realloc"));
  next.usable_size = reinterpret_cast<size_t (*)(void*)>(os::next_symbol("malloc_usable_size"));
  if (next.free == nullptr || next.realloc == nullptr || next.usable_size == nullptr) return;
  if (next.free == &free) return;  // no other allocator behind us
  set_foreign_handlers(next);
}
}  // namespace

// --- calls that need the process to have one thread ----------------------------------------
// The kernel refuses unshare and setns of a user or mount namespace (EINVAL) to a process with
// more than one thread, and the purger (purge/purge.hpp) is a thread the program did not make: a
// single-threaded program that made a large allocation could no longer enter a sandbox. So
// these end it first; it starts again at the next allocation slow path. glibc's unshare and
// setns are plain system calls, which ours make too.
namespace {
// The flags that make the kernel count threads: CLONE_NEWUSER and CLONE_NEWNS imply CLONE_FS,
// and CLONE_NEWUSER CLONE_THREAD; setns with type 0 may be given either kind of namespace.
constexpr int kUnshareOneThreadFlags =
    CLONE_NEWUSER | CLONE_NEWNS | CLONE_FS | CLONE_THREAD | CLONE_SIGHAND | CLONE_VM;
constexpr int kSetnsOneThreadTypes = CLONE_NEWUSER | CLONE_NEWNS;
}  // namespace

TRAY_PUBLIC int unshare(int flags) noexcept {
  if ((flags & kUnshareOneThreadFlags) != 0) purger_stop();
  return os::unshare_namespaces(flags);
}
TRAY_PUBLIC int setns(int fd, int type) noexcept {
  if (type == 0 || (type & kSetnsOneThreadTypes) != 0) purger_stop();
  return os::enter_namespace(fd, type);
}

// --- C++ ----------------------------------------------------------------------------------
// When memory runs out, operator new must call the new-handler and try again, or throw
// std::bad_alloc. Rather than link the C++ runtime (1.4 MiB of resident memory in every C
// program we are preloaded into), the failure path hands the request to the C++ runtime's own
// operator new behind us: it runs the standard loop, on our malloc, and throws if it must.
namespace {

enum NewKind : unsigned { kPlain, kNothrow, kAligned, kAlignedNothrow, kNewKinds };
constexpr const char* kNextNewSymbols[kNewKinds] = {
    "_Znwm", "_ZnwmRKSt9nothrow_t", "_ZnwmSt11align_val_t", "_ZnwmSt11align_val_tRKSt9nothrow_t"};

std::atomic<void*> g_next_new[kNewKinds];
// Our own tag: std::nothrow itself lives in the C++ runtime.
constexpr std::nothrow_t kNothrowTag{};

void* next_new(NewKind kind) {
  void* fn = g_next_new[kind].load(std::memory_order_acquire);
  if (fn == nullptr) {  // a C++ runtime loaded after our constructor ran
    fn = os::next_symbol(kNextNewSymbols[kind]);
    g_next_new[kind].store(fn, std::memory_order_release);
  }
  return fn;
}

__attribute__((constructor(101))) void resolve_next_new() {
  for (unsigned kind = 0; kind < kNewKinds; ++kind)
    g_next_new[kind].store(os::next_symbol(kNextNewSymbols[kind]), std::memory_order_release);
}

TRAY_NOINLINE void* new_failed(size_t size) {
  void* fn = next_new(kPlain);
  if (fn == nullptr) fatal("operator new: out of memory, and no C++ runtime to throw std::bad_alloc");
  return reinterpret_cast<void* (*)(size_t)>(fn)(size);
}

TRAY_NOINLINE void* new_failed_nothrow(size_t size) noexcept {
  void* fn = next_new(kNothrow);
  if (fn == nullptr) return nullptr;
  return reinterpret_cast<void* (*)(size_t, const std::nothrow_t&)>(fn)(size, kNothrowTag);
}

TRAY_NOINLINE void* new_failed_aligned(size_t size, std::align_val_t alignment) {
  void* fn = next_new(kAligned);
  if (fn == nullptr) fatal("operator new: out of memory, and no C++ runtime to throw std::bad_alloc");
  return reinterpret_cast<void* (*)(size_t, std::align_val_t)>(fn)(size, alignment);
}

TRAY_NOINLINE void* new_failed_aligned_nothrow(size_t size, std::align_val_t alignment) noexcept {
  void* fn = next_new(kAlignedNothrow);
  if (fn == nullptr) return nullptr;
  return reinterpret_cast<void* (*)(size_t, std::align_val_t, const std::nothrow_t&)>(fn)(
      size, alignment, kNothrowTag);
}

TRAY_INLINE void* new_fast(size_t size) {
  void* p = alloc(size);
  return TRAY_LIKELY(p != nullptr) ? p : new_failed(size);
}

TRAY_INLINE void* new_fast_nothrow(size_t size) noexcept {
  void* p = alloc(size);
  return TRAY_LIKELY(p != nullptr) ? p : new_failed_nothrow(size);
}

TRAY_INLINE void* new_aligned(size_t size, std::align_val_t alignment) {
  void* p = alloc_aligned(size, static_cast<size_t>(alignment), false);
  return TRAY_LIKELY(p != nullptr) ? p : new_failed_aligned(size, alignment);
}

TRAY_INLINE void* new_aligned_nothrow(size_t size, std::align_val_t alignment) noexcept {
  void* p = alloc_aligned(size, static_cast<size_t>(alignment), false);
  return TRAY_LIKELY(p != nullptr) ? p : new_failed_aligned_nothrow(size, alignment);
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
