// Statistics as the outside sees them: a snapshot gathered from the heaps and the process
// counters (tray_stats_get), and the dumps that TRAY_OPTIONS asks for (at exit, on a signal,
// to stderr or a file). Every path here is async-signal-safe: no allocation, no lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "options/options.hpp"
#include "report/stats_print.hpp"
#include "traymalloc.h"

namespace tray {

void stats_collect(tray_stats* out);

enum class DumpFormat { kText, kJson, kPrometheus, kMallocInfoXml, kMallocStats };
// Collects and writes one dump; `reason` names what asked for it. Dumps of different threads
// take turns, so their pieces never mix in a shared file; a dump asked for by a signal handler
// that interrupted its own thread's dump is dropped (false).
bool stats_dump(const char* reason, tray_write_fn write, void* context, DumpFormat format);
// A dump where the options say (stats_file or stderr, stats_format): appended to the file, or
// in the Prometheus format put in its place whole.
void stats_dump_as_configured(const char* reason);
// Applies stats_signal and stats_interval after tray_option_set changed them.
void report_options_changed();
// In the child of a fork (api/process.cpp): no dump is under way there.
void report_after_fork_child();

}  // namespace tray
