// Run-time options: TRAY_OPTIONS as read at first use (ctest sets it for this binary, with
// one unknown key and one bad value) and tray_option_set.
#include <errno.h>

#include <string>

#include "support.hpp"

namespace {

// The options are read when the library loads, before any test code runs: a re-executed
// copy of this program ("threadsafe" death tests) shows what a fresh process prints.
TEST(Options, EnvironmentIsReadAtStartAndBadItemsAreWarned) {
  // Set by tests/options/CMakeLists.txt: stats_format=json,bogus=1,debug_abort=maybe
  ASSERT_NE(getenv("TRAY_OPTIONS"), nullptr);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(tray_option_set("debug", "1")), ::testing::ExitedWithCode(0),
              "traymalloc: TRAY_OPTIONS: unknown option 'bogus' ignored\n"
              "traymalloc: TRAY_OPTIONS: bad value for 'debug_abort' ignored\n");
}

TEST(Options, SetReportsUnknownNamesAndBadValues) {
  EXPECT_EQ(tray_option_set("stats_format", "json"), 0);
  EXPECT_EQ(tray_option_set("stats_format", "xml"), EINVAL);
  EXPECT_EQ(tray_option_set("stats", "2"), EINVAL);
  EXPECT_EQ(tray_option_set("stats", "true"), 0);
  EXPECT_EQ(tray_option_set("stats", "0"), 0);
  EXPECT_EQ(tray_option_set("stats_signal", "SIGNOPE"), EINVAL);
  EXPECT_EQ(tray_option_set("stats_signal", "none"), 0);
  EXPECT_EQ(tray_option_set("sparse_delay_ms", "250"), 0);
  EXPECT_EQ(tray_option_set("sparse_delay_ms", "250ms"), EINVAL);
  EXPECT_EQ(tray_option_set("sparse_delay_ms", "-1"), EINVAL);
  EXPECT_EQ(tray_option_set("sparse_delay_ms", "0"), 0);
  EXPECT_EQ(tray_option_set("nonsense", "1"), EINVAL);
  EXPECT_EQ(tray_option_set(nullptr, "1"), EINVAL);
  EXPECT_EQ(tray_option_set("stats", nullptr), EINVAL);
}

TEST(Options, DebugIsFixedOnceTheAllocatorRuns) {
  tray_free(tray_malloc(8));
  EXPECT_EQ(tray_option_set("debug", "1"), EBUSY);
  void* p = tray_malloc(40);
  EXPECT_EQ(tray_usable_size(p), 48u);  // no debug canary: still the release behaviour
  tray_free(p);
}

}  // namespace
