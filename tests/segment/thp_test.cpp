// Transparent huge pages (the thp option): its words, and what each does to the mappings that
// hold small blocks, as the kernel reports them in /proc/self/smaps (the VmFlags "hg" of
// MADV_HUGEPAGE and "nh" of MADV_NOHUGEPAGE, and AnonHugePages). Each mode runs in a fresh
// copy of this program (a "threadsafe" death test re-executes it), since the advice is given
// when a segment is mapped and segments stay for the life of a process.
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "core/core.hpp"
#include "options/options.hpp"
#include "platform/platform.hpp"
#include "segment/config.hpp"
#include "segment/segment.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::kMiB;

constexpr size_t kBlockBytes = 48;
constexpr size_t kHeapBytes = 64 * kMiB;  // 16 segments: 32 huge pages
constexpr size_t kBlocks = kHeapBytes / kBlockBytes;

// What smaps says of the mappings that hold the blocks' segments.
struct Regions {
  size_t mappings = 0;
  size_t with_hg = 0;  // MADV_HUGEPAGE
  size_t with_nh = 0;  // MADV_NOHUGEPAGE
  uint64_t anon_huge_bytes = 0;
  uint64_t rss_bytes = 0;
};

Regions regions_holding(const std::set<uintptr_t>& segments) {
  Regions found;
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool ours = false;
  while (std::getline(smaps, line)) {
    uintptr_t start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &start, &end) == 2 && line.find(':') > line.find(' ')) {
      const auto next = segments.lower_bound(start);
      ours = next != segments.end() && *next < end;
      found.mappings += ours ? 1 : 0;
      continue;
    }
    if (!ours) continue;
    unsigned long kib = 0;
    if (std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kib) == 1) found.anon_huge_bytes += kib << 10;
    if (std::sscanf(line.c_str(), "Rss: %lu kB", &kib) == 1) found.rss_bytes += kib << 10;
    if (line.rfind("VmFlags:", 0) == 0) {
      std::istringstream flags(line.substr(8));
      std::string flag;
      while (flags >> flag) {
        found.with_hg += flag == "hg" ? 1 : 0;
        found.with_nh += flag == "nh" ? 1 : 0;
      }
    }
  }
  return found;
}

