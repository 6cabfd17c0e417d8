// The statistics snapshot in Prometheus's text exposition format, version 0.0.4: per family a
// HELP and a TYPE line, then all its samples, no family in two places; counters end in _total.
// node_exporter's textfile collector reads it from stats_file (stats_format=prometheus), and it
// refuses samples with timestamps, so there are none. Written through DumpOutput like the
// other dumps: nothing allocates, and the stack holds a fixed amount.
#include <sys/types.h>

#include "core/core.hpp"
#include "platform/platform.hpp"
#include "report/dump_output.hpp"
#include "report/stats_print.hpp"

namespace tray {

namespace {

enum class Type { kCounter, kGauge };

// pid="...",exe="..." with the executable's file name escaped: a component of a path is at
// most NAME_MAX (255) bytes, each escaped to at most two.
constexpr size_t kCommonLabelBytes = 600;
constexpr size_t kExePathBytes = 1024;
// A sample line is its family's name (under 50), the common labels, its own labels (under 40)
// and a value (20 digits): one piece of DumpOutput holds it.
static_assert(kCommonLabelBytes + 160 <= DumpOutput::kPieceBytes);

void common_labels(TextBuffer& out, int pid) {
  out.str("pid=\"").dec(uint64_t(pid)).str("\",exe=\"");
  char path[kExePathBytes];
  ssize_t length = os::executable_path(path, sizeof path);
  // A longer path was cut short: its last component would be a piece of a directory's name.
  if (length <= 0 || size_t(length) == sizeof path) {
    out.str("unknown\"");
    return;
  }
  // An executable replaced while it runs (a new version deployed) reads "PATH (deleted)": the
  // series keep the program's name.
  constexpr char kDeleted[] = " (deleted)";
  constexpr ssize_t kDeletedLength = sizeof kDeleted - 1;
  if (length > kDeletedLength &&
      __builtin_memcmp(path + length - kDeletedLength, kDeleted, kDeletedLength) == 0)
    length -= kDeletedLength;
  ssize_t start = length;
  while (start > 0 && path[start - 1] != '/') --start;
  prometheus_label_value(out, path + start, size_t(length - start));
  out.chr('"');
}

// Writes families one at a time: family() gives the HELP and TYPE lines, then each sample()
// adds its own labels (",key=\"value\"") to the buffer it returns and ends with value().
class Exposition {
 public:
  Exposition(DumpOutput& output, const char* labels) : output_(output), labels_(labels) {}
  void family(const char* name, Type type, const char* help) {
    name_ = name;
    TextBuffer& out = output_.text();
    out.str("# HELP ").str(name).chr(' ').str(help).chr('\n');
    out.str("# TYPE ").str(name).str(type == Type::kCounter ? " counter\n" : " gauge\n");
    output_.piece_done();
  }
  TextBuffer& sample() { return output_.text().str(name_).chr('{').str(labels_); }
  void value(uint64_t value) {
    output_.text().str("} ").dec(value).chr('\n');
    output_.piece_done();
  }

