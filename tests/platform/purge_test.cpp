// os::purge_ranges: many ranges given back at once (one process_madvise per list where the
// kernel takes it, one madvise each elsewhere). Every range goes, nothing between them does,
// a range the kernel refuses keeps its bytes without stopping the ranges after it, fault
// injection still fails ranges one at a time, and a process under a seccomp filter never
// makes the call that gives the list.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "platform/os.hpp"

namespace {

namespace os = tray::os;

constexpr unsigned char kFill = 0xab;

struct Area {
  unsigned char* base = nullptr;
  size_t page = 0;
  size_t pages = 0;
};

Area map_filled(size_t pages) {
  Area a;
  a.page = os::page_size();
  a.pages = pages;
  void* p = mmap(nullptr, pages * a.page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return a;
  a.base = static_cast<unsigned char*>(p);
  std::memset(a.base, kFill, pages * a.page);
  return a;
}

bool all_bytes(const unsigned char* p, size_t n, unsigned char value) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != value) return false;
  return true;
}

// Ranges of one and two pages with a page between each two: `count` of them.
std::vector<os::PurgeRange> spaced_ranges(const Area& a, size_t count) {
  std::vector<os::PurgeRange> ranges;
  size_t page = 0;
  for (size_t i = 0; i < count; ++i) {
    const size_t pages = 1 + i % 2;
    ranges.push_back({a.base + page * a.page, pages * a.page, false});
    page += pages + 1;
  }
  return ranges;
}

bool in_a_range(const std::vector<os::PurgeRange>& ranges, const unsigned char* p) {
  for (const os::PurgeRange& r : ranges)
    if (p >= static_cast<unsigned char*>(r.start) && p < static_cast<unsigned char*>(r.start) + r.bytes)
      return true;
  return false;
}

// More ranges than one list holds, and a count that is not a multiple of it.
constexpr size_t kRanges = 2 * os::kPurgeListRanges + 5;

TEST(PurgeRanges, EveryRangeGoesAndNothingBetween) {
  const Area a = map_filled(kRanges * 3);
  ASSERT_NE(a.base, nullptr);
  std::vector<os::PurgeRange> ranges = spaced_ranges(a, kRanges);
  const uint64_t calls_before = os::g_calls.madvise.load();
  EXPECT_EQ(os::purge_ranges(ranges.data(), ranges.size()), kRanges);
  const uint64_t calls = os::g_calls.madvise.load() - calls_before;
  // One call per list where the kernel takes lists; one per range where it does not (and one
  // more, the first time, to find that out). Never both.
  const uint64_t lists = (kRanges + os::kPurgeListRanges - 1) / os::kPurgeListRanges;
  EXPECT_TRUE(calls == lists || calls == kRanges || calls == kRanges + 1) << calls << " calls";
  std::printf("purge_ranges: %zu ranges in %llu calls\n", kRanges, static_cast<unsigned long long>(calls));

  std::vector<unsigned char> resident(a.pages);
  ASSERT_TRUE(os::resident_pages(a.base, a.pages * a.page, resident.data()));
  for (size_t p = 0; p < a.pages; ++p) {
    const unsigned char* page = a.base + p * a.page;
    if (in_a_range(ranges, page)) {
      EXPECT_EQ(resident[p] & 1, 0) << "page " << p << " of a range is still in memory";
      EXPECT_TRUE(all_bytes(page, a.page, 0)) << "page " << p << " of a range kept its bytes";
    } else {
      EXPECT_TRUE(all_bytes(page, a.page, kFill)) << "page " << p << " between ranges was purged";
    }
  }
  for (const os::PurgeRange& r : ranges) EXPECT_TRUE(r.purged);
  munmap(a.base, a.pages * a.page);
}

