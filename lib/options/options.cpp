#include "options/options.hpp"

#include <errno.h>
#include <unistd.h>

#include <atomic>

#include "core/core.hpp"
#include "platform/platform.hpp"

#ifndef TRAY_DEFAULT_OPTIONS
#define TRAY_DEFAULT_OPTIONS ""
#endif

namespace tray {

namespace {

enum class Kind { kFlag, kChoice, kSignal, kPath, kBytes, kCount, kSeconds };

struct OptionSpec {
  const char* name;
  Kind kind;
  int64_t default_value;
  const char* choices[3];  // kChoice: the value is the index of the word
  bool fixed_at_start;
  // kBytes and kCount: values below min or above max (0: no bound but the kind's) are bad.
  int64_t min = 0;
  int64_t max = 0;
};

// thp's default: huge pages cost resident memory and bought no speed in the measurements of
// docs/GUIDE.md; never also keeps a kernel in THP "always" mode off our regions.
constexpr int64_t kThpDefault = kThpNever;

constexpr OptionSpec kSpecs[] = {
    {"stats", Kind::kFlag, 0, {}, false},
    {"stats_file", Kind::kPath, 0, {}, false},
    {"stats_format", Kind::kChoice, kStatsText, {"text", "json", "prometheus"}, false},
    {"stats_signal", Kind::kSignal, 0, {}, false},
    {"debug", Kind::kFlag, 0, {}, true},
    {"debug_abort", Kind::kFlag, 1, {}, false},
    {"prof", Kind::kFlag, 0, {}, false},
    {"prof_sample", Kind::kBytes, int64_t{512} << 10, {}, false, 1},
    {"guard_sample", Kind::kBytes, 0, {}, false},
    {"prof_final", Kind::kFlag, 0, {}, false},
    {"prof_signal", Kind::kSignal, 0, {}, false},
    {"prof_file", Kind::kPath, 0, {}, false},
    {"prof_peak", Kind::kFlag, 0, {}, false},
    {"prof_leaks", Kind::kFlag, 0, {}, false},
    {"guard_slots", Kind::kCount, 64, {}, false, 1, kGuardSlotsMax},
    {"purge_thread", Kind::kFlag, 1, {}, false},
    {"stats_interval", Kind::kSeconds, 0, {}, false},
    {"sparse_delay_ms", Kind::kCount, 0, {}, false},
    {"only_exe", Kind::kPath, 0, {}, true},
    {"memory_limit", Kind::kBytes, kMemoryLimitAuto, {}, false},
    {"memory_limit_action", Kind::kChoice, kLimitSoft, {"soft", "fail"}, false},
    {"thp", Kind::kChoice, kThpDefault, {"never", "madvise", "system"}, false},
};
static_assert(sizeof kSpecs / sizeof kSpecs[0] == unsigned(Option::kCount));

constexpr size_t kPathBytes = 512;
constexpr int64_t kMaxSeconds = 1'000'000;

std::atomic<int64_t> g_values[unsigned(Option::kCount)];
std::atomic<bool> g_fixed[unsigned(Option::kCount)];  // read by the allocator: no more changes
constexpr unsigned kPathOptions[] = {unsigned(Option::kStatsFile), unsigned(Option::kProfFile),
                                     unsigned(Option::kOnlyExe)};
constexpr unsigned kPathOptionCount = sizeof kPathOptions / sizeof kPathOptions[0];
char g_paths[kPathOptionCount][kPathBytes];

static_assert([] {
  unsigned paths = 0;
  for (const OptionSpec& spec : kSpecs) paths += spec.kind == Kind::kPath ? 1 : 0;
  return paths;
}() == kPathOptionCount, "every path option needs its storage");

// Where the text of path option `index` lives.
char* path_storage(unsigned index) {
  for (unsigned i = 0; i < kPathOptionCount; ++i)
    if (kPathOptions[i] == index) return g_paths[i];
  return nullptr;
}
std::atomic<int> g_state{0};  // 0: not read, 1: being read, 2: ready

void warn(const char* source, const char* what, const char* text, size_t length) {
  char storage[256];
  TextBuffer out(storage, sizeof storage);
  out.str("traymalloc: ").str(source).str(": ").str(what).str(" '");
  for (size_t i = 0; i < length; ++i) out.chr(text[i]);
  out.str("' ignored\n");
  os::write_text(STDERR_FILENO, out);
}

// What a value of `spec` may be, for the warnings.
void accepted_values(TextBuffer& out, const OptionSpec& spec) {
  switch (spec.kind) {
    case Kind::kFlag: out.str("1, 0, true or false"); return;
    case Kind::kChoice:
      for (unsigned i = 0; i < 3 && spec.choices[i] != nullptr; ++i)
        out.str(i == 0 ? "" : ", ").str(spec.choices[i]);
      return;
    case Kind::kSignal: out.str("a signal name (SIGUSR1, USR1, RTMIN+5) or number, 0 or none"); return;
    case Kind::kPath: out.str("a path shorter than ").dec(kPathBytes).str(" bytes"); return;
    case Kind::kBytes: out.str("bytes, with an optional k, m or g suffix, up to 2^48"); break;
    case Kind::kCount: out.str("a whole number"); break;
    case Kind::kSeconds: out.str("whole seconds, up to ").dec(uint64_t(kMaxSeconds)); return;
  }
  if (spec.max != 0) out.str(", ").dec(uint64_t(spec.min)).str("..").dec(uint64_t(spec.max));
  else if (spec.min > 0) out.str(", at least ").dec(uint64_t(spec.min));
}

// "bad value 'V' for NAME ignored (accepted: ...)".
void warn_value(const char* source, const OptionSpec& spec, const char* value, size_t length) {
  char storage[384];
  TextBuffer out(storage, sizeof storage);
  out.str("traymalloc: ").str(source).str(": ");
  out.str("bad value '");
  for (size_t i = 0; i < length && i < 64; ++i) out.chr(value[i]);
  out.str("' for ").str(spec.name).str(" ignored (accepted: ");
  accepted_values(out, spec);
  out.str(")\n");
  os::write_text(STDERR_FILENO, out);
}

// text[0, length) without the blanks around it: "stats=1, debug=1" is two items.
void trim(const char*& text, size_t& length) {
  while (length > 0 && (*text == ' ' || *text == '\t')) ++text, --length;
  while (length > 0 && (text[length - 1] == ' ' || text[length - 1] == '\t')) --length;
}

bool equal(const char* text, size_t length, const char* word) {
  size_t i = 0;
  for (; i < length; ++i)
    if (word[i] == '\0' || word[i] != text[i]) return false;
  return word[i] == '\0';
}

// A count of bytes with an optional binary suffix (k, m, g: 512k is 524288); -1 if malformed
// or beyond 2^48.
int64_t parse_bytes(const char* text, size_t length) {
  if (length == 0) return -1;
  unsigned shift = 0;
  switch (text[length - 1] | 0x20) {
    case 'k': shift = 10; break;
    case 'm': shift = 20; break;
    case 'g': shift = 30; break;
    default: break;
  }
  if (shift != 0 && --length == 0) return -1;
  constexpr int64_t kLimit = int64_t{1} << 48;
  int64_t value = 0;
  for (size_t i = 0; i < length; ++i) {
    if (text[i] < '0' || text[i] > '9') return -1;
    value = value * 10 + (text[i] - '0');
    if (value > kLimit) return -1;
  }
  value <<= shift;
  return value <= kLimit ? value : -1;
}

// The value for `spec` spelled by text[0, length), or -1 if it is not one.
int64_t parse_value(const OptionSpec& spec, const char* text, size_t length) {
  switch (spec.kind) {
    case Kind::kFlag:
      if (equal(text, length, "1") || equal(text, length, "true")) return 1;
      if (equal(text, length, "0") || equal(text, length, "false")) return 0;
      return -1;
    case Kind::kChoice:
      for (int64_t i = 0; i < 3 && spec.choices[i] != nullptr; ++i)
        if (equal(text, length, spec.choices[i])) return i;
      return -1;
    case Kind::kSignal:
      if (equal(text, length, "0") || equal(text, length, "none")) return 0;
      return os::signal_number(text, length) != 0 ? os::signal_number(text, length) : -1;
    case Kind::kPath:
      return length < kPathBytes ? int64_t(length) : -1;
    case Kind::kBytes:
      return parse_bytes(text, length);
    case Kind::kCount:  // a plain decimal number: no suffix
      return length > 0 && text[length - 1] >= '0' && text[length - 1] <= '9' ? parse_bytes(text, length) : -1;
    case Kind::kSeconds: {
      int64_t seconds = 0;
      for (size_t i = 0; i < length; ++i) {
        if (text[i] < '0' || text[i] > '9') return -1;
        seconds = seconds * 10 + (text[i] - '0');
        if (seconds > kMaxSeconds) return -1;
      }
      return length > 0 ? seconds : -1;
    }
  }
  return -1;
}

// Applies "value" to option `index`: 0, EINVAL or EBUSY.
int assign(unsigned index, const char* value, size_t length, const char* source) {
  const OptionSpec& spec = kSpecs[index];
  int64_t parsed = parse_value(spec, value, length);
  if (parsed < spec.min || (spec.max != 0 && parsed > spec.max)) parsed = -1;
  if (parsed < 0) {
    warn_value(source, spec, value, length);
    return EINVAL;
  }
  if (spec.fixed_at_start && g_fixed[index].load(std::memory_order_acquire)) return EBUSY;
  if (spec.kind == Kind::kPath) {
    char* path = path_storage(index);
    for (size_t i = 0; i < length; ++i) path[i] = value[i];
    path[length] = '\0';
  }
  g_values[index].store(parsed, std::memory_order_release);
  return 0;
}

int find(const char* name, size_t length) {
  for (unsigned i = 0; i < unsigned(Option::kCount); ++i)
    if (equal(name, length, kSpecs[i].name)) return int(i);
  return -1;
}

void apply_item(const char* item, size_t length, const char* source) {
  trim(item, length);
  if (length == 0) return;
  size_t eq = 0;
  while (eq < length && item[eq] != '=') ++eq;
  if (eq == length) return warn(source, "missing '=' in", item, length);
  size_t name_length = eq;
  trim(item, name_length);
  const char* value = item + eq + 1;
  size_t value_length = length - eq - 1;
  trim(value, value_length);
  const int index = find(item, name_length);
  if (index < 0) return warn(source, "unknown option", item, name_length);
  assign(unsigned(index), value, value_length, source);
}

void apply_list(const char* text, const char* source) {
  while (text != nullptr && *text != '\0') {
    size_t length = 0;
    while (text[length] != '\0' && text[length] != ',') ++length;
    if (length > 0) apply_item(text, length, source);
    text += length;
    if (*text == ',') ++text;
  }
}

// only_exe's pattern against the executable's file name: equal, or, for a pattern ending in
// '*', starting with what comes before it (python3* for python3.11).
bool executable_matches(const char* pattern) {
  char path[512];
  const ssize_t length = os::executable_path(path, sizeof path);
  if (length <= 0) return false;
  size_t start = size_t(length);
  while (start > 0 && path[start - 1] != '/') --start;
  const char* name = path + start;
  const size_t name_length = size_t(length) - start;
  const size_t pattern_length = __builtin_strlen(pattern);
  if (pattern_length > 0 && pattern[pattern_length - 1] == '*')
    return name_length >= pattern_length - 1 && __builtin_memcmp(name, pattern, pattern_length - 1) == 0;
  return equal(name, name_length, pattern);
}

// The options that make a process write reports. A process that only_exe leaves out (a shell,
// a wrapper such as pyenv's python3 or timeout, that passes TRAY_OPTIONS on) writes none.
constexpr Option kReportOptions[] = {Option::kStats,     Option::kStatsSignal, Option::kStatsInterval,
                                     Option::kProf,      Option::kProfFinal,   Option::kProfSignal,
                                     Option::kProfPeak,  Option::kProfLeaks};

void read_options() {
  for (unsigned i = 0; i < unsigned(Option::kCount); ++i)
    g_values[i].store(kSpecs[i].default_value, std::memory_order_relaxed);
  apply_list(TRAY_DEFAULT_OPTIONS, "TRAY_DEFAULT_OPTIONS");
  apply_list(os::env("TRAY_OPTIONS"), "TRAY_OPTIONS");
  const unsigned only = unsigned(Option::kOnlyExe);
  if (g_values[only].load(std::memory_order_relaxed) > 0 && !executable_matches(path_storage(only))) {
    for (const Option report : kReportOptions)
      g_values[unsigned(report)].store(kSpecs[unsigned(report)].default_value, std::memory_order_relaxed);
  }
  g_fixed[only].store(true, std::memory_order_release);  // decided: tray_option_set gets EBUSY
}

void ensure_read() {
  if (TRAY_LIKELY(g_state.load(std::memory_order_acquire) == 2)) return;
  int expected = 0;
  if (g_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    read_options();
    g_state.store(2, std::memory_order_release);
  } else {
    while (g_state.load(std::memory_order_acquire) != 2) {
    }
  }
}

}  // namespace

int64_t option(Option which) {
  ensure_read();
  return g_values[unsigned(which)].load(std::memory_order_acquire);
}

const char* option_path(Option which) {
  return option(which) > 0 ? path_storage(unsigned(which)) : "";
}

constinit std::atomic<int> g_debug_latched{-1};

bool debug_mode_decide() {
  ensure_read();  // first: the options read from TRAY_OPTIONS must not find debug fixed
  g_fixed[unsigned(Option::kDebug)].store(true, std::memory_order_release);
  const int value = option(Option::kDebug) != 0 ? 1 : 0;
  g_debug_latched.store(value, std::memory_order_relaxed);
  return value != 0;
}

int option_set(const char* name, const char* value) {
  ensure_read();
  if (name == nullptr || value == nullptr) return EINVAL;
  const int index = find(name, __builtin_strlen(name));
  if (index < 0) {
    warn("tray_option_set", "unknown option", name, __builtin_strlen(name));
    return EINVAL;
  }
  return assign(unsigned(index), value, __builtin_strlen(value), "tray_option_set");
}

bool expand_path(const char* pattern, uint64_t number, char* out, size_t capacity) {
  TextBuffer path(out, capacity - 1);
  for (const char* p = pattern; *p != '\0'; ++p) {
    if (p[0] == '%' && (p[1] == 'p' || p[1] == 'n')) {
      path.dec(p[1] == 'p' ? uint64_t(os::process_id()) : number);
      ++p;
    } else if (p[0] == '%' && p[1] == '%') {
      path.chr('%');
      ++p;
    } else {
      path.chr(*p);
    }
  }
  if (path.length() == capacity - 1) return false;
  out[path.length()] = '\0';
  return true;
}

void install_signal_option(Option which, int* installed, void (*handler)(int)) {
  const int signo = int(option(which));
  if (signo == *installed || signo == 0) return;
  if (os::set_signal_handler(signo, handler)) {
    *installed = signo;
  } else {
    char storage[128];
    TextBuffer warning(storage, sizeof storage);
    warning.str("traymalloc: cannot install the handler of signal ").dec(uint64_t(signo)).chr('\n');
    os::write_text(STDERR_FILENO, warning);
  }
}

}  // namespace tray
