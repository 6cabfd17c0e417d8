// Blocks cross a dlopen boundary both ways: a library loaded at run time allocates in its
// constructor and the program frees the blocks, after dlclose too; the library frees blocks
// the program allocated. Built twice: preloaded, and linked against libtraymalloc.so.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "override_support.hpp"

namespace {

using tray_test::has_pattern;

struct LoadedBlock {
  void* p;
  size_t bytes;
  uint32_t seed;
};

TEST(DlopenedLibrary, ConstructorBlocksAreOursAndOutliveTheLibrary) {
  const tray_test::LoadedTray tray = tray_test::LoadedTray::find();
  ASSERT_TRUE(tray.present()) << "libtraymalloc.so is neither preloaded nor linked";

  const size_t foreign_before = tray.stats().foreign_frees;
  void* library = dlopen(TRAY_DLOPEN_ALLOC_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(library, nullptr) << dlerror();
  auto loaded_block = reinterpret_cast<void* (*)(size_t, size_t*)>(dlsym(library, "loaded_block"));
  auto loaded_text = reinterpret_cast<char* (*)()>(dlsym(library, "loaded_text"));
  auto release_block = reinterpret_cast<void (*)(void*)>(dlsym(library, "release_block"));
  ASSERT_NE(loaded_block, nullptr);
  ASSERT_NE(loaded_text, nullptr);
  ASSERT_NE(release_block, nullptr);

  std::vector<LoadedBlock> blocks;
  size_t bytes = 0;
  for (uint32_t i = 0; void* p = loaded_block(i, &bytes); ++i) blocks.push_back({p, bytes, i});
  ASSERT_EQ(blocks.size(), 5u);
  char* text = loaded_text();
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(tray.owns(text), 1);

  // The program's blocks, freed by the library.
  for (size_t size : {size_t{24}, size_t{4000}, size_t{1} << 20}) {
    void* p = malloc(size);
    memset(p, 0x11, size);
    release_block(p);
  }

  ASSERT_EQ(dlclose(library), 0);
  for (const LoadedBlock& b : blocks) {
    EXPECT_EQ(tray.owns(b.p), 1) << b.bytes;
    EXPECT_TRUE(has_pattern(b.p, b.bytes, b.seed)) << b.bytes;
    free(b.p);
  }
  EXPECT_STREQ(text, "allocated when the library was loaded");
  free(text);
  EXPECT_EQ(tray.stats().foreign_frees, foreign_before);  // every free found its block
}

}  // namespace
