// RTLD_DEEPBIND plugins in a program with libtraymalloc.so preloaded.
//
// A plugin without a dependency on traymalloc binds malloc to libc's: its blocks are foreign
// to us, and free() must hand them back to libc. Its strdup is libc's too, but that strdup
// calls malloc through the global scope, so its result is ours. The reverse direction (the
// plugin's free() receiving our blocks) would reach libc's free and cannot work with any
// preloaded allocator; a plugin linked against libtraymalloc.so binds to ours and can.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "override_support.hpp"

namespace {

struct Plugin {
  void* handle = nullptr;
  char* (*strdup)(const char*) = nullptr;
  void* (*malloc)(size_t) = nullptr;
  void (*free)(void*) = nullptr;

  explicit Plugin(const char* path) : handle(dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)) {
    if (handle == nullptr) return;
    strdup = reinterpret_cast<char* (*)(const char*)>(dlsym(handle, "plugin_strdup"));
    malloc = reinterpret_cast<void* (*)(size_t)>(dlsym(handle, "plugin_malloc"));
    free = reinterpret_cast<void (*)(void*)>(dlsym(handle, "plugin_free"));
  }
  ~Plugin() {
    if (handle != nullptr) dlclose(handle);
  }
  bool loaded() const { return strdup && malloc && free; }
};

class DeepBind : public testing::Test {
 protected:
  void SetUp() override {
    tray_ = tray_test::LoadedTray::find();
    ASSERT_TRUE(tray_.present()) << "run this test with libtraymalloc.so in LD_PRELOAD";
  }
  tray_test::LoadedTray tray_{};
};

TEST_F(DeepBind, UnlinkedPluginStrdupIsOursAndTheProgramFreesIt) {
  Plugin plugin(TRAY_DEEPBIND_PLUGIN);
  ASSERT_TRUE(plugin.loaded()) << dlerror();
  const size_t foreign_before = tray_.stats().foreign_frees;
  char* text = plugin.strdup("duplicated by a deep-bound plugin");
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(tray_.owns(text), 1);
  EXPECT_STREQ(text, "duplicated by a deep-bound plugin");
  free(text);
  EXPECT_EQ(tray_.stats().foreign_frees, foreign_before);
}

TEST_F(DeepBind, UnlinkedPluginMallocIsLibcsAndTheProgramFreesIt) {
  Plugin plugin(TRAY_DEEPBIND_PLUGIN);
  ASSERT_TRUE(plugin.loaded()) << dlerror();
  const tray_test::LibcMalloc libc = tray_test::LibcMalloc::find();
  ASSERT_TRUE(libc.present());
  const size_t libc_before = libc.bytes_in_use();
  const size_t foreign_before = tray_.stats().foreign_frees;
  void* block = plugin.malloc(3000);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(tray_.owns(block), 0);
  EXPECT_GT(libc.bytes_in_use(), libc_before);
  memset(block, 7, 3000);
  free(block);
  EXPECT_EQ(libc.bytes_in_use(), libc_before);
  EXPECT_EQ(tray_.stats().foreign_frees, foreign_before + 1);
}

TEST_F(DeepBind, LinkedPluginAndProgramShareTraymallocBothWays) {
  Plugin plugin(TRAY_DEEPBIND_PLUGIN_LINKED);
  ASSERT_TRUE(plugin.loaded()) << dlerror();
  const size_t foreign_before = tray_.stats().foreign_frees;

  char* from_plugin = plugin.strdup("duplicated by a deep-bound plugin");
  EXPECT_EQ(tray_.owns(from_plugin), 1);
  free(from_plugin);
  void* block = plugin.malloc(100000);
  EXPECT_EQ(tray_.owns(block), 1);
  free(block);

  char* from_program = strdup("duplicated by the program");
  EXPECT_EQ(tray_.owns(from_program), 1);
  plugin.free(from_program);
  plugin.free(malloc(5000));
  EXPECT_EQ(tray_.stats().foreign_frees, foreign_before);
}

}  // namespace
