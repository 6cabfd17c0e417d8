// Assertions in tiers:
//  fatal_misuse()  the reports of misuse that release builds make (a double or invalid free,
//                  a realloc of a freed block: heap/hardening.cpp, large/): a message naming the
//                  address and size class, the hint to rerun in debug mode, a backtrace, abort;
//  fatal()         a condition the allocator cannot go on from (the OS refused its maps);
//  TRAY_CHECK      always on: guards against heap corruption and broken promises between the
//                  layers, cheap, on slow paths only;
//  TRAY_ASSERT     builds without NDEBUG (the sanitizer and clang test builds keep them):
//                  internal invariants, may sit on fast paths.
// A failed check formats into a stack buffer, writes it with write(2) and aborts: nothing on
// this path allocates.
#pragma once

#include "core/core.hpp"

namespace tray {

// Prints "traymalloc: <message>" and a newline to stderr, then aborts.
[[noreturn]] TRAY_COLD void fatal(const char* message);
[[noreturn]] TRAY_COLD void fatal_check(const char* condition, const char* file, int line);
// Writes `message` (whole "traymalloc: ..." lines), the hint that debug mode says more, and the
// backtrace, then aborts. Preparing the backtrace may allocate (the unwinder loads on first
// use): the caller has changed nothing yet and holds no lock.
[[noreturn]] TRAY_COLD void fatal_misuse(const TextBuffer& message);

}  // namespace tray

#define TRAY_CHECK(cond)                                                          \
  do {                                                                            \
    if (TRAY_UNLIKELY(!(cond))) ::tray::fatal_check(#cond, __FILE__, __LINE__);   \
  } while (0)

#ifdef NDEBUG
#define TRAY_ASSERT(cond) \
  do {                    \
  } while (0)
#else
#define TRAY_ASSERT(cond) TRAY_CHECK(cond)
#endif
