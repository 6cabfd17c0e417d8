// Run-time options, read once from the environment variable TRAY_OPTIONS
// ("key=value,key=value"), without allocating. An unknown key or a bad value is reported on
// stderr in one line and the default stays.
#pragma once

#include <cstdint>

namespace tray {

enum class Option : unsigned {
  kStats,  // stats=1: print a summary of the process's allocator use to stderr at exit
  kCount,
};

// The value of an option (parsing TRAY_OPTIONS on first use).
int64_t option(Option which);

}  // namespace tray
