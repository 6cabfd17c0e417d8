// A library loaded with dlopen whose constructor allocates; the program that loaded it frees
// those blocks (after dlclose, even), and it frees blocks the program allocated.
#include <cstdlib>
#include <cstring>

#include "override_support.hpp"

namespace {

constexpr size_t kBlockSizes[] = {16, 700, 9000, 150000, size_t{3} << 20};
constexpr size_t kBlockCount = sizeof kBlockSizes / sizeof kBlockSizes[0];
void* g_blocks[kBlockCount];
char* g_text;

__attribute__((constructor)) void allocate_while_loading() {
  for (size_t i = 0; i < kBlockCount; ++i) {
    g_blocks[i] = malloc(kBlockSizes[i]);
    if (g_blocks[i] != nullptr) tray_test::fill_pattern(g_blocks[i], kBlockSizes[i], uint32_t(i));
  }
  g_text = strdup("allocated when the library was loaded");
}

}  // namespace

// Block i of the ones allocated at load time (its pattern seed is i); the caller owns it.
extern "C" void* loaded_block(size_t i, size_t* bytes) {
  if (i >= kBlockCount) return nullptr;
  *bytes = kBlockSizes[i];
  return g_blocks[i];
}

extern "C" char* loaded_text() { return g_text; }

extern "C" void release_block(void* p) { free(p); }
