#include "report/report.hpp"

#include <errno.h>
#include <unistd.h>

#include <cstddef>

#include "core/core.hpp"
#include "events/events.hpp"
#include "heap/heap.hpp"
#include "large/large.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "report/stats_print.hpp"
#include "segment/segment.hpp"
#include "size_classes/size_classes.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

static_assert(kSizeClassCount <= TRAY_STATS_MAX_CLASSES);

// Where dumps go without stats_file. Some programs (coreutils among them) close stderr in an
// exit handler that runs before library destructors, so stats=1 keeps a copy from the start.
int g_dump_fd = STDERR_FILENO;
int g_installed_signal = 0;
std::atomic<int> g_dumping_thread{0};  // thread id of the dump in progress, 0 for none

// Not a mutex: a signal handler may interrupt the very thread that holds it.
bool begin_dump() {
  const int self = os::thread_id();
  int expected = 0;
  while (!g_dumping_thread.compare_exchange_weak(expected, self, std::memory_order_acquire)) {
    if (expected == self) return false;
    expected = 0;
    os::yield_thread();
  }
  return true;
}

void end_dump() { g_dumping_thread.store(0, std::memory_order_release); }

uint64_t load(const std::atomic<size_t>& counter) { return counter.load(std::memory_order_relaxed); }

// What the calling thread's own heaps (its heap, and the parts of program heaps bound to it)
// have not counted yet, found by a look: blocks handed out of their slots' current lists, and
// frees into their pages. Other threads' heaps are read as their counters stand (GUIDE,
// "Statistics": how far behind that can be while they run).
void collect_own_heaps(Uncounted* out) {
  const Heap* own = tls_own_heap;
  if (own == nullptr) return;
  heap_uncounted(own, out);
  for (const Heap* part = own->bound_parts; part != nullptr; part = part->next_bound)
    heap_uncounted(part, out);
}

// Every count a dump reads is at most the truth; the most any dump has read is too.
uint64_t raise_to_reported(std::atomic<uint64_t>& reported, uint64_t now) {
  count_max(reported, now);
  return reported.load(std::memory_order_relaxed);
}

void collect_classes(tray_stats* out) {
  out->class_count = kSizeClassCount;
  Uncounted own;
  collect_own_heaps(&own);
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    tray_class_stats& entry = out->classes[c];
    entry = tray_class_stats{};
    entry.block_bytes = class_size(c);
    entry.page_bytes = class_slab_units(c) * kUnitBytes;
    entry.blocks_per_page = class_blocks_per_page(c);
    const ClassTotals& totals = g_totals.classes[c];
    entry.frees = totals.unowned_frees.load(std::memory_order_relaxed) + own.frees[c];
    entry.pages = totals.pages.load(std::memory_order_relaxed);
    entry.peak_pages = totals.peak_pages.load(std::memory_order_relaxed);
    entry.allocations = own.allocations[c];
    entry.requested_bytes = own.requested_bytes[c];
  }
  uint64_t remote_frees = load(g_totals.unowned_remote_frees);
  uint64_t reused_blocks = 0;
  for (const Heap* heap = heap_list(); heap != nullptr; heap = heap->next_created) {
    const HeapCounters& counters = heap->counters;
    for (unsigned c = 0; c < kSizeClassCount; ++c) {
      out->classes[c].allocations += counter_read(counters.allocations[c]);
      out->classes[c].frees += counter_read(counters.frees[c]);
      out->classes[c].requested_bytes += counter_read(counters.requested_bytes[c]);
    }
    remote_frees += counter_read(counters.remote_frees);
    reused_blocks += counter_read(counters.reused_blocks);
  }
  out->remote_frees = remote_frees;
  out->reused_blocks = reused_blocks;
  for (unsigned c = 0; c < kSizeClassCount; ++c) {
    tray_class_stats& entry = out->classes[c];
    ClassTotals& totals = g_totals.classes[c];
    entry.allocations = raise_to_reported(totals.reported_allocations, entry.allocations);
    entry.frees = raise_to_reported(totals.reported_frees, entry.frees);
    entry.requested_bytes = raise_to_reported(totals.reported_requested_bytes, entry.requested_bytes);
    // Frees may be counted where the allocations of other running threads are not yet.
    entry.live_blocks = entry.allocations > entry.frees ? entry.allocations - entry.frees : 0;
    std::atomic<uint64_t>& peak = g_totals.classes[c].peak_live_blocks;
    count_max(peak, entry.live_blocks);
    entry.peak_live_blocks = peak.load(std::memory_order_relaxed);
  }
}

