// libtraymalloc.so loaded with dlopen by a program that neither links nor preloads it.
//
// Built with the initial-exec TLS model (the default), the library needs a slot in the static
// TLS block, which glibc can give a dlopen'ed library only from the small surplus it reserves
// at startup. So dlopen either succeeds, and the tray_* API works while libc's malloc keeps
// serving the program (RTLD_LOCAL), or fails with glibc's static-TLS message; any other
// failure is a bug. Built with TRAY_TLS_MODEL=global-dynamic, dlopen must succeed.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

#include <gtest/gtest.h>

#include "override_support.hpp"
#include "traymalloc.h"

namespace {

constexpr std::string_view kStaticTlsRefusal = "cannot allocate memory in static TLS block";

template <typename Function>
Function* find(void* library, const char* name) {
  return reinterpret_cast<Function*>(dlsym(library, name));
}

TEST(DlopenTraymalloc, LoadsOrIsRefusedOnlyForLackOfStaticTls) {
  ASSERT_FALSE(tray_test::LoadedTray::find().present())
      << "run this test without libtraymalloc.so preloaded or linked";

  void* library = dlopen(TRAY_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const std::string error = dlerror();
    std::printf("outcome: dlopen refused libtraymalloc.so (TLS model %s): %s\n",
                TRAY_TLS_MODEL_NAME, error.c_str());
    RecordProperty("outcome", "refused");
    EXPECT_NE(std::string_view(TRAY_TLS_MODEL_NAME), "global-dynamic");
    EXPECT_NE(error.find(kStaticTlsRefusal), std::string::npos) << error;
    return;
  }
  std::printf("outcome: dlopen loaded libtraymalloc.so (TLS model %s)\n", TRAY_TLS_MODEL_NAME);
  RecordProperty("outcome", "loaded");

  auto* tray_malloc_fn = find<decltype(tray_malloc)>(library, "tray_malloc");
  auto* tray_realloc_fn = find<decltype(tray_realloc)>(library, "tray_realloc");
  auto* tray_free_fn = find<decltype(tray_free)>(library, "tray_free");
  auto* tray_owns_fn = find<decltype(tray_owns)>(library, "tray_owns");
  ASSERT_NE(tray_malloc_fn, nullptr);
  ASSERT_NE(tray_realloc_fn, nullptr);
  ASSERT_NE(tray_free_fn, nullptr);
  ASSERT_NE(tray_owns_fn, nullptr);

  void* p = tray_malloc_fn(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(tray_owns_fn(p), 1);
  p = tray_realloc_fn(p, 1 << 20);
  EXPECT_EQ(tray_owns_fn(p), 1);
  tray_free_fn(p);

  // A thread started after the load gets its own heap.
  int owned_in_thread = -1;
  std::thread([&] {
    void* q = tray_malloc_fn(64);
    owned_in_thread = tray_owns_fn(q);
    tray_free_fn(q);
  }).join();
  EXPECT_EQ(owned_in_thread, 1);

  // RTLD_LOCAL kept our malloc out of the global scope: the program still uses libc's.
  void* from_libc = malloc(100);
  EXPECT_EQ(tray_owns_fn(from_libc), 0);
  free(from_libc);
  EXPECT_NE(tray_test::defining_object("malloc").find("libc.so"), std::string::npos);
}

}  // namespace
