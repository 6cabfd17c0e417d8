// Allocations made before main: from the executable's .preinit_array (before any library's
// constructor, traymalloc's included), from another library's constructor, from the
// executable's constructors and from the dynamic initialisation of globals. Built twice: run
// with libtraymalloc.so preloaded, and linked against it.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "override_support.hpp"

extern "C" void early_library_blocks(void** block, size_t* block_bytes, uint32_t* seed,
                                     char** text, std::string** string);

namespace {

using tray_test::fill_pattern;
using tray_test::has_pattern;

constexpr size_t kPreinitBytes = 72;
constexpr size_t kConstructorBytes = 2000;
constexpr size_t kConstructorLargeBytes = size_t{1} << 20;

void* g_preinit_block = nullptr;
char* g_preinit_text = nullptr;
void* g_constructor_block = nullptr;
void* g_constructor_large = nullptr;
std::vector<int>* g_constructor_vector = nullptr;

// Only C calls here: the C++ runtime is not initialised yet.
void allocate_in_preinit(int, char**, char**) {
  g_preinit_block = malloc(kPreinitBytes);
  if (g_preinit_block != nullptr) fill_pattern(g_preinit_block, kPreinitBytes, 1);
  g_preinit_text = strdup("allocated from .preinit_array");
}
__attribute__((section(".preinit_array"), used)) void (*const g_preinit_hook)(int, char**,
                                                                             char**) =
    allocate_in_preinit;

__attribute__((constructor(101))) void allocate_in_constructor() {
  g_constructor_block = malloc(kConstructorBytes);
  fill_pattern(g_constructor_block, kConstructorBytes, 2);
  g_constructor_large = calloc(1, kConstructorLargeBytes);
  g_constructor_vector = new std::vector<int>(1000, 7);
}

std::vector<std::string> make_global_strings() {
  std::vector<std::string> strings;
  for (int i = 0; i < 100; ++i) strings.push_back(std::string(40 + i, char('a' + i % 26)));
  return strings;
}
const std::vector<std::string> g_global_strings = make_global_strings();

class EarlyAllocation : public testing::Test {
 protected:
  void SetUp() override {
    tray_ = tray_test::LoadedTray::find();
    ASSERT_TRUE(tray_.present()) << "libtraymalloc.so is neither preloaded nor linked";
  }
  tray_test::LoadedTray tray_{};
};

TEST_F(EarlyAllocation, PreinitArrayBlocksAreOursAndIntact) {
  ASSERT_NE(g_preinit_block, nullptr);
  ASSERT_NE(g_preinit_text, nullptr);
  EXPECT_EQ(tray_.owns(g_preinit_block), 1);
  EXPECT_EQ(tray_.owns(g_preinit_text), 1);
  EXPECT_TRUE(has_pattern(g_preinit_block, kPreinitBytes, 1));
  EXPECT_STREQ(g_preinit_text, "allocated from .preinit_array");
  free(g_preinit_block);
  free(g_preinit_text);
}

TEST_F(EarlyAllocation, OtherLibrarysConstructorBlocksAreOursAndIntact) {
  void* block;
  size_t bytes;
  uint32_t seed;
  char* text;
  std::string* string;
  early_library_blocks(&block, &bytes, &seed, &text, &string);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(tray_.owns(block), 1);
  EXPECT_EQ(tray_.owns(text), 1);
  EXPECT_EQ(tray_.owns(string), 1);
  EXPECT_EQ(tray_.owns(string->data()), 1);
  EXPECT_TRUE(has_pattern(block, bytes, seed));
  EXPECT_STREQ(text, "allocated by a library constructor");
  EXPECT_EQ(*string, std::string(5000, 'L'));
  free(block);
  free(text);
  delete string;
}

TEST_F(EarlyAllocation, ExecutableConstructorBlocksAreOursAndIntact) {
  EXPECT_EQ(tray_.owns(g_constructor_block), 1);
  EXPECT_EQ(tray_.owns(g_constructor_large), 1);
  EXPECT_EQ(tray_.owns(g_constructor_vector), 1);
  EXPECT_EQ(tray_.owns(g_constructor_vector->data()), 1);
  EXPECT_TRUE(has_pattern(g_constructor_block, kConstructorBytes, 2));
  const auto* large = static_cast<const unsigned char*>(g_constructor_large);
  size_t nonzero = 0;
  for (size_t i = 0; i < kConstructorLargeBytes; ++i) nonzero += large[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  EXPECT_EQ(*g_constructor_vector, std::vector<int>(1000, 7));
  free(g_constructor_block);
  free(g_constructor_large);
  delete g_constructor_vector;
}

TEST_F(EarlyAllocation, DynamicallyInitialisedGlobalsAreOurs) {
  ASSERT_EQ(g_global_strings.size(), 100u);
  EXPECT_EQ(tray_.owns(g_global_strings.data()), 1);
  for (size_t i = 0; i < g_global_strings.size(); ++i) {
    EXPECT_EQ(tray_.owns(g_global_strings[i].data()), 1) << i;
    EXPECT_EQ(g_global_strings[i], std::string(40 + i, char('a' + i % 26)));
  }
}

}  // namespace
