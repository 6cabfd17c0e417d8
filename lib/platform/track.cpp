// Built only with -DTRAY_VALGRIND=ON or -DTRAY_ASAN=ON (see platform/track.hpp).
#include "platform/track.hpp"

#if TRAY_VALGRIND
#include <valgrind/memcheck.h>
#endif
#if TRAY_ASAN
#include <sanitizer/asan_interface.h>
// Weak: the library also links into programs built without -fsanitize=address (and the tests'
// own binaries), where these do nothing.
#pragma weak __asan_poison_memory_region
#pragma weak __asan_unpoison_memory_region
#endif

namespace tray {

namespace {

#if TRAY_ASAN
// A block handed out before the program's constructors is simply not poisoned until it is
// freed.
bool g_asan_started = false;
__attribute__((constructor)) void asan_started() { g_asan_started = &__asan_poison_memory_region != nullptr; }
#endif

}  // namespace

bool track_asan_present() noexcept {
#if TRAY_ASAN
  return g_asan_started;
#else
  return false;
#endif
}

void track_unmapped(const void* p, size_t bytes) noexcept {
#if TRAY_ASAN
  if (track_asan_present()) __asan_unpoison_memory_region(p, bytes);
#endif
  (void)p, (void)bytes;
}

TrackScope::TrackScope() noexcept {
#if TRAY_VALGRIND
  VALGRIND_DISABLE_ERROR_REPORTING;
#endif
}

TrackScope::~TrackScope() {
#if TRAY_VALGRIND
  VALGRIND_ENABLE_ERROR_REPORTING;
#endif
}

}  // namespace tray
