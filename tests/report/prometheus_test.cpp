// The Prometheus dump through the prefixed API and the dump that the options configure:
// its lines and families, its label escapes, and stats_file replaced whole (never appended,
// never left half written). The strict parse of whole files is tests/stats/prometheus_test.py.
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "report/report.hpp"
#include "report/stats_print.hpp"
#include "support.hpp"

namespace {

void append(void* out, const char* text, size_t length) {
  static_cast<std::string*>(out)->append(text, length);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> files_in(const std::string& folder) {
  std::vector<std::string> names;
  DIR* dir = opendir(folder.c_str());
  if (dir == nullptr) return names;
  while (const dirent* entry = readdir(dir))
    if (entry->d_name[0] != '.') names.push_back(entry->d_name);
  closedir(dir);
  return names;
}

std::string escaped(const std::string& text) {
  char storage[256];
  tray::TextBuffer out(storage, sizeof storage);
  tray::prometheus_label_value(out, text.data(), text.size());
  return std::string(out.data(), out.length());
}

void remove_folder(const std::string& folder) {
  for (const std::string& name : files_in(folder)) unlink((folder + "/" + name).c_str());
  rmdir(folder.c_str());
}

// A folder of its own for stats_file, and the options put back afterwards. A death test's
// child removes its own folder before it exits.
class StatsFileTest : public testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tray_prometheus_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    folder_ = pattern;
    path_ = folder_ + "/app.prom";
  }
  void TearDown() override {
    tray_option_set("stats_file", "");
    tray_option_set("stats_format", "text");
    remove_folder(folder_);
  }
  std::string folder_, path_;
};