void collect_memory(tray_stats* out) {
  const uint64_t segments = load(g_totals.segments_mapped);
  const uint64_t segment_bytes = segments * kSegmentBytes;
  const uint64_t metadata = load(g_totals.bytes_metadata);
  const uint64_t large_mapped = load(g_totals.bytes_mapped) - segment_bytes;
  out->large.allocations = load(g_totals.large_allocations);
  out->large.frees = load(g_totals.large_frees);
  // Read apart from each other: a block allocated and freed in between can put frees ahead.
  out->large.live_blocks =
      out->large.allocations > out->large.frees ? out->large.allocations - out->large.frees : 0;
  out->large.live_bytes = load(g_totals.bytes_large);
  out->large.peak_bytes = load(g_totals.bytes_large_peak);
  out->large.mapped_bytes = large_mapped;
  size_t cached_blocks, cached_bytes;
  large_cache_usage(&cached_blocks, &cached_bytes);
  out->large.cached_blocks = cached_blocks;
  out->large.cached_bytes = cached_bytes;
  out->mapped_bytes = load(g_totals.bytes_mapped) + metadata;
  // Address space whose OS pages are touched one per 32 MiB of segments: apart from the rest.
  out->unit_map_bytes = load(g_totals.bytes_index);
  out->committed_bytes = held_bytes();
  out->resident_bytes = os::resident_bytes();
  out->released_bytes = load(g_totals.bytes_purged);
  out->metadata_bytes = metadata + segments * align_up(sizeof(Segment), os::page_size());
  out->segments = segments;
  LimitReport limit;
  limit_report(&limit);
  out->memory_limit_bytes = limit.bytes;
  out->memory_limit_from_cgroup = limit.from_cgroup;
  out->memory_limit_fail = limit.fail;
  out->memory_limit_reached = limit.reached;
  out->memory_limit_failures = limit.failures;
  out->memory_limit_released_bytes = limit.released_bytes;
}

void collect_process(tray_stats* out) {
  out->threads_alive = load(g_totals.threads_attached);
  out->threads_exited = load(g_totals.threads_exited);
  out->heaps_created = load(g_totals.heaps_created);
  out->foreign_frees = load(g_totals.foreign_frees);
  out->debug_errors = load(g_totals.debug_errors);
  out->os_mmap = os::g_calls.mmap.load(std::memory_order_relaxed);
  out->os_munmap = os::g_calls.munmap.load(std::memory_order_relaxed);
  out->os_madvise = os::g_calls.madvise.load(std::memory_order_relaxed);
  out->os_mremap = os::g_calls.mremap.load(std::memory_order_relaxed);
  out->os_mprotect = os::g_calls.mprotect.load(std::memory_order_relaxed);
}

void write_to_fd(void* context, const char* text, size_t length) {
  os::write_fd(*static_cast<int*>(context), text, length);
}

void warn(const char* message) { os::write_fd(g_dump_fd, message, __builtin_strlen(message)); }

// Collects and writes one dump; the caller holds the dump's turn (begin_dump).
void dump_now(const char* reason, StatsSink sink, DumpFormat format) {
  tray_stats stats;
  stats.version = TRAY_STATS_VERSION;
  stats_collect(&stats);
  switch (format) {
    case DumpFormat::kText: stats_print_text(stats, os::process_id(), reason, sink); break;
    case DumpFormat::kJson: stats_print_json(stats, os::process_id(), reason, sink); break;
    case DumpFormat::kPrometheus: stats_print_prometheus(stats, os::process_id(), sink); break;
    case DumpFormat::kMallocInfoXml: stats_print_xml(stats, sink); break;
    case DumpFormat::kMallocStats:
      stats_print_text(stats, os::process_id(), reason, sink);
      stats_print_glibc_totals(stats, sink);
      break;
  }
}

// The file a dump replaces, and whether every write to it got through (a full disk must not
// put half a dump in the place of a whole one).
struct ReplacingWrite {
  int fd;
  bool complete;
};

void write_replacing(void* context, const char* text, size_t length) {
  auto* file = static_cast<ReplacingWrite*>(context);
  if (file->complete) file->complete = os::write_fd(file->fd, text, length);
}

constexpr size_t kDumpPathBytes = 640;

// A Prometheus dump replaces stats_file whole: it is written to PATH.tmp.PID beside it (one file
// system, so rename(2) can move it; node_exporter's textfile collector reads *.prom files only)
// and renamed over PATH, so that a reader opens the previous dump or this one, never part of
// one. The threads of a process share the temporary file, so all of it happens in the dump's
// turn. False if the temporary file cannot be created.
bool dump_replacing(const char* path, const char* reason, DumpFormat format) {
  os::CancelDisabled no_cancel;  // end_dump must run
  char temporary[kDumpPathBytes + 32];
  TextBuffer name(temporary, sizeof temporary - 1);
  name.str(path).str(".tmp.").dec(uint64_t(os::process_id()));
  temporary[name.length()] = '\0';
  if (!begin_dump()) return true;  // a signal in this thread's own dump: dropped, as elsewhere
  const int fd = os::open_truncate(temporary);
  if (fd < 0) {
    end_dump();
    return false;
  }
  ReplacingWrite file{fd, true};
  dump_now(reason, StatsSink{write_replacing, &file}, format);
  os::close_fd(fd);
  if (!file.complete || !os::rename_file(temporary, path)) {
    os::remove_file(temporary);
    warn("traymalloc: cannot write stats_file; it keeps the previous dump\n");
  }
  end_dump();
  return true;
}

