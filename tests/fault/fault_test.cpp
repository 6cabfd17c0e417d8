// Out of memory, on demand: the platform layer's fault injection makes the Nth mmap, mremap or
// madvise fail, and a sweep over N runs a workload that needs each of them (new segments,
// large blocks, aligned blocks, realloc that grows and moves mappings, purges, trim). Every
// failure must surface as NULL with errno ENOMEM (posix_memalign: its result too), blocks
// allocated before must not change, no lock may stay held, and the same workload must
// succeed in full once the system calls work again.
#include <errno.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "platform/os.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::kMiB;
namespace os = tray::os;

constexpr unsigned kAllCalls = os::kFaultMmap | os::kFaultMremap | os::kFaultMadvise;
constexpr uint64_t kForever = UINT64_MAX / 2;

// Each 4 KiB page of a block holds its own byte, so a page lost or shared shows.
struct Block {
  unsigned char* p = nullptr;
  size_t size = 0;
  unsigned char seed = 0;
};

unsigned char page_byte(const Block& b, size_t offset) {
  return static_cast<unsigned char>(b.seed + 1 + (offset >> 12) * 7);
}

void fill(const Block& b) {
  for (size_t o = 0; o < b.size; o += 4096) memset(b.p + o, page_byte(b, o), std::min<size_t>(4096, b.size - o));
}

// n bytes all equal to `value` (comparing the range with itself shifted by one byte).
bool all_bytes(const unsigned char* p, size_t n, unsigned char value) {
  return n == 0 || (p[0] == value && memcmp(p, p + 1, n - 1) == 0);
}

bool intact(const Block& b) {
  for (size_t o = 0; o < b.size; o += 4096)
    if (!all_bytes(b.p + o, std::min<size_t>(4096, b.size - o), page_byte(b, o))) return false;
  return true;
}

bool zero(const unsigned char* p, size_t size) { return all_bytes(p, size, 0); }

// Runs the workload's allocations and records what a failure looked like.
class Workload {
 public:
  ~Workload() { release(); }

  // errno must be set to ENOMEM by any call that returns NULL.
  void keep(void* p, size_t size, int error) {
    ++calls_;
    if (p == nullptr) {
      ++failures_;
      EXPECT_EQ(error, ENOMEM) << "a failed allocation of " << size << " bytes";
      return;
    }
    Block b{static_cast<unsigned char*>(p), size, static_cast<unsigned char>(blocks_.size())};
    EXPECT_GE(tray_usable_size(p), size);
    fill(b);
    blocks_.push_back(b);
  }

  void malloc_n(size_t size, int count) {
    for (int i = 0; i < count; ++i) {
      errno = 0;
      void* p = tray_malloc(size);
      keep(p, size, errno);
    }
  }

  void calloc_checked(size_t count, size_t size) {
    errno = 0;
    auto* p = static_cast<unsigned char*>(tray_calloc(count, size));
    const int error = errno;
    if (p != nullptr) {
      EXPECT_TRUE(zero(p, count * size)) << "calloc(" << count << ", " << size << ")";
    }
    keep(p, count * size, error);
  }

