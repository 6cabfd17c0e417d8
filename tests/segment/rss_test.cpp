// Memory return: after a burst of allocations is freed, resident memory must come back close
// to where it was, on its own for small blocks and after tray_trim for everything.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "core/core.hpp"
#include "heap/config.hpp"
#include "large/config.hpp"
#include "platform/os.hpp"
#include "segment/config.hpp"
#include "size_classes/size_classes.hpp"
#include "span/config.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

// The purger these tests wait for starts only in a program with a thread of its own.
testing::Environment* const kThreadedProgram =
    testing::AddGlobalTestEnvironment(new tray_test::ThreadedProgram);

using tray_test::kMiB;

// Sanitizers add resident memory of their own, so under them the burst is smaller.
constexpr size_t kSmallBurstBytes = tray_test::kSanitized ? 256 * kMiB : 1024 * kMiB;
constexpr size_t kLargeBlockBytes = 16 * kMiB;
constexpr size_t kLargeBlockCount = tray_test::kSanitized ? 16 : 64;

// The burst's pointers live in a mapping of their own: outside the allocator under test, and
// unmapped before the second reading so they do not count in it.
class MappedPointers {
 public:
  explicit MappedPointers(size_t capacity) : capacity_(capacity) {
    void* mapping = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) throw std::bad_alloc();
    slots_ = static_cast<void**>(mapping);
  }
  ~MappedPointers() { ::munmap(slots_, bytes()); }
  MappedPointers(const MappedPointers&) = delete;
  MappedPointers& operator=(const MappedPointers&) = delete;

  size_t capacity() const { return capacity_; }
  void*& operator[](size_t i) { return slots_[i]; }

 private:
  size_t bytes() const { return capacity_ * sizeof(void*); }
  size_t capacity_;
  void** slots_;
};

// First use of every class sets up metadata that stays for the life of the process: that
// belongs in the baseline, not in what the burst leaves behind.
void warm_up_every_class() {
  for (unsigned c = 0; c < tray::kSizeClassCount; ++c) {
    void* p = tray_malloc(tray::class_size(c));
    ASSERT_NE(p, nullptr);
    std::memset(p, 1, tray::class_size(c));
    tray_free(p);
  }
}

// Allocates about `total_bytes` of blocks of 16..1024 B, writing every byte, then frees them
// in two passes (even slots first), so pages go from full to half-used before they empty.
void small_block_burst(size_t total_bytes) {
  MappedPointers blocks(total_bytes / 16);
  tray_test::Rng rng(total_bytes);
  size_t count = 0;
  for (size_t allocated = 0; allocated < total_bytes && count < blocks.capacity(); ++count) {
    const size_t size = rng.between(16, 1024);
    void* p = tray_malloc(size);
    ASSERT_NE(p, nullptr) << "after " << allocated << " bytes";
    std::memset(p, int(count), size);
    blocks[count] = p;
    allocated += size;
  }
  for (size_t first = 0; first < 2; ++first)
    for (size_t i = first; i < count; i += 2) tray_free(blocks[i]);
}

// Freed pages stay committed for the purge delay (so a program that frees its working set and
// builds it again at once does not fault it all back in), then the idle purger gives them back
// with no further call into the allocator.
constexpr auto kIdleWait = std::chrono::milliseconds(1500);

template <typename Check>
bool given_back_while_idle(Check given_back) {
  return tray_test::given_back_while_idle(kIdleWait, given_back);
}

TEST(Rss, SmallBlocksAreReturnedWhenIdle) {
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  const size_t before = tray_test::resident_bytes();
  ASSERT_NO_FATAL_FAILURE(small_block_burst(kSmallBurstBytes));
  given_back_while_idle([&] {
    return tray_test::stats_now().released_bytes >= kSmallBurstBytes / 2 &&
           (!tray_test::kResidentBoundsHold ||
            tray_test::resident_bytes() <= before + tray_test::rss_slack(before));
  });
  const size_t after = tray_test::resident_bytes();

  const tray_stats stats = tray_test::stats_now();
  EXPECT_GE(stats.released_bytes, kSmallBurstBytes / 2) << "freed pages were not given back";
  if (tray_test::kResidentBoundsHold) {
    EXPECT_LE(after, before + tray_test::rss_slack(before))
        << "resident before " << before / kMiB << " MiB, after " << after / kMiB << " MiB";
  }
}

