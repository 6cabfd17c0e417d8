#include <unistd.h>

#include <atomic>

#include "core/core.hpp"
#include "platform/assert.hpp"
#include "platform/os.hpp"

namespace tray {

void fatal(const char* message) {
  char storage[512];
  TextBuffer out(storage, sizeof storage);
  out.str("traymalloc: ").str(message).chr('\n');
  os::write_text(STDERR_FILENO, out);
  os::abort_process();
}

void fatal_check(const char* condition, const char* file, int line) {
  char storage[512];
  TextBuffer out(storage, sizeof storage);
  out.str("traymalloc: internal check failed: ").str(condition).str(" at ").str(file).chr(':')
      .dec(uint64_t(line)).chr('\n');
  os::write_text(STDERR_FILENO, out);
  os::abort_process();
}

void fatal_misuse(const TextBuffer& message) {
  os::write_text(STDERR_FILENO, message);
  // The backtrace's first use loads the unwinder, which allocates: a second report from in
  // there (the same broken list, met again) ends the process without one.
  static std::atomic<bool> reporting{false};
  if (reporting.exchange(true, std::memory_order_relaxed)) os::abort_process();
  static constexpr char kHint[] =
      "traymalloc: rerun with TRAY_OPTIONS=debug=1 to check every block and free "
      "(fills, canaries, exact reports)\n";
  os::write_fd(STDERR_FILENO, kHint, sizeof kHint - 1);
  os::prepare_backtrace();
  os::write_backtrace(STDERR_FILENO);
  os::abort_process();
}

}  // namespace tray