  void aligned(size_t alignment, size_t size) {
    errno = 0;
    void* a = tray_aligned_alloc(alignment, size);
    const int error_a = errno;
    if (a != nullptr) { EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % alignment, 0u); }
    keep(a, size, error_a);
    errno = 0;
    void* m = tray_memalign(alignment, size);
    const int error_m = errno;
    if (m != nullptr) { EXPECT_EQ(reinterpret_cast<uintptr_t>(m) % alignment, 0u); }
    keep(m, size, error_m);
    void* untouched = &calls_;
    void* out = untouched;
    errno = 0;
    const int result = tray_posix_memalign(&out, alignment, size);
    if (result != 0) {
      EXPECT_EQ(result, ENOMEM);
      EXPECT_EQ(errno, ENOMEM) << "posix_memalign out of memory left errno as glibc does not";
      EXPECT_EQ(out, untouched) << "posix_memalign changed *out on failure";
      keep(nullptr, size, ENOMEM);
    } else {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(out) % alignment, 0u);
      keep(out, size, 0);
    }
  }

  // Resizes the newest block; on failure it must be left as it was.
  void realloc_last(size_t size) {
    if (blocks_.empty()) return;
    Block& b = blocks_.back();
    ++calls_;
    errno = 0;
    void* p = tray_realloc(b.p, size);
    if (p == nullptr) {
      ++failures_;
      EXPECT_EQ(errno, ENOMEM) << "a failed realloc to " << size << " bytes";
      EXPECT_TRUE(intact(b)) << "a failed realloc changed the block";
      return;
    }
    b.p = static_cast<unsigned char*>(p);
    const size_t kept = std::min(b.size, size);
    b.size = kept;
    EXPECT_TRUE(intact(b)) << "realloc to " << size << " lost the contents";
    b.size = size;
    fill(b);
  }

  void free_every_other() {
    std::vector<Block> kept;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      EXPECT_TRUE(intact(blocks_[i]));
      if (i % 2 == 0) tray_free(blocks_[i].p);
      else kept.push_back(blocks_[i]);
    }
    blocks_ = kept;
  }

  // A cached large mapping reused for a smaller block gives back its tail; if that purge is
  // refused the tail still holds old bytes, which a later calloc must not take for zeros.
  // From an empty cache, so that each step reuses the one mapping.
  void reuse_large_for_calloc() {
    tray_trim();
    malloc_n(3 * kMiB, 1);
    for (size_t size : {size_t{1} * kMiB, size_t{3} * kMiB}) {
      if (blocks_.empty() || blocks_.back().size == size) return;
      tray_free(blocks_.back().p);
      blocks_.pop_back();
      calloc_checked(1, size);
    }
  }

  void release() {
    for (const Block& b : blocks_) {
      EXPECT_TRUE(intact(b)) << "a block of " << b.size << " bytes changed";
      tray_free(b.p);
    }
    blocks_.clear();
  }

  int calls() const { return calls_; }
  int failures() const { return failures_; }

 private:
  std::vector<Block> blocks_;
  int calls_ = 0;
  int failures_ = 0;
};

// Every kind of memory the allocator asks the OS for, from empty caches.
void run_workload(Workload& w) {
  for (size_t size : {size_t{16}, size_t{100}, size_t{1000}, size_t{4000}, size_t{20000},
                      size_t{70000}, size_t{128} << 10})
    w.malloc_n(size, 40);
  w.calloc_checked(1, 3 * kMiB);
  w.calloc_checked(8, 100000);
  w.aligned(4096, 5000);
  w.aligned(2 * kMiB, 1 * kMiB);
  w.aligned(8 * kMiB, 100);
  w.malloc_n(6 * kMiB, 1);
  w.realloc_last(20 * kMiB);  // grows the mapping: mremap in place or moved
  w.realloc_last(1 * kMiB);   // shrinks it: the tail is purged
  w.realloc_last(300);        // into the small classes
  w.free_every_other();
  w.reuse_large_for_calloc();
  w.malloc_n(5 * kMiB, 2);
  tray_trim();
}

