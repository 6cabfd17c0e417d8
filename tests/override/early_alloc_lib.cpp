// A library whose constructor allocates. Linked into the early-allocation tests, it makes
// malloc and operator new run from another library's initialiser, which the loader may well
// run before traymalloc's own constructors.
#include <cstdlib>
#include <cstring>
#include <string>

#include "override_support.hpp"

namespace {

constexpr size_t kBlockBytes = 300;
constexpr uint32_t kSeed = 41;
void* g_block = nullptr;
char* g_text = nullptr;
std::string* g_string = nullptr;

__attribute__((constructor)) void allocate_while_loading() {
  g_block = malloc(kBlockBytes);
  if (g_block != nullptr) tray_test::fill_pattern(g_block, kBlockBytes, kSeed);
  g_text = strdup("allocated by a library constructor");
  g_string = new std::string(5000, 'L');
}

}  // namespace

// Hands the blocks over: the caller checks and frees them.
extern "C" void early_library_blocks(void** block, size_t* block_bytes, uint32_t* seed,
                                     char** text, std::string** string) {
  *block = g_block;
  *block_bytes = kBlockBytes;
  *seed = kSeed;
  *text = g_text;
  *string = g_string;
}