// `count` written blocks of kBlockBytes, their list in memory of the test's own (mmap), and the
// segments that hold them; exits the child on failure.
void** allocate_written(size_t count, std::set<uintptr_t>& segments) {
  auto** blocks = static_cast<void**>(mmap(nullptr, count * sizeof(void*), PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (blocks == MAP_FAILED) _exit(3);
  for (size_t i = 0; i < count; ++i) {
    blocks[i] = tray_malloc(kBlockBytes);
    if (blocks[i] == nullptr) _exit(4);
    std::memset(blocks[i], int(i), kBlockBytes);
    segments.insert(reinterpret_cast<uintptr_t>(blocks[i]) & ~uintptr_t(tray::kSegmentBytes - 1));
  }
  return blocks;
}

// In a fresh process: thp=mode, then kHeapBytes of 48-byte blocks, every byte written. Exits 0
// when the mappings of their segments carry the mode's advice and, where want_huge says so,
// huge pages back them (1: some; 0: none; -1: either); 1 otherwise, with what it saw.
[[noreturn]] void run_mode(const char* mode, int want_huge) {
  if (tray_option_set("thp", mode) != 0) _exit(2);
  std::set<uintptr_t> segments;
  void** blocks = allocate_written(kBlocks, segments);
  const Regions seen = regions_holding(segments);
  const bool madvise = std::strcmp(mode, "madvise") == 0;
  const bool never = std::strcmp(mode, "never") == 0;
  bool ok = seen.mappings > 0 && seen.with_hg == (madvise ? seen.mappings : 0) &&
            seen.with_nh == (never ? seen.mappings : 0);
  if (want_huge >= 0) ok &= (seen.anon_huge_bytes > 0) == (want_huge == 1);
  std::fprintf(stderr, "thp=%s: %zu segments in %zu mappings, %zu hg, %zu nh, AnonHugePages %llu kB, "
               "process %lld kB\n", mode, segments.size(), seen.mappings, seen.with_hg, seen.with_nh,
               static_cast<unsigned long long>(seen.anon_huge_bytes >> 10),
               static_cast<long long>(tray::os::anon_huge_page_bytes() >> 10));
  for (size_t i = 0; i < kBlocks; ++i) tray_free(blocks[i]);
  _exit(ok ? 0 : 1);
}

// In a fresh process: thp=mode, 48 MiB of 48-byte blocks, then every block freed but those
// in the 64 KiB at the middle of each 2 MiB, so that every huge page keeps a live page and the
// rest of it goes back to the pool dirty (less than the pool's dirty limit). Once the purge
// delay has run out, the pool's purge on delay runs: under thp=madvise it must leave those
// huge pages whole (the units wait for the rest of their huge page), under thp=never it gives
// the freed units back. A trim then purges everything, huge pages or not.
[[noreturn]] void run_purge(const char* mode) {
  if (tray_option_set("thp", mode) != 0 || tray_option_set("purge_thread", "0") != 0) _exit(2);
  const size_t count = kBlocks / 4 * 3;  // 48 MiB: what goes back stays below the 64 MiB limit
  std::set<uintptr_t> segments;
  void** blocks = allocate_written(count, segments);
  const Regions full = regions_holding(segments);
  for (size_t i = 0; i < count; ++i) {
    const uintptr_t offset = reinterpret_cast<uintptr_t>(blocks[i]) % tray::kHugePageBytes;
    if (offset / tray::kUnitBytes == tray::kUnitsPerHugePage / 2) continue;
    tray_free(blocks[i]);
    blocks[i] = nullptr;
  }
  usleep(useconds_t(tray::kPurgeDelayMs + tray::kPoolQuietMs + 100) * 1000);
  tray::segment_purge_expired(tray::os::now_ms());
  const Regions after_delay = regions_holding(segments);
  tray_trim();
  const Regions after_trim = regions_holding(segments);
  std::fprintf(stderr,
               "thp=%s purge: full rss %llu kB huge %llu kB; after the delay rss %llu kB huge %llu kB; "
               "after trim rss %llu kB huge %llu kB\n",
               mode,
               static_cast<unsigned long long>(full.rss_bytes >> 10),
               static_cast<unsigned long long>(full.anon_huge_bytes >> 10),
               static_cast<unsigned long long>(after_delay.rss_bytes >> 10),
               static_cast<unsigned long long>(after_delay.anon_huge_bytes >> 10),
               static_cast<unsigned long long>(after_trim.rss_bytes >> 10),
               static_cast<unsigned long long>(after_trim.anon_huge_bytes >> 10));
  bool ok = after_trim.rss_bytes < full.rss_bytes / 4;
  if (std::strcmp(mode, "madvise") == 0)
    ok &= full.anon_huge_bytes > 0 && after_delay.anon_huge_bytes >= full.anon_huge_bytes / 10 * 9 &&
          after_delay.rss_bytes >= full.rss_bytes / 10 * 9 &&
          after_trim.anon_huge_bytes < full.anon_huge_bytes;
  else
    ok &= after_delay.rss_bytes < full.rss_bytes / 4;
  for (size_t i = 0; i < count; ++i) tray_free(blocks[i]);
  _exit(ok ? 0 : 1);
}

bool kernel_never() { return std::strcmp(tray::os::thp_kernel_mode(), "never") == 0; }

TEST(Thp, OptionTakesItsThreeWords) {
  const int64_t before = tray::option(tray::Option::kThp);
  EXPECT_EQ(tray_option_set("thp", "never"), 0);
  EXPECT_EQ(tray::option(tray::Option::kThp), tray::kThpNever);
  EXPECT_EQ(tray_option_set("thp", "madvise"), 0);
  EXPECT_EQ(tray::option(tray::Option::kThp), tray::kThpMadvise);
  EXPECT_EQ(tray_option_set("thp", "system"), 0);
  EXPECT_EQ(tray::option(tray::Option::kThp), tray::kThpSystem);
  EXPECT_EQ(tray_option_set("thp", "huge"), EINVAL);
  EXPECT_EQ(tray::option(tray::Option::kThp), tray::kThpSystem) << "a bad value changed it";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(_exit(tray_option_set("thp", "always")), ::testing::ExitedWithCode(EINVAL),
              "bad value 'always' for thp ignored \\(accepted: never, madvise, system\\)");
  tray_option_set("thp", before == tray::kThpNever     ? "never"
                         : before == tray::kThpMadvise ? "madvise"
                                                       : "system");
}

TEST(Thp, SmapsRollupIsReadWithoutTheCLibrary) {
  std::ifstream rollup("/proc/self/smaps_rollup");
  if (!rollup) GTEST_SKIP() << "no /proc/self/smaps_rollup (Linux before 4.14)";
  EXPECT_GE(tray::os::anon_huge_page_bytes(), 0);
  const std::string kernel = tray::os::thp_kernel_mode();
  EXPECT_TRUE(kernel == "always" || kernel == "madvise" || kernel == "never") << kernel;
}

// Segments and span chunks are mapped on 4 MiB boundaries: every 2 MiB of them is one whole
// huge page the kernel can back.
TEST(Thp, RegionsAreHugePageAligned) {
  for (int i = 0; i < 8; ++i) {
    void* region = tray::segment_map_region();
    ASSERT_NE(region, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(region) % tray::kHugePageBytes, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(region) % tray::kSegmentBytes, 0u);
    munmap(region, tray::kSegmentBytes);
  }
}

TEST(Thp, MadviseGivesSmallBlocksHugePages) {
  if (kernel_never()) GTEST_SKIP() << "/sys/kernel/mm/transparent_hugepage/enabled says never";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_mode("madvise", 1), ::testing::ExitedWithCode(0), "thp=madvise: ");
}

TEST(Thp, NeverKeepsHugePagesOffOurMappings) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_mode("never", 0), ::testing::ExitedWithCode(0), "thp=never: ");
}

// No advice: the kernel's mode decides (huge pages under "always", none under "madvise").
TEST(Thp, SystemLeavesTheKernelsDefault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string kernel = tray::os::thp_kernel_mode();
  const int want = kernel == "always" ? -1 : kernel == "unknown" ? -1 : 0;
  EXPECT_EXIT(run_mode("system", want), ::testing::ExitedWithCode(0), "thp=system: ");
}

// The pool's purges on delay leave a huge page that still holds a page whole (splitting it
// would free the rest, and khugepaged could fill it in again); trim splits them.
TEST(Thp, PurgesOnDelayKeepHugePagesWhole) {
  if (kernel_never()) GTEST_SKIP() << "/sys/kernel/mm/transparent_hugepage/enabled says never";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_purge("madvise"), ::testing::ExitedWithCode(0), "thp=madvise purge: ");
}

TEST(Thp, NeverPurgesFreedUnitsOnDelay) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_purge("never"), ::testing::ExitedWithCode(0), "thp=never purge: ");
}

}  // namespace
