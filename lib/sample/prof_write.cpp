// What the heap profile shows: profiles in gperftools' heap profile text format, which
// google-pprof and jeprof read (with the process maps, so they can symbolise the addresses
// themselves), and the leak report at exit. Profiles are written from fixed buffers with
// write(2) and read the counts without a lock: they may run in a signal handler.
#include <errno.h>
#include <unistd.h>

#include <algorithm>

#include "core/core.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "sample/prof.hpp"
#include "traymalloc.h"

namespace tray {

namespace {

int g_report_fd = STDERR_FILENO;  // a copy of stderr taken at start (see report.cpp's)
int g_installed_signal = 0;
std::atomic<uint64_t> g_dump_number{0};

// Lines of the profile gathered in a buffer on the stack and written when it fills.
class Output {
 public:
  explicit Output(int fd) : fd_(fd), text_(storage_, sizeof storage_) {}
  ~Output() { flush(); }
  // The buffer, flushed first unless `room` bytes are left (a profile's line by default).
  TextBuffer& text(size_t room = kLineBytesMax) {
    if (text_.length() + std::min(room, sizeof storage_) > sizeof storage_) flush();
    return text_;
  }
  void flush() {
    os::write_text(fd_, text_);
    text_.clear();
  }

 private:
  // A line holds at most kProfMaxFrames addresses of 19 characters, and five numbers.
  static constexpr size_t kLineBytesMax = kProfMaxFrames * 20 + 128;
  int fd_;
  char storage_[16384];
  TextBuffer text_;
};

struct Counts {
  uint64_t live_count, live_bytes, total_count, total_bytes;
};

Counts counts_of(const ProfStack& stack, bool peak) {
  auto load = [](const std::atomic<uint64_t>& value) { return value.load(std::memory_order_relaxed); };
  if (peak) {
    const uint64_t count = load(stack.peak_count), bytes = load(stack.peak_bytes);
    return {count, bytes, count, bytes};
  }
  return {load(stack.live_count), load(stack.live_bytes), load(stack.total_count), load(stack.total_bytes)};
}

void write_counts(TextBuffer& out, const Counts& counts) {
  out.dec(counts.live_count).str(": ").dec(counts.live_bytes).str(" [").dec(counts.total_count);
  out.str(": ").dec(counts.total_bytes).chr(']');
}

// The raw sampled counts and bytes, as gperftools writes them: "heap_v2/<rate>" tells the
// reader to scale each stack by 1 / (1 - e^(-mean size / rate)) itself. The peak profile
// has no allocation totals of its own: it repeats the live counts of that moment.
void write_profile(int fd, bool peak) {
  const size_t stack_count = prof_stack_count();
  const ProfStack* stacks = prof_stacks();
  Counts total{};
  for (size_t i = 0; i < stack_count; ++i) {
    const Counts counts = counts_of(stacks[i], peak);
    total.live_count += counts.live_count;
    total.live_bytes += counts.live_bytes;
    total.total_count += counts.total_count;
    total.total_bytes += counts.total_bytes;
  }
  Output output(fd);
  write_counts(output.text().str("heap profile: "), total);
  output.text().str(" @ heap_v2/").dec(prof_rate()).chr('\n');
  for (size_t i = 0; i < stack_count; ++i) {
    const ProfStack& stack = stacks[i];
    const Counts counts = counts_of(stack, peak);
    if (counts.total_count == 0) continue;
    TextBuffer& line = output.text();
    write_counts(line, counts);
    line.str(" @");
    for (int f = 0; f < stack.depth; ++f) line.chr(' ').ptr(stack.frames[f]);
    line.chr('\n');
  }
  output.text().str("\nMAPPED_LIBRARIES:\n");
  output.flush();
  os::copy_file_to_fd("/proc/self/maps", fd);
}

// Writes a profile to `path`, or where prof_file says (stderr if unset) when path is null:
// 0, or the errno of the failed open.
int dump(const char* path, bool peak) {
  os::CancelDisabled no_cancel;  // the file must be closed
  char expanded[640];
  if (path == nullptr) {
    const char* pattern = option_path(Option::kProfFile);
    if (pattern[0] == '\0') {
      write_profile(g_report_fd, peak);
      return 0;
    }
    const uint64_t number = g_dump_number.fetch_add(1, std::memory_order_relaxed);
    if (!expand_path(pattern, number, expanded, sizeof expanded - sizeof ".peak")) return ENAMETOOLONG;
    if (peak) __builtin_memcpy(expanded + __builtin_strlen(expanded), ".peak", sizeof ".peak");
    path = expanded;
  }
  const int fd = os::open_truncate(path);
  if (fd < 0) return -fd;
  write_profile(fd, peak);
  os::close_fd(fd);
  return 0;
}

void dump_on_signal(int) {
  prof_take_in_freed(false);
  dump(nullptr, false);
}

// --- the leak report ---------------------------------------------------------------------

// Returns whether the frame had a name. Frames the symbol tables cannot name (their file was
// stripped) show the file and the address in it, which addr2line takes.
bool write_frame(Output& output, os::SymbolTables& symbols, int index, const void* address) {
  const os::CodeSymbol symbol = symbols.symbol_of_return_address(address);
  // Mangled C++ names run to kilobytes: the line is written whole or, past the buffer, cut.
  auto length = [](const char* text) { return text != nullptr ? __builtin_strlen(text) : 0; };
  TextBuffer& line = output.text(96 + length(symbol.name) + length(symbol.file));
  line.str("traymalloc:   #").dec(uint64_t(index)).chr(' ').ptr(address);
  if (symbol.name != nullptr) line.chr(' ').str(symbol.name).str("+0x").hex(symbol.offset);
  if (symbol.name != nullptr && symbol.file != nullptr) line.str(" (").str(symbol.file).chr(')');
  if (symbol.name == nullptr && symbol.file != nullptr)
    line.str(" (").str(symbol.file).str("+0x").hex(symbol.file_address).chr(')');
  line.chr('\n');
  return symbol.name != nullptr;
}

void write_naming_hint(Output& output) {
  output.text().str("traymalloc: unnamed frames lie in files without a symbol table (stripped); ")
      .str("addr2line -f -e FILE OFFSET names them where the file's debug symbols are installed\n");
}

// The stacks with sampled blocks still live, biggest estimate first, each with its estimated
// bytes and count and its frames named from the symbol tables of their files.
void report_leaks() {
  const size_t stack_count = prof_stack_count();
  const ProfStack* stacks = prof_stacks();
  auto live_estimate = [&](uint32_t i) { return stacks[i].live_estimate.load(std::memory_order_relaxed); };
  const size_t order_bytes = stack_count * sizeof(uint32_t);
  auto* order = order_bytes != 0 ? static_cast<uint32_t*>(os::map(order_bytes)) : nullptr;
  size_t leaking = 0;
  uint64_t bytes = 0, blocks = 0, samples = 0;
  for (size_t i = 0; i < stack_count && order != nullptr; ++i) {
    if (stacks[i].live_count.load(std::memory_order_relaxed) == 0) continue;
    order[leaking++] = uint32_t(i);
    bytes += live_estimate(uint32_t(i));
    blocks += stacks[i].live_weight.load(std::memory_order_relaxed) / kProfWeightOne;
    samples += stacks[i].live_count.load(std::memory_order_relaxed);
  }
  std::sort(order, order + leaking, [&](uint32_t a, uint32_t b) { return live_estimate(a) > live_estimate(b); });
  Output output(g_report_fd);
  output.text().str("traymalloc: leak report: ").dec(leaking).str(" stacks hold about ").human(bytes);
  output.text().str(" in ").dec(blocks).str(" blocks still live at exit (from ").dec(samples);
  output.text().str(" samples, one per ").human(prof_rate()).str(" allocated on average");
  if (prof_dropped() != 0) output.text().str("; ").dec(prof_dropped()).str(" samples dropped, tables full");
  output.text().str(")\n");
  os::SymbolTables symbols;
  bool unnamed = false;
  for (size_t rank = 0; rank < leaking; ++rank) {
    const ProfStack& stack = stacks[order[rank]];
    TextBuffer& line = output.text();
    line.str("traymalloc: leak ").dec(rank + 1).str(" of ").dec(leaking).str(": about ");
    line.human(stack.live_estimate.load(std::memory_order_relaxed)).str(" in ");
    line.dec(stack.live_weight.load(std::memory_order_relaxed) / kProfWeightOne).str(" blocks (");
    line.dec(stack.live_count.load(std::memory_order_relaxed)).str(" sampled), allocated at:\n");
    for (int f = 0; f < stack.depth; ++f) unnamed |= !write_frame(output, symbols, f, stack.frames[f]);
  }
  if (unnamed) write_naming_hint(output);
  output.flush();
  if (order != nullptr) os::unmap(order, order_bytes);
}

__attribute__((constructor)) void prof_at_start() {
  if (option(Option::kProf) == 0) return;
  if (option(Option::kProfLeaks) != 0 || option(Option::kProfFinal) != 0 || option(Option::kProfPeak) != 0) {
    const int fd = os::duplicate_fd(STDERR_FILENO);
    if (fd >= 0) g_report_fd = fd;
  }
  prof_options_changed();
}

__attribute__((destructor)) void prof_at_exit() {
  if (option(Option::kProf) == 0) return;
  prof_take_in_freed(true);
  // A process that sampled nothing writes no profile at exit: the shells and wrappers (timeout,
  // pyenv's python3) that pass TRAY_OPTIONS on to the program meant would each leave an empty
  // file beside its profile.
  const bool sampled = prof_stack_count() != 0;
  if (sampled && option(Option::kProfFinal) != 0) dump(nullptr, false);
  if (sampled && option(Option::kProfPeak) != 0) dump(nullptr, true);
  if (option(Option::kProfLeaks) != 0) report_leaks();
}

}  // namespace

void prof_options_changed() {
  if (option(Option::kProf) != 0) os::prepare_backtrace();
  install_signal_option(Option::kProfSignal, &g_installed_signal, dump_on_signal);
}

}  // namespace tray

extern "C" {

TRAY_EXPORT int tray_prof_dump(const char* path) {
  tray::prof_take_in_freed(true);
  return tray::dump(path, false);
}
TRAY_EXPORT int tray_prof_dump_peak(const char* path) { return tray::dump(path, true); }

}  // extern "C"
