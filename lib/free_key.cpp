#include "free_key.hpp"

#include <unistd.h>

#include "core/format.hpp"
#include "platform/os.hpp"

namespace tray {

#if TRAY_FREE_KEY_CHECK
void report_release_double_free(const void* block, const Page* page) {
  char storage[256];
  TextBuffer text(storage, sizeof storage);
  text.str("traymalloc: double free of ").ptr(block).str(" (size class ");
  text.dec(page->block_bytes).str(" B)\n");
  text.write_to(STDERR_FILENO);
  // Preparing the backtrace may allocate (the unwinder is loaded on first use): safe here,
  // since nothing has been changed yet and no lock is held.
  os::prepare_backtrace();
  os::write_backtrace(STDERR_FILENO);
  os::abort_process();
}
#endif

}  // namespace tray
