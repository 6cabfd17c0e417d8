// A program linked with libtraymalloc.a: no libtraymalloc.so anywhere, yet malloc, operator
// new and what libc allocates on the program's behalf (strdup) are traymalloc's, because the
// executable's own malloc wins the process-wide symbol lookup.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "override_support.hpp"
#include "traymalloc.h"

namespace {

TEST(StaticLink, NoSharedTraymallocIsLoaded) {
  EXPECT_TRUE(tray_test::process_maps_file("libc.so"));  // the check reads real maps
  EXPECT_FALSE(tray_test::process_maps_file("libtraymalloc"));
}

TEST(StaticLink, ProcessWideMallocIsTheExecutables) {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc, nullptr);
  for (const char* name : {"malloc", "free", "calloc", "realloc", "posix_memalign"}) {
    void* global = dlsym(RTLD_DEFAULT, name);
    EXPECT_NE(global, nullptr) << name;
    EXPECT_NE(global, dlsym(libc, name)) << name << " is libc's";
  }
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "malloc"), reinterpret_cast<void*>(&malloc));
}

TEST(StaticLink, MallocNewAndStrdupAreOurs) {
  void* block = malloc(100);
  EXPECT_EQ(tray_owns(block), 1);
  free(block);

  auto* text = new std::string(500, 's');
  EXPECT_EQ(tray_owns(text), 1);
  EXPECT_EQ(tray_owns(text->data()), 1);
  delete text;

  auto* numbers = new std::vector<int>(100000, 3);
  EXPECT_EQ(tray_owns(numbers->data()), 1);
  delete numbers;

  char* copy = strdup("copied by libc's strdup");
  EXPECT_EQ(tray_owns(copy), 1);
  free(copy);

  void* aligned = nullptr;
  ASSERT_EQ(posix_memalign(&aligned, 4096, 10), 0);
  EXPECT_EQ(tray_owns(aligned), 1);
  free(aligned);
}

TEST(DefaultHeap, TakesThisThreadsMallocAndNew) {
  std::string why;
  EXPECT_TRUE(tray_test::default_heap_routes_this_thread(&why)) << why;
}

}  // namespace
