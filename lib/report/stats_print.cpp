#include "report/stats_print.hpp"

#include "core/core.hpp"
#include "heap/heap.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "report/dump_output.hpp"
#include "stats/stats.hpp"

namespace tray {

namespace {

// The JSON dump's format: a key added keeps it (readers skip keys they do not know); a key
// renamed, removed or given another meaning changes it (tools/tray-stats checks it). 2:
// requested_bytes is an estimate; 1 counted it exactly.
constexpr unsigned kJsonFormatVersion = 2;

uint64_t class_capacity(const tray_class_stats& c) { return c.pages * c.blocks_per_page; }
// Bytes handed out beyond what was asked for, over all allocations of the class.
uint64_t class_waste_bytes(const tray_class_stats& c) {
  const uint64_t handed_out = c.allocations * c.block_bytes;
  return handed_out > c.requested_bytes ? handed_out - c.requested_bytes : 0;
}

// Where the limit came from: memory_limit, or the cgroup file (whose path only the running
// process knows, so it is looked up here rather than carried in tray_stats).
const char* limit_source(const tray_stats& s) {
  if (s.memory_limit_from_cgroup == 0) return "memory_limit";
  LimitReport limit;
  limit_report(&limit);
  return limit.source;
}

// "  memory limit: ...", only in a process that has one (or had, and reached it).
void text_limit_line(TextBuffer& out, const tray_stats& s) {
  if (s.memory_limit_bytes == 0 && s.memory_limit_reached == 0) return;
  out.str("  memory limit: ");
  if (s.memory_limit_bytes == 0) out.str("none now");
  else out.human(s.memory_limit_bytes).str(s.memory_limit_fail != 0 ? " (fail" : " (soft");
  if (s.memory_limit_bytes != 0) out.str(", from ").str(limit_source(s)).chr(')');
  out.str("; reached ").dec(s.memory_limit_reached).str(", failed ").dec(s.memory_limit_failures);
  out.str(", gave back ").human(s.memory_limit_released_bytes).chr('\n');
}

// The thp option's word, and the kernel's mode beside it (dumps only: both read a file).
const char* thp_mode_name() {
  switch (option(Option::kThp)) {
    case kThpNever: return "never";
    case kThpMadvise: return "madvise";
    default: return "system";
  }
}

// --- text ----------------------------------------------------------------------------------
struct Column {
  const char* title;
  size_t width;
};
constexpr Column kColumns[] = {{"class", 9},  {"blocks/page", 12}, {"live", 11},    {"peak", 11},
                               {"allocs", 14}, {"frees", 14},      {"pages", 8},    {"live bytes", 12},
                               {"reserved", 12}, {"util", 7},      {"waste", 7}};

template <typename Write>
void cell(TextBuffer& out, unsigned column, Write write) {
  const size_t start = out.length();
  write(out);
  out.align_right(start, kColumns[column].width);
}

void text_class_row(TextBuffer& out, const tray_class_stats& c) {
  out.str("  ");
  unsigned i = 0;
  cell(out, i++, [&](TextBuffer& t) { t.size(c.block_bytes); });
  cell(out, i++, [&](TextBuffer& t) { t.dec(c.blocks_per_page); });
  cell(out, i++, [&](TextBuffer& t) { t.dec(c.live_blocks); });
  cell(out, i++, [&](TextBuffer& t) { t.dec(c.peak_live_blocks); });
  cell(out, i++, [&](TextBuffer& t) { t.dec(c.allocations); });
  cell(out, i++, [&](TextBuffer& t) { t.dec(c.frees); });
  cell(out, i++, [&](TextBuffer& t) { t.dec(c.pages); });
  cell(out, i++, [&](TextBuffer& t) { t.human(class_live_bytes(c)); });
  cell(out, i++, [&](TextBuffer& t) { t.human(class_reserved_bytes(c)); });
  cell(out, i++, [&](TextBuffer& t) { t.ratio(c.live_blocks * 100, class_capacity(c), 1).chr('%'); });
  cell(out, i++, [&](TextBuffer& t) {
    t.ratio(class_waste_bytes(c) * 100, c.allocations * c.block_bytes, 1).chr('%');
  });
  out.chr('\n');
}

// --- JSON ----------------------------------------------------------------------------------
class JsonObject {
 public:
  explicit JsonObject(TextBuffer& out) : out_(out) { out_.chr('{'); }
  JsonObject& field(const char* name, uint64_t value) {
    key(name).dec(value);
    return *this;
  }
  JsonObject& text(const char* name, const char* value) {
    key(name).chr('"').str(value).chr('"');  // our own words only: nothing to escape
    return *this;
  }
  // A path from the system (the cgroup file of the memory limit): quotes and backslashes
  // escaped, control characters left out.
  JsonObject& path(const char* name, const char* value) {
    TextBuffer& out = key(name).chr('"');
    for (const char* c = value; *c != '\0'; ++c) {
      if (*c == '"' || *c == '\\') out.chr('\\');
      if (static_cast<unsigned char>(*c) >= 0x20) out.chr(*c);
    }
    out.chr('"');
    return *this;
  }
  JsonObject& ratio(const char* name, uint64_t numerator, uint64_t denominator) {
    key(name).ratio(numerator, denominator, 3);
    return *this;
  }
  TextBuffer& key(const char* name) {
    if (!first_) out_.chr(',');
    first_ = false;
    return out_.chr('"').str(name).str("\":");
  }
  void close() { out_.chr('}'); }

