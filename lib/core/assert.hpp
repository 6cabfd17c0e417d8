// Assertions in three tiers:
//  TRAY_CHECK      always on: guards against heap corruption, cheap, on slow paths only;
//  TRAY_ASSERT     debug builds (!NDEBUG): internal invariants, may sit on fast paths;
//  invariant walks (heap_validate and friends) are functions that tests call explicitly.
// A failed check formats into a stack buffer, writes it with write(2) and aborts.
#pragma once

#include "core/bits.hpp"

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