// Allocation from a thread of its own must finish: a lock left held would hang it.
bool other_thread_allocates() {
  std::atomic<bool> done{false};
  std::thread t([&done] {
    for (size_t size : {size_t{24}, size_t{3000}, size_t{100000}, 5 * kMiB}) {
      void* p = tray_malloc(size);
      if (p == nullptr) return;
      memset(p, 1, size);
      tray_free(p);
    }
    tray_trim();
    done.store(true);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!done.load()) {
    fprintf(stderr, "fault_test: another thread could not allocate: a lock stays held\n");
    std::_Exit(1);  // joining would hang
  }
  t.join();
  return true;
}

std::vector<Block> allocate_before() {
  std::vector<Block> before;
  unsigned char seed = 100;
  for (size_t size : {size_t{40}, size_t{5000}, size_t{90000}, 3 * kMiB}) {
    Block b{static_cast<unsigned char*>(tray_malloc(size)), size, seed++};
    fill(b);
    before.push_back(b);
  }
  return before;
}

struct SweepResult {
  uint64_t points = 0;     // values of N tried
  uint64_t injected = 0;   // system calls failed
  uint64_t surfaced = 0;   // allocation calls that returned NULL
};

// Fails the Nth call of the armed kinds (and `count` - 1 after it) for each N up to past the
// number of calls one clean run makes.
void sweep_into(unsigned kinds, uint64_t count, SweepResult* out) {
  SweepResult& result = *out;
  std::vector<Block> before = allocate_before();
  tray_trim();
  os::inject_faults(kinds, kForever, 1);  // counts, fails nothing
  {
    Workload clean;
    run_workload(clean);
    EXPECT_EQ(clean.failures(), 0);
  }
  const uint64_t calls = os::fault_calls_counted();
  os::inject_faults(0, 0, 0);
  EXPECT_GT(calls, 0u) << "the workload should need the OS";
  const uint64_t stride = tray_test::kThreadSanitizer ? 4 : 1;  // TSan: every fourth point
  for (uint64_t n = 1; n <= calls + 2; n += stride) {
    tray_trim();
    {
      Workload w;
      os::inject_faults(kinds, n, count);
      run_workload(w);
      result.injected += os::faults_injected();
      os::inject_faults(0, 0, 0);
      result.surfaced += uint64_t(w.failures());
      ++result.points;
    }
    for (const Block& b : before) ASSERT_TRUE(intact(b)) << "a block allocated before changed, N=" << n;
    ASSERT_TRUE(other_thread_allocates());
    Workload again;
    run_workload(again);
    ASSERT_EQ(again.failures(), 0) << "allocation still fails once the OS works again, N=" << n;
  }
  for (const Block& b : before) tray_free(b.p);
}

SweepResult sweep(unsigned kinds, uint64_t count) {
  SweepResult result;
  sweep_into(kinds, count, &result);
  return result;
}

TEST(FaultInjection, EachSingleFailureSurfacesOrIsAbsorbed) {
  const SweepResult r = sweep(kAllCalls, 1);
  printf("single failures: %llu points, %llu calls failed, %llu allocations returned NULL\n",
         (unsigned long long)r.points, (unsigned long long)r.injected, (unsigned long long)r.surfaced);
  EXPECT_GE(r.injected, r.points / 2) << "most points up to the clean run's count fail a call";
  EXPECT_GT(r.surfaced, 0u) << "a refused mmap must reach the caller";
}

TEST(FaultInjection, OutOfMemoryFromTheNthCallOn) {
  const SweepResult r = sweep(kAllCalls, kForever);
  printf("persistent failures: %llu points, %llu calls failed, %llu allocations returned NULL\n",
         (unsigned long long)r.points, (unsigned long long)r.injected, (unsigned long long)r.surfaced);
  EXPECT_GT(r.surfaced, r.points) << "with the OS refusing everything, allocations must fail";
}

// A refused purge leaves old bytes in a cached large mapping: calloc from it must still be
// zero (madvise alone failing, at each point of the workload).
TEST(FaultInjection, RefusedPurgesKeepCallocZero) {
  const SweepResult r = sweep(os::kFaultMadvise, kForever);
  EXPECT_GT(r.injected, 0u);
  EXPECT_EQ(r.surfaced, 0u) << "a refused madvise is no reason to fail an allocation";
}

// grow_reservation moves a mapping with mremap; the chunk map entries of the old range were
// once cleared after the move, when another thread could already have mapped a block there:
// that block then read as not ours (usable size 0).
TEST(LargeMoves, OtherThreadsBlocksStayMapped) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> lost{0};
  std::thread mover([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      void* p = tray_malloc(5 * kMiB);
      for (size_t size : {13 * kMiB, 30 * kMiB, 45 * kMiB}) {
        void* q = tray_realloc(p, size);
        if (q != nullptr) p = q;
      }
      tray_free(p);
    }
  });
  std::vector<std::thread> checkers;
  for (int t = 0; t < 3; ++t) {
    checkers.emplace_back([&, t] {
      size_t size = (4 + size_t(t)) * kMiB;
      while (!stop.load(std::memory_order_relaxed)) {
        void* p = tray_malloc(size);
        if (p == nullptr || tray_usable_size(p) < size || !tray_owns(p)) lost.fetch_add(1);
        tray_free(p);
        size = size % (12 * kMiB) + kMiB;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(tray_test::kSanitized ? 4 : 2));
  stop.store(true);
  mover.join();
  for (auto& t : checkers) t.join();
  EXPECT_EQ(lost.load(), 0u);
}

}  // namespace
