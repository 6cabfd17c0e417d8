// Assertions in tiers:
//  fatal()         the reports of misuse that every build makes (a double or invalid free, a
//                  corrupted free list: heap/free_key.cpp, debug/): a message naming the
//                  address and size class, then abort;
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
