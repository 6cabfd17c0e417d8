// Statistics dumps: a tray_stats snapshot written as a text table or as one line of JSON,
// in pieces through a caller's write function, from a buffer on the stack (never allocating,
// so dumps work inside a signal handler and in programs that replaced malloc with us).
#pragma once

#include <cstddef>

#include "traymalloc.h"

namespace tray {

struct StatsSink {
  tray_write_fn write;
  void* context;
};

// `reason` says what asked for the dump: "exit", "signal", "api", "malloc_stats".
void stats_print_text(const tray_stats& stats, int pid, const char* reason, StatsSink sink);
void stats_print_json(const tray_stats& stats, int pid, const char* reason, StatsSink sink);
// glibc's malloc_info() XML, with our numbers: free blocks per size class, large blocks as
// "mmap", committed memory as "system".
void stats_print_xml(const tray_stats& stats, StatsSink sink);
// glibc's malloc_stats() totals, after the text dump there: what scripts written for glibc's
// output read. "system bytes" is committed memory, "in use bytes" the live bytes, "max mmap
// regions" the large blocks live now (glibc: the most ever) and "max mmap bytes" their peak.
void stats_print_glibc_totals(const tray_stats& stats, StatsSink sink);

}  // namespace tray
