#include <unistd.h>

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

}  // namespace tray