 private:
  DumpOutput& output_;
  const char* labels_;
  const char* name_ = "";
};

// A family of one sample with no labels of its own.
struct Family {
  const char* name;
  Type type;
  const char* help;  // no backslash or line feed: they would need escapes
  uint64_t (*value)(const tray_stats&);
};

// A family of one sample per size class in use, labelled with its block size and index.
struct ClassFamily {
  const char* name;
  Type type;
  const char* help;
  uint64_t (*value)(const tray_class_stats&);
};

using Stats = const tray_stats&;
using Class = const tray_class_stats&;

constexpr Family kMemoryFamilies[] = {
    {"traymalloc_mapped_bytes", Type::kGauge,
     "Address space the allocator holds from the OS, its metadata included.",
     [](Stats s) -> uint64_t { return s.mapped_bytes; }},
    {"traymalloc_committed_bytes", Type::kGauge,
     "Memory the allocator holds from the OS and has not given back: what a memory limit counts.",
     [](Stats s) -> uint64_t { return s.committed_bytes; }},
    {"traymalloc_resident_bytes", Type::kGauge,
     "Resident size of the whole process (/proc/self/statm), not only the allocator's memory.",
     [](Stats s) -> uint64_t { return s.resident_bytes; }},
    {"traymalloc_metadata_bytes", Type::kGauge,
     "Of the committed bytes, those of the allocator's own tables: heaps, segment headers.",
     [](Stats s) -> uint64_t { return s.metadata_bytes; }},
    {"traymalloc_segments", Type::kGauge, "Segments (4 MiB each) mapped for small blocks.",
     [](Stats s) -> uint64_t { return s.segments; }},
    {"traymalloc_released_bytes_total", Type::kCounter,
     "Bytes given back to the OS (madvise, munmap) since the process started.",
     [](Stats s) -> uint64_t { return s.released_bytes; }},
};

constexpr Family kLimitFamilies[] = {
    {"traymalloc_memory_limit_reached_total", Type::kCounter,
     "Allocations that found the memory limit passed.",
     [](Stats s) -> uint64_t { return s.memory_limit_reached; }},
    {"traymalloc_memory_limit_failures_total", Type::kCounter,
     "Allocations that failed at the memory limit (memory_limit_action=fail).",
     [](Stats s) -> uint64_t { return s.memory_limit_failures; }},
    {"traymalloc_memory_limit_released_bytes_total", Type::kCounter,
     "Bytes given back to the OS because the memory limit was reached.",
     [](Stats s) -> uint64_t { return s.memory_limit_released_bytes; }},
};

constexpr ClassFamily kClassFamilies[] = {
    {"traymalloc_class_live_bytes", Type::kGauge,
     "Bytes of the live blocks of a size class: live blocks times the block size.",
     class_live_bytes},
    {"traymalloc_class_live_blocks", Type::kGauge,
     "Blocks of a size class allocated and not freed.",
     [](Class c) -> uint64_t { return c.live_blocks; }},
    {"traymalloc_class_reserved_bytes", Type::kGauge,
     "Bytes of the pages a size class holds, its live and its free blocks.",
     class_reserved_bytes},
    {"traymalloc_class_allocations_total", Type::kCounter,
     "Allocations of a size class since the process started.",
     [](Class c) -> uint64_t { return c.allocations; }},
    {"traymalloc_class_frees_total", Type::kCounter,
     "Frees of a size class since the process started.",
     [](Class c) -> uint64_t { return c.frees; }},
};

constexpr Family kLargeAndThreadFamilies[] = {
    {"traymalloc_large_live_blocks", Type::kGauge,
     "Large blocks (above 128 KiB) allocated and not freed.",
     [](Stats s) -> uint64_t { return s.large.live_blocks; }},
    {"traymalloc_large_live_bytes", Type::kGauge, "Bytes of the live large blocks.",
     [](Stats s) -> uint64_t { return s.large.live_bytes; }},
    {"traymalloc_large_peak_bytes", Type::kGauge, "The most bytes of large blocks live at once.",
     [](Stats s) -> uint64_t { return s.large.peak_bytes; }},
    {"traymalloc_large_mapped_bytes", Type::kGauge,
     "Address space of live and cached large blocks, whole chunks, untouched parts included.",
     [](Stats s) -> uint64_t { return s.large.mapped_bytes; }},
    {"traymalloc_large_cached_bytes", Type::kGauge,
     "Bytes still in memory of freed large blocks kept for reuse.",
     [](Stats s) -> uint64_t { return s.large.cached_bytes; }},
    {"traymalloc_large_allocations_total", Type::kCounter,
     "Allocations of large blocks since the process started.",
     [](Stats s) -> uint64_t { return s.large.allocations; }},
    {"traymalloc_large_frees_total", Type::kCounter,
     "Frees of large blocks since the process started.",
     [](Stats s) -> uint64_t { return s.large.frees; }},
    {"traymalloc_threads", Type::kGauge, "Threads that own a heap now.",
     [](Stats s) -> uint64_t { return s.threads_alive; }},
    {"traymalloc_threads_exited_total", Type::kCounter, "Threads that owned a heap and have ended.",
     [](Stats s) -> uint64_t { return s.threads_exited; }},
    {"traymalloc_heaps", Type::kGauge, "Heaps created: they outlive their threads and are reused.",
     [](Stats s) -> uint64_t { return s.heaps_created; }},
    {"traymalloc_remote_frees_total", Type::kCounter,
     "Frees of a block that another thread's heap owns.",
     [](Stats s) -> uint64_t { return s.remote_frees; }},
    {"traymalloc_reused_blocks_total", Type::kCounter,
     "Blocks of another thread's heap allocated again by the thread that freed them.",
     [](Stats s) -> uint64_t { return s.reused_blocks; }},

    {"traymalloc_foreign_frees_total", Type::kCounter,
     "Frees of pointers the allocator does not own (left alone).",
     [](Stats s) -> uint64_t { return s.foreign_frees; }},
    {"traymalloc_debug_errors_total", Type::kCounter,
     "Errors debug mode reported and went on from (debug_abort=0).",
     [](Stats s) -> uint64_t { return s.debug_errors; }},
};

constexpr bool named_by_type(const char* name, Type type) {
  size_t length = 0;
  while (name[length] != '\0') ++length;
  constexpr char kSuffix[] = "_total";
  bool total = length > sizeof kSuffix - 1;
  for (size_t i = 0; total && i < sizeof kSuffix - 1; ++i)
    total = name[length - (sizeof kSuffix - 1) + i] == kSuffix[i];
  return total == (type == Type::kCounter);
}

// Counters, and only they, end in _total (the format's convention, which tools rely on).
template <typename T, size_t N>
constexpr bool counters_end_in_total(const T (&families)[N]) {
  for (const T& family : families)
    if (!named_by_type(family.name, family.type)) return false;
  return true;
}
static_assert(counters_end_in_total(kMemoryFamilies) && counters_end_in_total(kLimitFamilies));
static_assert(counters_end_in_total(kClassFamilies));
static_assert(counters_end_in_total(kLargeAndThreadFamilies));

template <size_t N>
void write_families(Exposition& out, const Family (&families)[N], const tray_stats& s) {
  for (const Family& family : families) {
    out.family(family.name, family.type, family.help);
    out.sample();
    out.value(family.value(s));
  }
}

// The length of the well-formed UTF-8 sequence that starts text[0, length), 0 if none starts
// there (Unicode's table 3-7: no overlong forms, no surrogates, nothing past U+10FFFF).
size_t utf8_sequence(const unsigned char* text, size_t length) {
  const unsigned char lead = text[0];
  if (lead < 0x80) return 1;
  size_t bytes;
  unsigned char low = 0x80, high = 0xbf;  // the second byte's range
  if (lead >= 0xc2 && lead <= 0xdf) {
    bytes = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    bytes = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    bytes = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (length < bytes || text[1] < low || text[1] > high) return 0;
  for (size_t i = 2; i < bytes; ++i)
    if (text[i] < 0x80 || text[i] > 0xbf) return 0;
  return bytes;
}

}  // namespace

void prometheus_label_value(TextBuffer& out, const char* text, size_t length) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text);
  for (size_t i = 0; i < length;) {
    const char c = text[i];
    if (c == '\\' || c == '"' || c == '\n') {
      out.chr('\\').chr(c == '\n' ? 'n' : c);
      ++i;
      continue;
    }
    const size_t sequence = utf8_sequence(bytes + i, length - i);
    if (sequence == 0) {
      out.chr('?');
      ++i;
      continue;
    }
    for (size_t k = 0; k < sequence; ++k) out.chr(text[i + k]);
    i += sequence;
  }
}