// The kernel refuses MADV_DONTNEED on locked pages: a list stops there. That range keeps its
// bytes and says so; the ranges before and after it still go.
TEST(PurgeRanges, ARefusedRangeKeepsItsBytesAndTheOthersGo) {
  const Area a = map_filled(kRanges * 3);
  ASSERT_NE(a.base, nullptr);
  std::vector<os::PurgeRange> ranges = spaced_ranges(a, kRanges);
  const size_t locked = os::kPurgeListRanges / 2;
  // The system call itself: ASan's mlock interceptor locks nothing and returns 0.
  if (syscall(SYS_mlock, ranges[locked].start, ranges[locked].bytes) != 0) GTEST_SKIP() << "mlock not allowed here";
  EXPECT_EQ(os::purge_ranges(ranges.data(), ranges.size()), kRanges - 1);
  for (size_t i = 0; i < kRanges; ++i) {
    const auto* start = static_cast<const unsigned char*>(ranges[i].start);
    EXPECT_EQ(ranges[i].purged, i != locked) << "range " << i;
    EXPECT_TRUE(all_bytes(start, ranges[i].bytes, i == locked ? kFill : 0)) << "range " << i;
  }
  syscall(SYS_munlock, ranges[locked].start, ranges[locked].bytes);
  munmap(a.base, a.pages * a.page);
}

// Fault injection numbers purges a range at a time, whether or not the kernel takes lists, so
// the tests that sweep it fail the same purges on every kernel.
TEST(PurgeRanges, InjectedFaultsFailRangesOneAtATime) {
  const Area a = map_filled(kRanges * 3);
  ASSERT_NE(a.base, nullptr);
  std::vector<os::PurgeRange> ranges = spaced_ranges(a, kRanges);
  os::inject_faults(os::kFaultMadvise, 3, 2);  // the 3rd and 4th
  const size_t purged = os::purge_ranges(ranges.data(), ranges.size());
  const uint64_t counted = os::fault_calls_counted();
  os::inject_faults(0, 0, 0);
  EXPECT_EQ(purged, kRanges - 2);
  EXPECT_EQ(counted, kRanges);
  for (size_t i = 0; i < kRanges; ++i) {
    const bool refused = i == 2 || i == 3;
    EXPECT_EQ(ranges[i].purged, !refused) << "range " << i;
    EXPECT_TRUE(all_bytes(static_cast<const unsigned char*>(ranges[i].start), ranges[i].bytes,
                          refused ? kFill : 0))
        << "range " << i;
  }
  munmap(a.base, a.pages * a.page);
}

// Kills the process at process_madvise, as a filter written before the call existed may (the
// filter OpenSSH puts on its privilege-separated child kills at any call not on its list).
bool kill_at_process_madvise() {
  sock_filter program[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_madvise, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog filter = {static_cast<unsigned short>(sizeof program / sizeof program[0]), program};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) == 0;
}

// The parent gave lists (where the kernel takes them) just before it forked; the child puts a
// filter on itself first thing, as such children do, and then gives ranges back: one madvise
// each, all of them purged, and the child lives.
TEST(PurgeRanges, AProcessUnderASeccompFilterGetsNoList) {
  const Area a = map_filled(kRanges * 3);
  ASSERT_NE(a.base, nullptr);
  std::vector<os::PurgeRange> ranges = spaced_ranges(a, kRanges);
  ASSERT_EQ(os::purge_ranges(ranges.data(), ranges.size()), kRanges);
  std::memset(a.base, kFill, a.pages * a.page);

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (!kill_at_process_madvise()) _exit(2);
    std::vector<os::PurgeRange> again = spaced_ranges(a, kRanges);
    if (os::purge_ranges(again.data(), again.size()) != kRanges) _exit(3);
    for (const os::PurgeRange& r : again)
      if (!all_bytes(static_cast<const unsigned char*>(r.start), r.bytes, 0)) _exit(4);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status)) << "the child was killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: no filter, 3: a range not purged, 4: one kept its bytes";
  munmap(a.base, a.pages * a.page);
}

}  // namespace