// Less than the large cache may hold: without the purger, all of it would stay mapped.
TEST(Rss, LargeBlocksAreReturnedWhenIdle) {
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  const size_t before = tray_test::resident_bytes();
  constexpr size_t kBytes = tray::kLargeCacheFloorBytes / 4;
  void* blocks[2];
  for (void*& p : blocks) {
    p = tray_malloc(kBytes);
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x55, kBytes);
  }
  for (void* p : blocks) tray_free(p);
  given_back_while_idle([&] {
    return tray_test::stats_now().large.cached_bytes == 0 &&
           (!tray_test::kResidentBoundsHold ||
            tray_test::resident_bytes() <= before + tray_test::rss_slack(before));
  });
  const size_t after = tray_test::resident_bytes();

  EXPECT_EQ(tray_test::stats_now().large.cached_blocks, 0u);
  EXPECT_EQ(tray_test::stats_now().large.cached_bytes, 0u);
  if (tray_test::kResidentBoundsHold) {
    EXPECT_LE(after, before + tray_test::rss_slack(before))
        << "resident before " << before / kMiB << " MiB, after " << after / kMiB << " MiB";
  }
}

// purge_thread=0: freed memory waits for the next call, as it did before the purger. Shows
// that the idle tests above measure the purger and not something else giving memory back.
// In a child: the option stops the purger for good, and the tests after this one need it
// when the whole binary runs in one process.
TEST(Rss, WithoutPurgeThreadIdleMemoryStays) {
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (tray_option_set("purge_thread", "0") != 0) _exit(2);
    const uint64_t released_before = tray_test::stats_now().released_bytes;
    // Under the dirty floor, so that no call purges for being over it.
    small_block_burst(tray::kDirtyFloorBytes / 2);
    std::this_thread::sleep_for(kIdleWait);
    const uint64_t released = tray_test::stats_now().released_bytes - released_before;
    _exit(released < tray::kDirtyFloorBytes / 8 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "idle memory went back with purge_thread=0";
}

// A program that goes on taking pages from the pool and giving them back: 4 MiB of 4 KiB blocks
// allocated and freed every few milliseconds, more than a heap keeps of its own empty pages.
template <typename Done>
void take_and_return_pages_until(Done done) {
  constexpr size_t kBlockBytes = 4096;
  constexpr size_t kBlocks = 1024;
  static_assert(kBlockBytes * kBlocks >= 4 * tray::kHeapRetainedBytes);
  static void* blocks[kBlocks];
  while (!done()) {
    for (void*& p : blocks) {
      p = tray_malloc(kBlockBytes);
      ASSERT_NE(p, nullptr);
      *static_cast<char*>(p) = 1;
    }
    for (void* p : blocks) tray_free(p);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Twice the dirty floor: the pool's limit on dirty units alone would purge most of it at once.
constexpr size_t kSwingBurstBytes = 2 * tray::kDirtyFloorBytes;
constexpr auto kHoldWindow = std::chrono::milliseconds(tray::kPoolHoldWindowMs);

uint64_t released_since(uint64_t before) { return tray_test::stats_now().released_bytes - before; }

// Frees a burst the pool's limit alone would purge, then takes and returns pages for three
// quiet times, longer than the purge delay.
void free_a_burst_then_stay_busy() {
  ASSERT_NO_FATAL_FAILURE(small_block_burst(kSwingBurstBytes));
  const auto busy_until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(3 * tray::kPoolQuietMs);
  ASSERT_NO_FATAL_FAILURE(
      take_and_return_pages_until([&] { return std::chrono::steady_clock::now() >= busy_until; }));
}

// Pages freed while the program keeps using the pool stay for it to take again, however long
// they have been free, up to what its pages were a moment ago; once it goes quiet, they go
// back to the OS within half the window (the burst's peak would only age out 2.4 s after the
// busy part, so a hold that ignored quietness would fail).
TEST(Rss, PagesFreedWhileBusyStayUntilTheProgramGoesQuiet) {
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  const uint64_t released_before = tray_test::stats_now().released_bytes;
  ASSERT_NO_FATAL_FAILURE(free_a_burst_then_stay_busy());
  EXPECT_LT(released_since(released_before), kSwingBurstBytes / 4)
      << "pages freed " << 3 * tray::kPoolQuietMs << " ms ago went back while the program was busy";

  const auto quiet_since = std::chrono::steady_clock::now();
  while (released_since(released_before) < kSwingBurstBytes / 2 &&
         std::chrono::steady_clock::now() < quiet_since + kHoldWindow / 2)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(released_since(released_before), kSwingBurstBytes / 2)
      << "the freed pages were still held " << tray::kPoolHoldWindowMs / 2
      << " ms after the last call";
}

// What is held goes back at once on a trim.
TEST(Rss, TrimGivesBackWhatIsHeldForABusyProgram) {
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  const uint64_t released_before = tray_test::stats_now().released_bytes;
  ASSERT_NO_FATAL_FAILURE(free_a_burst_then_stay_busy());
  ASSERT_LT(released_since(released_before), kSwingBurstBytes / 4) << "nothing was held";
  EXPECT_EQ(tray_trim(), 1);
  EXPECT_GE(released_since(released_before), kSwingBurstBytes / 2);
}

// Large blocks count in what the program holds: pages held for a phase of small blocks go when
// large ones take their place, at the large allocation itself (held, they would add to the
// peak of a phase of large blocks).
TEST(Rss, PagesHeldForABusyProgramGoWhenLargeBlocksTakeTheirPlace) {
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  const uint64_t released_before = tray_test::stats_now().released_bytes;
  ASSERT_NO_FATAL_FAILURE(free_a_burst_then_stay_busy());
  ASSERT_LT(released_since(released_before), kSwingBurstBytes / 4) << "nothing was held";
  std::vector<void*> large;
  for (size_t bytes = 0; bytes <= kSwingBurstBytes; bytes += kLargeBlockBytes) {
    large.push_back(tray_malloc(kLargeBlockBytes));  // untouched: only the count matters
    ASSERT_NE(large.back(), nullptr);
  }
  const uint64_t released = released_since(released_before);
  for (void* p : large) tray_free(p);
  EXPECT_GE(released, kSwingBurstBytes / 2) << "pages stayed held beside the large blocks";
}

// Large blocks cut from memory that is already resident (a span chunk's free pages) add
// nothing to what the program holds, and the pool purges none of what it holds for them.
// Counting their live bytes instead, each such byte counted as new memory, and the pool gave
// back as much as they took, for the next phase of small blocks to fault in again. In a child
// without the purger, so that nothing but the allocations themselves could purge.
TEST(Rss, SpansCutFromResidentPagesPurgeNothingThePoolHolds) {
  if (tray::os::page_size() != tray::kOsPageBytes) GTEST_SKIP() << "spans need 4 KiB pages";
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (tray_option_set("purge_thread", "0") != 0) _exit(2);
    // Three fill a chunk (runs of 320 pages, a rounded length); one of each three stays, so
    // that the pool cannot take the chunk.
    const size_t span_bytes = 320 * 4096 - 64;
    std::vector<void*> spans(3 * (kSwingBurstBytes / 4 / tray::kSegmentBytes));
    for (void*& p : spans) p = tray_malloc(span_bytes);
    for (size_t i = 0; i < spans.size(); ++i)
      if (i % 3 != 0) tray_free(spans[i]);  // under the spans' limit: their pages stay resident
    small_block_burst(kSwingBurstBytes);  // the pool holds the pages, freed just now
    const uint64_t released_before = tray_test::stats_now().released_bytes;
    for (size_t i = 0; i < spans.size(); ++i)
      if (i % 3 != 0) spans[i] = tray_malloc(span_bytes);
    const uint64_t released = tray_test::stats_now().released_bytes - released_before;
    for (void* p : spans) tray_free(p);
    _exit(released < tray::kSegmentBytes ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the pool purged what it held while spans reused resident pages";
}

// A program that stays busy but smaller does not keep its old peak's pages past the window.
TEST(Rss, PagesFreedWhileBusyGoBackOnceThePeakIsAWindowOld) {
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  const uint64_t released_before = tray_test::stats_now().released_bytes;
  ASSERT_NO_FATAL_FAILURE(small_block_burst(kSwingBurstBytes));
  const auto give_up_at = std::chrono::steady_clock::now() + 2 * kHoldWindow;
  ASSERT_NO_FATAL_FAILURE(take_and_return_pages_until([&] {
    return released_since(released_before) >= kSwingBurstBytes / 2 ||
           std::chrono::steady_clock::now() >= give_up_at;
  }));
  EXPECT_GE(released_since(released_before), kSwingBurstBytes / 2)
      << "a busy program kept its old peak's pages for twice the hold window";
}

// The child of a fork has no purger thread: it must start its own.
TEST(Rss, ForkedChildReturnsMemoryWhenIdle) {
  if (tray_test::kThreadSanitizer) GTEST_SKIP() << "TSan kills a forked child that starts a thread";
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  ASSERT_NO_FATAL_FAILURE(small_block_burst(tray::kHeapRetainedBytes * 8));  // starts the purger
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const uint64_t released_before = tray_test::stats_now().released_bytes;
    small_block_burst(tray::kDirtyFloorBytes / 2);  // as above: only the purger gives it back
    std::this_thread::sleep_for(kIdleWait);
    const uint64_t released = tray_test::stats_now().released_bytes - released_before;
    _exit(released >= tray::kDirtyFloorBytes / 4 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child kept its freed pages";
}

// A second burst reuses the memory of the first; tray_trim then gives back what is still
// held, including pages freed too recently to have been purged yet.
TEST(Rss, SmallBlocksAreReturnedByTrim) {
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  const size_t before = tray_test::resident_bytes();
  ASSERT_NO_FATAL_FAILURE(small_block_burst(kSmallBurstBytes));
  ASSERT_NO_FATAL_FAILURE(small_block_burst(kSmallBurstBytes));
  EXPECT_EQ(tray_trim(), 1);
  const size_t after = tray_test::resident_bytes();
  if (tray_test::kResidentBoundsHold) {
    EXPECT_LE(after, before + tray_test::rss_slack(before))
        << "resident before " << before / kMiB << " MiB, after " << after / kMiB << " MiB";
  }
}

TEST(Rss, LargeBlocksAreReturnedByTrim) {
  ASSERT_NO_FATAL_FAILURE(warm_up_every_class());
  const size_t large_bytes_before = tray_test::stats_now().large.live_bytes;
  const size_t before = tray_test::resident_bytes();
  void* blocks[kLargeBlockCount];
  for (void*& p : blocks) {
    p = tray_malloc(kLargeBlockBytes);
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x77, kLargeBlockBytes);
  }
  for (void* p : blocks) tray_free(p);
  tray_trim();
  const size_t after = tray_test::resident_bytes();

  EXPECT_EQ(tray_test::stats_now().large.live_bytes, large_bytes_before);
  if (tray_test::kResidentBoundsHold) {
    EXPECT_LE(after, before + tray_test::rss_slack(before))
        << "resident before " << before / kMiB << " MiB, after " << after / kMiB << " MiB";
  }
}

}  // namespace
