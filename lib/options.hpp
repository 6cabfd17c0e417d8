// Run-time options, read once from the environment variable TRAY_OPTIONS
// ("key=value,key=value"), without allocating. An unknown key or a bad value is reported on
// stderr in one line and the default stays.
#pragma once

#include <cstdint>

namespace tray {

enum class Option : unsigned {
  kStats,  // stats=1: print a summary of the process's allocator use to stderr at exit
  kDebug,  // debug=1: checks and 0x1deadb0b fills in the object pools (include/tray), which
           // read TRAY_OPTIONS themselves; known here so that it is not reported as unknown
  kCount,
};

// The value of an option (parsing TRAY_OPTIONS on first use).
int64_t option(Option which);

}  // namespace tray