 private:
  TextBuffer& out_;
  bool first_ = true;
};

// At most this many program heaps get a line or an entry each; the rest are counted.
constexpr unsigned kListedProgramHeaps = 32;

// A line per live program heap (tray_heap_new), while there are any.
void text_program_heaps(DumpOutput& output) {
  TextBuffer& out = output.text();
  unsigned listed = 0, unlisted = 0;
  for (const ProgramHeap* heap = program_heap_list(); heap != nullptr; heap = heap->next_created) {
    ProgramHeapUsage usage;
    if (!program_heap_usage(heap, &usage)) continue;
    if (listed == kListedProgramHeaps) {
      ++unlisted;
      continue;
    }
    ++listed;
    out.str("  heap #").dec(usage.serial).str(" (").ptr(heap).str("): ").dec(usage.live_blocks);
    out.str(" live blocks (").human(usage.live_bytes).str(") in pages of ").human(usage.page_bytes);
    out.str(", large ").dec(usage.large_blocks).str(" (").human(usage.large_bytes).str("), threads ");
    out.dec(usage.parts).chr('\n');
    output.piece_done();
  }
  if (unlisted != 0) out.str("  heaps: ").dec(unlisted).str(" more\n");
}

}  // namespace

void stats_print_text(const tray_stats& s, int pid, const char* reason, StatsSink sink) {
  DumpOutput output(sink);
  TextBuffer& out = output.text();
  out.str("traymalloc: stats: pid=").dec(uint64_t(pid)).str(" reason=").str(reason).chr('\n');
  out.str("  ");
  for (const Column& column : kColumns) {
    const size_t start = out.length();
    out.str(column.title);
    out.align_right(start, column.width);
  }
  out.chr('\n');
  tray_class_stats sum{};
  for (unsigned i = 0; i < s.class_count; ++i) {
    const tray_class_stats& c = s.classes[i];
    if (!class_used(c)) continue;
    text_class_row(out, c);
    output.piece_done();
    sum.live_blocks += c.live_blocks;
    sum.allocations += c.allocations;
    sum.frees += c.frees;
    sum.pages += c.pages;
  }
  uint64_t live_bytes = 0, reserved_bytes = 0, capacity = 0, waste = 0, handed_out = 0;
  for (unsigned i = 0; i < s.class_count; ++i) {
    live_bytes += class_live_bytes(s.classes[i]);
    reserved_bytes += class_reserved_bytes(s.classes[i]);
    capacity += class_capacity(s.classes[i]);
    waste += class_waste_bytes(s.classes[i]);
    handed_out += s.classes[i].allocations * s.classes[i].block_bytes;
  }
  out.str("  small: ").dec(sum.live_blocks).str(" live blocks (").human(live_bytes);
  out.str(") in ").dec(sum.pages).str(" pages (").human(reserved_bytes).str("), utilisation ");
  out.ratio(sum.live_blocks * 100, capacity, 1).str("%, waste ").ratio(waste * 100, handed_out, 1);
  out.str("%; ").dec(sum.allocations).str(" allocations, ").dec(sum.frees).str(" frees\n");
  out.str("  large: ").dec(s.large.live_blocks).str(" live blocks (").human(s.large.live_bytes);
  out.str("), peak ").human(s.large.peak_bytes).str("; ").dec(s.large.allocations);
  out.str(" allocations, ").dec(s.large.frees).str(" frees; mapped ").human(s.large.mapped_bytes);
  out.str(", cached ").dec(s.large.cached_blocks).str(" (").human(s.large.cached_bytes).str(")\n");
  output.piece_done();
  out.str("  memory: mapped ").human(s.mapped_bytes).str(", committed ").human(s.committed_bytes);
  out.str(", resident ").human(s.resident_bytes).str(" (whole process), released ");
  out.human(s.released_bytes).str(", metadata ").human(s.metadata_bytes).str(", segments ");
  out.dec(s.segments).str(", unit map ").human(s.unit_map_bytes).str(" of address space\n");
  text_limit_line(out, s);
  const int64_t huge_bytes = os::anon_huge_page_bytes();
  out.str("  huge pages: thp=").str(thp_mode_name()).str(" (kernel: ").str(os::thp_kernel_mode());
  out.str("), AnonHugePages ");
  if (huge_bytes < 0) out.str("unknown");
  else out.human(uint64_t(huge_bytes));
  out.str(" (whole process)\n");
  out.str("  threads: alive ").dec(s.threads_alive).str(", exited ").dec(s.threads_exited);
  out.str(", heaps ").dec(s.heaps_created).str("; remote frees ").dec(s.remote_frees);
  out.str(" (").dec(s.reused_blocks).str(" blocks reused by the thread that freed them)");
  out.str(", foreign frees ").dec(s.foreign_frees).str(", debug errors ").dec(s.debug_errors).chr('\n');
  output.piece_done();
  text_program_heaps(output);
  out.str("  os calls: mmap ").dec(s.os_mmap).str(", munmap ").dec(s.os_munmap).str(", madvise ");
  out.dec(s.os_madvise).str(", mremap ").dec(s.os_mremap).str(", mprotect ").dec(s.os_mprotect).chr('\n');
}

void stats_print_json(const tray_stats& s, int pid, const char* reason, StatsSink sink) {
  DumpOutput output(sink);
  TextBuffer& out = output.text();
  JsonObject root(out);
  root.field("traymalloc_stats", kJsonFormatVersion);
  char version[32];
  TextBuffer version_text(version, sizeof version - 1);
  version_text.dec(TRAY_VERSION_MAJOR).chr('.').dec(TRAY_VERSION_MINOR).chr('.').dec(TRAY_VERSION_PATCH);
  version[version_text.length()] = '\0';
  root.text("library", version).field("pid", uint64_t(pid)).text("reason", reason);
  // Monotonic: dumps of one process (stats_interval) line up on a time axis.
  root.field("time_ms", os::now_ms());
  root.key("classes").chr('[');
  for (unsigned i = 0; i < s.class_count; ++i) {
    const tray_class_stats& c = s.classes[i];
    if (i != 0) out.chr(',');
    JsonObject entry(out);
    entry.field("class", i).field("block_bytes", c.block_bytes).field("page_bytes", c.page_bytes);
    entry.field("blocks_per_page", c.blocks_per_page).field("live_blocks", c.live_blocks);
    entry.field("peak_live_blocks", c.peak_live_blocks).field("allocations", c.allocations);
    entry.field("frees", c.frees).field("pages", c.pages).field("peak_pages", c.peak_pages);
    entry.field("live_bytes", class_live_bytes(c)).field("reserved_bytes", class_reserved_bytes(c));
    entry.field("requested_bytes", c.requested_bytes);
    entry.ratio("utilization", c.live_blocks, class_capacity(c));
    entry.ratio("internal_waste", class_waste_bytes(c), c.allocations * c.block_bytes);
    entry.close();
    output.piece_done();
  }
  out.chr(']');
  root.key("large");
  JsonObject large(out);
  large.field("allocations", s.large.allocations).field("frees", s.large.frees);
  large.field("live_blocks", s.large.live_blocks).field("live_bytes", s.large.live_bytes);
  large.field("peak_bytes", s.large.peak_bytes).field("mapped_bytes", s.large.mapped_bytes);
  large.field("cached_blocks", s.large.cached_blocks).field("cached_bytes", s.large.cached_bytes);
  large.close();
  output.piece_done();
  root.key("process");
  JsonObject process(out);
  process.field("mapped_bytes", s.mapped_bytes).field("committed_bytes", s.committed_bytes);
  process.field("resident_bytes", s.resident_bytes).field("released_bytes", s.released_bytes);
  process.field("metadata_bytes", s.metadata_bytes).field("segments", s.segments);
  process.field("unit_map_bytes", s.unit_map_bytes);
  process.field("threads_alive", s.threads_alive).field("threads_exited", s.threads_exited);
  process.field("heaps_created", s.heaps_created).field("remote_frees", s.remote_frees);
  process.field("reused_blocks", s.reused_blocks);
  process.field("foreign_frees", s.foreign_frees).field("debug_errors", s.debug_errors);
  process.close();
  output.piece_done();
  // The program heaps (tray_heap_new) alive now; the first kListedProgramHeaps of them.
  root.key("heaps").chr('[');
  unsigned listed = 0;
  for (const ProgramHeap* heap = program_heap_list(); heap != nullptr && listed < kListedProgramHeaps;
       heap = heap->next_created) {
    ProgramHeapUsage usage;
    if (!program_heap_usage(heap, &usage)) continue;
    if (listed++ != 0) out.chr(',');
    JsonObject entry(out);
    entry.field("serial", usage.serial).field("live_blocks", usage.live_blocks);
    entry.field("live_bytes", usage.live_bytes).field("page_bytes", usage.page_bytes);
    entry.field("large_blocks", usage.large_blocks).field("large_bytes", usage.large_bytes);
    entry.field("threads", usage.parts);
    entry.close();
    output.piece_done();
  }
  out.chr(']');
  root.key("memory_limit");
  JsonObject limit(out);
  limit.field("bytes", s.memory_limit_bytes).path("source", s.memory_limit_bytes != 0 ? limit_source(s) : "");
  limit.text("action", s.memory_limit_fail != 0 ? "fail" : "soft").field("reached", s.memory_limit_reached);
  limit.field("failures", s.memory_limit_failures).field("released_bytes", s.memory_limit_released_bytes);
  limit.close();
  root.key("huge_pages");
  JsonObject huge(out);
  const int64_t huge_bytes = os::anon_huge_page_bytes();
  huge.text("thp", thp_mode_name()).text("kernel", os::thp_kernel_mode());
  huge.field("anon_huge_page_bytes", uint64_t(huge_bytes < 0 ? 0 : huge_bytes));
  huge.close();
  root.key("os_calls");
  JsonObject calls(out);
  calls.field("mmap", s.os_mmap).field("munmap", s.os_munmap).field("madvise", s.os_madvise);
  calls.field("mremap", s.os_mremap).field("mprotect", s.os_mprotect);
  calls.close();
  root.close();
  out.chr('\n');
}

void stats_print_xml(const tray_stats& s, StatsSink sink) {
  DumpOutput output(sink);
  TextBuffer& out = output.text();
  uint64_t free_blocks = 0, free_bytes = 0;
  out.str("<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n");
  uint64_t previous = 0;
  for (unsigned i = 0; i < s.class_count; ++i) {
    const tray_class_stats& c = s.classes[i];
    const uint64_t capacity = class_capacity(c);
    const uint64_t unused = capacity > c.live_blocks ? capacity - c.live_blocks : 0;
    if (unused != 0) {
      out.str("  <size from=\"").dec(previous + 1).str("\" to=\"").dec(c.block_bytes);
      out.str("\" total=\"").dec(unused * c.block_bytes).str("\" count=\"").dec(unused).str("\"/>\n");
      free_blocks += unused;
      free_bytes += unused * c.block_bytes;
    }
    previous = c.block_bytes;
    output.piece_done();
  }
  out.str("</sizes>\n");
  auto totals = [&]() {
    out.str("<total type=\"fast\" count=\"0\" size=\"0\"/>\n<total type=\"rest\" count=\"");
    out.dec(free_blocks).str("\" size=\"").dec(free_bytes).str("\"/>\n");
  };
  auto system = [&]() {
    out.str("<system type=\"current\" size=\"").dec(s.committed_bytes).str("\"/>\n");
    out.str("<system type=\"max\" size=\"").dec(s.committed_bytes).str("\"/>\n");
    out.str("<aspace type=\"total\" size=\"").dec(s.mapped_bytes).str("\"/>\n");
    out.str("<aspace type=\"mprotect\" size=\"").dec(s.mapped_bytes).str("\"/>\n");
  };
  totals();
  system();
  out.str("</heap>\n");
  output.piece_done();
  totals();
  out.str("<total type=\"mmap\" count=\"").dec(s.large.live_blocks).str("\" size=\"");
  out.dec(s.large.live_bytes).str("\"/>\n");
  system();
  out.str("</malloc>\n");
}

void stats_print_glibc_totals(const tray_stats& s, StatsSink sink) {
  DumpOutput output(sink);
  TextBuffer& out = output.text();
  uint64_t small_live = 0;
  for (unsigned i = 0; i < s.class_count; ++i) small_live += class_live_bytes(s.classes[i]);
  const auto line = [&](const char* label, uint64_t value) {
    out.str(label);
    const size_t start = out.length();
    out.dec(value).align_right(start, 10).chr('\n');
  };
  out.str("Total (incl. mmap):\n");
  line("system bytes     = ", s.committed_bytes);
  line("in use bytes     = ", small_live + s.large.live_bytes);
  line("max mmap regions = ", s.large.live_blocks);
  line("max mmap bytes   = ", s.large.peak_bytes);
}

}  // namespace tray