// Every line is a HELP, a TYPE or a sample of the family the last TYPE named, with this
// process's pid and this program's name; no family comes twice; the last line is mprotect's.
TEST(Prometheus, DumpThroughTheApiIsFamiliesOfLabelledSamples) {
  void* block = tray_malloc(16);  // the smallest class is in use: it has series
  std::string text;
  ASSERT_EQ(tray_stats_print(append, &text, TRAY_STATS_PROMETHEUS), 0);
  tray_free(block);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const std::string labels =
      "{pid=\"" + std::to_string(getpid()) + "\",exe=\"tray_prometheus_test\"";
  std::set<std::string> families;
  std::string family;
  size_t samples = 0;
  const std::vector<std::string> lines = lines_of(text);
  for (const std::string& line : lines) {
    SCOPED_TRACE(line);
    if (line.rfind("# HELP ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(families.insert(family).second) << "family twice";
      EXPECT_EQ(family.rfind("traymalloc_", 0), 0u);
    } else if (line.rfind("# TYPE ", 0) == 0) {
      const bool counter = line == "# TYPE " + family + " counter";
      EXPECT_TRUE(counter || line == "# TYPE " + family + " gauge");
      EXPECT_EQ(counter, family.size() > 6 && family.compare(family.size() - 6, 6, "_total") == 0);
    } else {
      ++samples;
      EXPECT_EQ(line.rfind(family + labels, 0), 0u);
      const size_t value = line.rfind("} ");
      ASSERT_NE(value, std::string::npos);
      EXPECT_EQ(line.find_first_not_of("0123456789", value + 2), std::string::npos);
    }
  }
  EXPECT_GE(families.size(), 30u);
  EXPECT_GT(samples, families.size());
  EXPECT_EQ(lines.back().rfind("traymalloc_os_calls_total{", 0), 0u);
  EXPECT_NE(lines.back().find(",call=\"mprotect\"} "), std::string::npos);
  EXPECT_NE(text.find(",size_class=\"16\",class=\"0\"} "), std::string::npos);
  EXPECT_EQ(tray_stats_print(append, &text, TRAY_STATS_PROMETHEUS + 1), EINVAL);
}

TEST(Prometheus, LabelValuesAreEscapedAndUtf8) {
  EXPECT_EQ(escaped("plain-name_1.2"), "plain-name_1.2");
  EXPECT_EQ(escaped("say \"hi\"\\now\nthen"), "say \\\"hi\\\"\\\\now\\nthen");
  const std::string utf8 = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";  // 2, 3 and 4 bytes
  EXPECT_EQ(escaped(utf8), utf8);
  EXPECT_EQ(escaped("a\xff" "b"), "a?b");
  EXPECT_EQ(escaped("\xc0\xaf"), "??");          // an overlong '/'
  EXPECT_EQ(escaped("\xed\xa0\x80"), "???");      // a surrogate
  EXPECT_EQ(escaped("\xf4\x90\x80\x80"), "????");  // past U+10FFFF
  EXPECT_EQ(escaped("cut \xe2\x82"), "cut ??");    // a sequence cut short
  EXPECT_EQ(escaped("\xe2\x82(x"), "?" "?(x");
}

// stats_format=prometheus: each dump takes the file's place, whole; nothing is left beside it.
TEST_F(StatsFileTest, PrometheusDumpsReplaceTheFile) {
  ASSERT_EQ(tray_option_set("stats_file", path_.c_str()), 0);
  ASSERT_EQ(tray_option_set("stats_format", "prometheus"), 0);
  tray::stats_dump_as_configured("api");
  const std::string first = read_file(path_);
  tray_free(tray_malloc(100));
  tray::stats_dump_as_configured("api");
  const std::string second = read_file(path_);
  EXPECT_EQ(second.find("# HELP traymalloc_build_info "), 0u);
  EXPECT_EQ(second.find("# HELP traymalloc_build_info ", 1), std::string::npos) << "appended";
  EXPECT_NE(first, second);
  EXPECT_EQ(files_in(folder_), std::vector<std::string>{"app.prom"});
}

// Text and JSON dumps are appended: the file is their history.
TEST_F(StatsFileTest, JsonDumpsAreAppended) {
  ASSERT_EQ(tray_option_set("stats_file", path_.c_str()), 0);
  ASSERT_EQ(tray_option_set("stats_format", "json"), 0);
  tray::stats_dump_as_configured("api");
  tray::stats_dump_as_configured("api");
  EXPECT_EQ(lines_of(read_file(path_)).size(), 2u);
}

// The cases that run in a child process of their own: the DeathTest suffix lets the emulated
// arm64 run leave them out with the other re-executed tests (tools/run-tests).
using StatsFileDeathTest = StatsFileTest;

// A dump that does not fit (here RLIMIT_FSIZE; a full disk alike) leaves the previous one in
// place, and no temporary file.
TEST_F(StatsFileDeathTest, AFailedWriteKeepsThePreviousDump) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        tray_option_set("stats_file", path_.c_str());
        tray_option_set("stats_format", "prometheus");
        tray::stats_dump_as_configured("api");
        const std::string before = read_file(path_);
        signal(SIGXFSZ, SIG_IGN);  // write fails with EFBIG instead
        rlimit small;
        small.rlim_cur = small.rlim_max = 4096;
        setrlimit(RLIMIT_FSIZE, &small);
        tray::stats_dump_as_configured("api");
        const bool kept = before.size() > 4096 && read_file(path_) == before;
        const bool alone = files_in(folder_).size() == 1;
        remove_folder(folder_);
        _exit(kept && alone ? 0 : 1);
      },
      testing::ExitedWithCode(0),
      "traymalloc: cannot write stats_file; it keeps the previous dump\n");
}

// Where the temporary file cannot be made, the dump goes to stderr, as when stats_file cannot
// be opened for the other formats.
TEST_F(StatsFileDeathTest, AFolderThatIsMissingSendsTheDumpToStderr) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string missing = folder_ + "/missing/app.prom";
  EXPECT_EXIT(
      {
        tray_option_set("stats_file", missing.c_str());
        tray_option_set("stats_format", "prometheus");
        tray::stats_dump_as_configured("api");
        remove_folder(folder_);
        _exit(0);
      },
      testing::ExitedWithCode(0),
      "traymalloc: cannot open stats_file; dumping to stderr\n# HELP traymalloc_build_info ");
}

}  // namespace