void stats_print_prometheus(const tray_stats& s, int pid, StatsSink sink) {
  char labels[kCommonLabelBytes];
  TextBuffer label_text(labels, sizeof labels - 1);
  common_labels(label_text, pid);
  labels[label_text.length()] = '\0';
  DumpOutput output(sink);
  Exposition out(output, labels);

  out.family("traymalloc_build_info", Type::kGauge,
             "The traymalloc library's version, as a label; always 1.");
  out.sample().str(",version=\"").dec(TRAY_VERSION_MAJOR).chr('.').dec(TRAY_VERSION_MINOR).chr('.');
  output.text().dec(TRAY_VERSION_PATCH).chr('"');
  out.value(1);

  write_families(out, kMemoryFamilies, s);
  out.family("traymalloc_memory_limit_bytes", Type::kGauge,
             "The limit on committed bytes, 0 for none; source says where it comes from "
             "(memory_limit or the cgroup), action what reaching it does (soft or fail).");
  const char* source = s.memory_limit_bytes == 0           ? "none"
                       : s.memory_limit_from_cgroup != 0 ? "cgroup"
                                                         : "memory_limit";
  out.sample().str(",source=\"").str(source).str("\",action=\"");
  output.text().str(s.memory_limit_fail != 0 ? "fail" : "soft").chr('"');
  out.value(s.memory_limit_bytes);
  write_families(out, kLimitFamilies, s);

  for (const ClassFamily& family : kClassFamilies) {
    out.family(family.name, family.type, family.help);
    for (unsigned i = 0; i < s.class_count; ++i) {
      const tray_class_stats& c = s.classes[i];
      if (!class_used(c)) continue;
      out.sample().str(",size_class=\"").dec(c.block_bytes).str("\",class=\"").dec(i).chr('"');
      out.value(family.value(c));
    }
  }
  write_families(out, kLargeAndThreadFamilies, s);

  // Last, so that the file's last line is always mprotect's count: what a reader that checks
  // for a whole file looks for.
  out.family("traymalloc_os_calls_total", Type::kCounter,
             "System calls that change the address space, by call; a process_madvise that gives "
             "back a list of ranges counts as one madvise.");
  const struct {
    const char* call;
    uint64_t count;
  } calls[] = {{"mmap", s.os_mmap},
               {"munmap", s.os_munmap},
               {"madvise", s.os_madvise},
               {"mremap", s.os_mremap},
               {"mprotect", s.os_mprotect}};
  for (const auto& call : calls) {
    out.sample().str(",call=\"").str(call.call).chr('"');
    out.value(call.count);
  }
}

}  // namespace tray
