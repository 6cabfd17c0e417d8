#include "heap/free_key.hpp"

#include "core/core.hpp"
#include "platform/platform.hpp"

namespace tray {

namespace {
[[noreturn]] void report_and_abort(const char* what, const void* block, const Page* page,
                                   const char* detail) {
  char storage[256];
  TextBuffer text(storage, sizeof storage);
  text.str("traymalloc: ").str(what).ptr(block).str(" (size class ");
  text.dec(page->block_bytes).str(" B)").str(detail).str("\n");
  fatal_misuse(text);
}
}  // namespace

#if TRAY_FREE_KEY_CHECK
void report_release_double_free(const void* block, const Page* page) {
  report_and_abort("double free of ", block, page, "");
}

void report_release_realloc_of_freed(const void* block, const Page* page) {
  report_and_abort("realloc of freed block ", block, page, "");
}
#endif

void report_sparse_block_reused(const void* block, const Page* page) {
  report_and_abort("double free of ", block, page, ", or a write after free: its OS page had been given back");
}

}  // namespace tray
