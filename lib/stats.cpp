#include "stats.hpp"

#include <unistd.h>

#include "core/format.hpp"
#include "options.hpp"
#include "platform/os.hpp"

namespace tray {

constinit Totals g_totals;

namespace {
// Where the summary goes. Some programs (coreutils among them) close stderr in an exit
// handler that runs before library destructors, so stats=1 keeps a copy of it from the start.
int g_summary_fd = STDERR_FILENO;
}  // namespace

void stats_print_summary() {
  char storage[512];
  TextBuffer out(storage, sizeof storage);
  auto field = [&](const char* name, const std::atomic<size_t>& value) {
    out.chr(' ').str(name).chr('=').dec(value.load(std::memory_order_relaxed));
  };
  out.str("traymalloc: stats: pid=").dec(uint64_t(os::process_id()));
  field("pages_acquired", g_totals.pages_acquired);
  field("large_allocations", g_totals.large_allocations);
  field("segments_mapped", g_totals.segments_mapped);
  field("bytes_mapped", g_totals.bytes_mapped);
  field("heaps_created", g_totals.heaps_created);
  field("foreign_frees", g_totals.foreign_frees);
  out.chr('\n');
  out.write_to(g_summary_fd);
}

namespace {
__attribute__((constructor)) void keep_stderr_for_stats() {
  if (option(Option::kStats) == 0) return;
  const int fd = os::duplicate_fd(STDERR_FILENO);
  if (fd >= 0) g_summary_fd = fd;
}

// Runs at exit (and at dlclose, which -z nodelete rules out for the .so).
__attribute__((destructor)) void print_stats_at_exit() {
  if (option(Option::kStats) != 0) stats_print_summary();
}
}  // namespace

}  // namespace tray