DumpFormat configured_format() {
  switch (option(Option::kStatsFormat)) {
    case kStatsJson: return DumpFormat::kJson;
    case kStatsPrometheus: return DumpFormat::kPrometheus;
    default: return DumpFormat::kText;
  }
}

}  // namespace

// A dump where the options say: stats_file, else stderr. Text and JSON dumps are appended to
// the file, one after another (the history that tools/tray-timeline reads); a Prometheus dump
// replaces it whole (dump_replacing), since a scraper wants the numbers of now, once.
void stats_dump_as_configured(const char* reason) {
  const DumpFormat format = configured_format();
  int fd = g_dump_fd;
  bool opened = false;
  const char* pattern = option_stats_file();
  if (pattern[0] != '\0') {
    char path[kDumpPathBytes];
    const bool named = expand_path(pattern, 0, path, sizeof path);
    if (named && format == DumpFormat::kPrometheus) {
      if (dump_replacing(path, reason, format)) return;
    } else if (named) {
      fd = os::open_append(path);
      opened = fd >= 0;
    }
    if (!opened) {
      fd = g_dump_fd;
      warn("traymalloc: cannot open stats_file; dumping to stderr\n");
    }
  }
  stats_dump(reason, write_to_fd, &fd, format);
  if (opened) os::close_fd(fd);
}

// A fork in the middle of another thread's dump must not leave the child waiting for it.
void report_after_fork_child() { g_dumping_thread.store(0, std::memory_order_relaxed); }

namespace {

void dump_on_signal(int) { stats_dump_as_configured("signal"); }

__attribute__((constructor)) void stats_at_start() {
  if (option(Option::kStats) != 0) {
    const int fd = os::duplicate_fd(STDERR_FILENO);
    if (fd >= 0) g_dump_fd = fd;
  }
  report_options_changed();
}

// Runs at exit (and at dlclose, which -z nodelete rules out for the .so).
__attribute__((destructor)) void stats_at_exit() {
  if (option(Option::kStats) != 0) stats_dump_as_configured("exit");
}

}  // namespace

void stats_collect(tray_stats* out) {
  collect_classes(out);
  collect_memory(out);
  collect_process(out);
}

bool stats_dump(const char* reason, tray_write_fn write, void* context, DumpFormat format) {
  os::CancelDisabled no_cancel;  // end_dump must run
  if (!begin_dump()) return false;
  int fd = STDERR_FILENO;
  const StatsSink sink = write != nullptr ? StatsSink{write, context} : StatsSink{write_to_fd, &fd};
  dump_now(reason, sink, format);
  end_dump();
  return true;
}

void report_options_changed() {
  if (option(Option::kStatsInterval) > 0) purger_require();
  install_signal_option(Option::kStatsSignal, &g_installed_signal, dump_on_signal);
}

}  // namespace tray

using namespace tray;

extern "C" {

// Callers of older versions have the struct without the fields added since: 4 and 3 end
// before reused_blocks, 2 before the memory limit's, 1 before unit_map_bytes.
TRAY_EXPORT int tray_stats_get(tray_stats* out) {
  if (out == nullptr || out->version == 0 || out->version > TRAY_STATS_VERSION) return EINVAL;
  if (out->version == TRAY_STATS_VERSION) {
    stats_collect(out);
    return 0;
  }
  tray_stats all;
  stats_collect(&all);
  all.version = out->version;
  const size_t bytes = out->version == 1   ? offsetof(tray_stats, unit_map_bytes)
                       : out->version == 2 ? offsetof(tray_stats, memory_limit_bytes)
                                           : offsetof(tray_stats, reused_blocks);
  __builtin_memcpy(out, &all, bytes);
  return 0;
}

TRAY_EXPORT int tray_stats_print(tray_write_fn write, void* context, unsigned flags) {
  if (flags > TRAY_STATS_PROMETHEUS) return EINVAL;
  const DumpFormat format = flags == TRAY_STATS_JSON         ? DumpFormat::kJson
                            : flags == TRAY_STATS_PROMETHEUS ? DumpFormat::kPrometheus
                                                             : DumpFormat::kText;
  return stats_dump("api", write, context, format) ? 0 : EBUSY;
}

}  // extern "C"
