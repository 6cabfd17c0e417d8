// Statistics dumps: a tray_stats snapshot written as a text table, as one line of JSON or in
// Prometheus's text format, in pieces through a caller's write function, from a buffer on the
// stack (never allocating, so dumps work inside a signal handler and in programs that replaced
// malloc with us).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/core.hpp"
#include "traymalloc.h"

namespace tray {

struct StatsSink {
  tray_write_fn write;
  void* context;
};

// What every dump derives from a class's entry the same way.
inline uint64_t class_live_bytes(const tray_class_stats& c) {
  return c.live_blocks * c.block_bytes;
}
inline uint64_t class_reserved_bytes(const tray_class_stats& c) { return c.pages * c.page_bytes; }
// Classes never used get no row (text) and no series (Prometheus).
inline bool class_used(const tray_class_stats& c) { return c.allocations != 0 || c.pages != 0; }

// `reason` says what asked for the dump: "exit", "signal", "api", "malloc_stats".
void stats_print_text(const tray_stats& stats, int pid, const char* reason, StatsSink sink);
void stats_print_json(const tray_stats& stats, int pid, const char* reason, StatsSink sink);
// Prometheus's text exposition format, version 0.0.4 (prometheus.cpp): what node_exporter's
// textfile collector reads, and what a server's own /metrics can pass on. Every series carries
// the labels pid and exe (the executable's file name).
void stats_print_prometheus(const tray_stats& stats, int pid, StatsSink sink);
// text[0, length) as the inside of a label value: backslash, double quote and line feed
// escaped; a byte that is not part of well-formed UTF-8 becomes '?', since a scrape with one
// fails whole.
void prometheus_label_value(TextBuffer& out, const char* text, size_t length);
// glibc's malloc_info() XML, with our numbers: free blocks per size class, large blocks as
// "mmap", committed memory as "system".
void stats_print_xml(const tray_stats& stats, StatsSink sink);
// glibc's malloc_stats() totals, after the text dump there: what scripts written for glibc's
// output read. "system bytes" is committed memory, "in use bytes" the live bytes, "max mmap
// regions" the large blocks live now (glibc: the most ever) and "max mmap bytes" their peak.
void stats_print_glibc_totals(const tray_stats& stats, StatsSink sink);

}  // namespace tray
