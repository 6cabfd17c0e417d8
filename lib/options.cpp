#include "options.hpp"

#include <unistd.h>

#include <atomic>

#include "core/bits.hpp"
#include "core/format.hpp"
#include "platform/os.hpp"

namespace tray {

namespace {

struct OptionSpec {
  const char* name;
  int64_t default_value;
  int64_t min_value;
  int64_t max_value;
};

constexpr OptionSpec kSpecs[] = {
    {"stats", 0, 0, 1},
    {"debug", 0, 0, 1},
};
static_assert(sizeof kSpecs / sizeof kSpecs[0] == unsigned(Option::kCount));

int64_t g_values[unsigned(Option::kCount)];
std::atomic<int> g_state{0};  // 0: not read, 1: being read, 2: ready

void warn(const char* what, const char* text, size_t length) {
  char storage[256];
  TextBuffer out(storage, sizeof storage);
  out.str("traymalloc: TRAY_OPTIONS: ").str(what).str(" '");
  for (size_t i = 0; i < length; ++i) out.chr(text[i]);
  out.str("' ignored\n");
  out.write_to(STDERR_FILENO);
}

bool names_equal(const char* key, size_t key_length, const char* name) {
  size_t i = 0;
  for (; i < key_length; ++i)
    if (name[i] == '\0' || name[i] != key[i]) return false;
  return name[i] == '\0';
}

bool parse_integer(const char* text, size_t length, int64_t* out) {
  if (length == 0 || length > 18) return false;
  int64_t value = 0;
  for (size_t i = 0; i < length; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    value = value * 10 + (text[i] - '0');
  }
  *out = value;
  return true;
}

void apply(const char* item, size_t length) {
  size_t eq = 0;
  while (eq < length && item[eq] != '=') ++eq;
  if (eq == length) return warn("missing '=' in", item, length);
  for (unsigned i = 0; i < unsigned(Option::kCount); ++i) {
    if (!names_equal(item, eq, kSpecs[i].name)) continue;
    int64_t value;
    if (!parse_integer(item + eq + 1, length - eq - 1, &value) ||
        value < kSpecs[i].min_value || value > kSpecs[i].max_value)
      return warn("bad value in", item, length);
    g_values[i] = value;
    return;
  }
  warn("unknown option", item, eq);
}

void read_options() {
  for (unsigned i = 0; i < unsigned(Option::kCount); ++i) g_values[i] = kSpecs[i].default_value;
  const char* text = os::env("TRAY_OPTIONS");
  while (text != nullptr && *text != '\0') {
    size_t length = 0;
    while (text[length] != '\0' && text[length] != ',') ++length;
    if (length > 0) apply(text, length);
    text += length;
    if (*text == ',') ++text;
  }
}

}  // namespace

int64_t option(Option which) {
  if (TRAY_UNLIKELY(g_state.load(std::memory_order_acquire) != 2)) {
    int expected = 0;
    if (g_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      read_options();
      g_state.store(2, std::memory_order_release);
    } else {
      while (g_state.load(std::memory_order_acquire) != 2) {
      }
    }
  }
  return g_values[unsigned(which)];
}

}  // namespace tray
