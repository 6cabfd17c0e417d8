// Run-time options: TRAY_OPTIONS as read at first use (ctest sets it for this binary, with
// one unknown key and one bad value) and tray_option_set.
#include <errno.h>
#include <signal.h>

#include <string>

#include "options/options.hpp"
#include "support.hpp"

namespace {

// The options are read when the library loads, before any test code runs: a re-executed
// copy of this program ("threadsafe" death tests) shows what a fresh process prints.
TEST(Options, EnvironmentIsReadAtStartAndBadItemsAreWarned) {
  // Set by tests/options/CMakeLists.txt:
  // stats_format=json,bogus=1,debug_abort=maybe, guard_slots = 7 (blanks as a user types them)
  ASSERT_NE(getenv("TRAY_OPTIONS"), nullptr);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(tray_option_set("debug", "1")), ::testing::ExitedWithCode(0),
              "traymalloc: TRAY_OPTIONS: unknown option 'bogus' ignored\n"
              "traymalloc: TRAY_OPTIONS: bad value 'maybe' for debug_abort ignored "
              "\\(accepted: 1, 0, true or false\\)\n");
  EXPECT_EQ(tray::option(tray::Option::kGuardSlots), 7) << "the blanks around an item were kept";
}

// A warning names the option, the value and what the option accepts.
TEST(Options, BadValuesAreNamedWithWhatIsAccepted) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(tray_option_set("stats_format", "xml")), ::testing::ExitedWithCode(EINVAL),
              "bad value 'xml' for stats_format ignored \\(accepted: text, json, prometheus\\)");
  EXPECT_EXIT(_exit(tray_option_set("guard_slots", "5000")), ::testing::ExitedWithCode(EINVAL),
              "bad value '5000' for guard_slots ignored \\(accepted: a whole number, 1..1024\\)");
  EXPECT_EXIT(_exit(tray_option_set("prof_sample", "0")), ::testing::ExitedWithCode(EINVAL),
              "bad value '0' for prof_sample ignored \\(accepted: bytes, .*at least 1\\)");
}

TEST(Options, SetReportsUnknownNamesAndBadValues) {
  EXPECT_EQ(tray_option_set("stats_format", "json"), 0);
  EXPECT_EQ(tray_option_set("stats_format", "xml"), EINVAL);
  EXPECT_EQ(tray_option_set("stats_format", "prometheus"), 0);
  EXPECT_EQ(tray::option(tray::Option::kStatsFormat), tray::kStatsPrometheus);
  EXPECT_EQ(tray_option_set("stats_format", "Prometheus"), EINVAL);  // words are lower case
  EXPECT_EQ(tray_option_set("stats_format", "prom"), EINVAL);
  EXPECT_EQ(tray::option(tray::Option::kStatsFormat), tray::kStatsPrometheus);
  EXPECT_EQ(tray_option_set("stats_format", "json"), 0);
  EXPECT_EQ(tray_option_set("stats", "2"), EINVAL);
  EXPECT_EQ(tray_option_set("stats", "true"), 0);
  EXPECT_EQ(tray_option_set("stats", "0"), 0);
  EXPECT_EQ(tray_option_set("stats_signal", "SIGNOPE"), EINVAL);
  EXPECT_EQ(tray_option_set("stats_signal", "none"), 0);
  EXPECT_EQ(tray_option_set("stats_signal", "RTMIN+5"), 0);
  EXPECT_EQ(tray::option(tray::Option::kStatsSignal), SIGRTMIN + 5);
  EXPECT_EQ(tray_option_set("stats_signal", "SIGRTMIN"), 0);
  EXPECT_EQ(tray::option(tray::Option::kStatsSignal), SIGRTMIN);
  EXPECT_EQ(tray_option_set("stats_signal", "RTMIN+999"), EINVAL);
  EXPECT_EQ(tray_option_set("stats_signal", "RTMIN-1"), EINVAL);
  EXPECT_EQ(tray_option_set("stats_signal", "none"), 0);
  EXPECT_EQ(tray_option_set("sparse_delay_ms", "250"), 0);
  EXPECT_EQ(tray_option_set("sparse_delay_ms", "250ms"), EINVAL);
  EXPECT_EQ(tray_option_set("sparse_delay_ms", "-1"), EINVAL);
  EXPECT_EQ(tray_option_set("sparse_delay_ms", "0"), 0);
  EXPECT_EQ(tray_option_set("guard_slots", "0"), EINVAL);
  EXPECT_EQ(tray_option_set("guard_slots", "1025"), EINVAL);
  EXPECT_EQ(tray_option_set("guard_slots", "1024"), 0);
  EXPECT_EQ(tray_option_set("prof_sample", "0"), EINVAL);
  EXPECT_EQ(tray_option_set("prof_sample", "1"), 0);
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
