// Every replaceable form of operator new and delete in a program linked against
// libtraymalloc.so: ours, aligned as asked, given back, and failing the way the standard says
// (new-handler loop, std::bad_alloc, nullptr for the nothrow forms).
#include <sys/resource.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include <gtest/gtest.h>

#include "override_support.hpp"
#include "traymalloc.h"

namespace {

using tray_test::is_aligned;

// Above the small classes, so each block is a mapping of its own that bytes_large tracks:
// a delete that did not free would leave it counted.
constexpr size_t kLargeBytes = size_t{1} << 20;
constexpr size_t kImpossibleBytes = SIZE_MAX / 2;
constexpr std::align_val_t kCacheLine{64};
constexpr std::align_val_t kFourMiB{size_t{4} << 20};

size_t live_large_bytes() {
  tray_stats s{TRAY_STATS_VERSION};
  return tray_stats_get(&s) == 0 ? s.large.live_bytes : SIZE_MAX;
}

// Runs allocate() then release() on one large block and checks that the block was ours,
// aligned, writable and given back.
template <typename Allocate, typename Release>
void expect_ours_and_released(Allocate allocate, Release release, size_t alignment) {
  const size_t before = live_large_bytes();
  void* p = allocate();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(tray_owns(p), 1);
  EXPECT_TRUE(is_aligned(p, alignment)) << p;
  EXPECT_GE(live_large_bytes(), before + kLargeBytes);
  std::memset(p, 0x3C, kLargeBytes);
  release(p);
  EXPECT_EQ(live_large_bytes(), before);
}

TEST(Symbols, OperatorNewAndDeleteResolveToTraymalloc) {
  for (const char* name :
       {"_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t",
        "_ZnamSt11align_val_t", "_ZnwmSt11align_val_tRKSt9nothrow_t",
        "_ZnamSt11align_val_tRKSt9nothrow_t", "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm",
        "_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t", "_ZdlPvSt11align_val_t",
        "_ZdaPvSt11align_val_t", "_ZdlPvmSt11align_val_t", "_ZdaPvmSt11align_val_t",
        "_ZdlPvSt11align_val_tRKSt9nothrow_t", "_ZdaPvSt11align_val_tRKSt9nothrow_t"}) {
    EXPECT_NE(tray_test::defining_object(name).find("libtraymalloc.so"), std::string::npos)
        << name << " comes from '" << tray_test::defining_object(name) << "'";
  }
}

TEST(OperatorNew, PlainAndArrayFormsWithEveryDelete) {
  expect_ours_and_released([] { return ::operator new(kLargeBytes); },
                           [](void* p) { ::operator delete(p); }, 16);
  expect_ours_and_released([] { return ::operator new[](kLargeBytes); },
                           [](void* p) { ::operator delete[](p); }, 16);
  expect_ours_and_released([] { return ::operator new(kLargeBytes); },
                           [](void* p) { ::operator delete(p, kLargeBytes); }, 16);
  expect_ours_and_released([] { return ::operator new[](kLargeBytes); },
                           [](void* p) { ::operator delete[](p, kLargeBytes); }, 16);
}

TEST(OperatorNew, NothrowForms) {
  expect_ours_and_released([] { return ::operator new(kLargeBytes, std::nothrow); },
                           [](void* p) { ::operator delete(p, std::nothrow); }, 16);
  expect_ours_and_released([] { return ::operator new[](kLargeBytes, std::nothrow); },
                           [](void* p) { ::operator delete[](p, std::nothrow); }, 16);
}

TEST(OperatorNew, AlignedForms) {
  for (std::align_val_t alignment : {kCacheLine, kFourMiB}) {
    const size_t a = static_cast<size_t>(alignment);
    expect_ours_and_released([=] { return ::operator new(kLargeBytes, alignment); },
                             [=](void* p) { ::operator delete(p, alignment); }, a);
    expect_ours_and_released([=] { return ::operator new[](kLargeBytes, alignment); },
                             [=](void* p) { ::operator delete[](p, alignment); }, a);
    expect_ours_and_released([=] { return ::operator new(kLargeBytes, alignment); },
                             [=](void* p) { ::operator delete(p, kLargeBytes, alignment); }, a);
    expect_ours_and_released([=] { return ::operator new[](kLargeBytes, alignment); },
                             [=](void* p) { ::operator delete[](p, kLargeBytes, alignment); }, a);
    expect_ours_and_released(
        [=] { return ::operator new(kLargeBytes, alignment, std::nothrow); },
        [=](void* p) { ::operator delete(p, alignment, std::nothrow); }, a);
    expect_ours_and_released(
        [=] { return ::operator new[](kLargeBytes, alignment, std::nothrow); },
        [=](void* p) { ::operator delete[](p, alignment, std::nothrow); }, a);
  }
}

TEST(OperatorNew, SmallAlignedBlocksAreAlignedAndOurs) {
  for (size_t a = 32; a <= 4096; a *= 2) {
    for (size_t size : {size_t{1}, a - 1, 3 * a}) {
      void* p = ::operator new(size, std::align_val_t{a});
      EXPECT_TRUE(is_aligned(p, a)) << a << " " << size;
      EXPECT_EQ(tray_owns(p), 1);
      ::operator delete(p, size, std::align_val_t{a});
    }
  }
}

TEST(OperatorNew, ZeroBytesGivesDistinctBlocks) {
  void* a = ::operator new(0);
  void* b = ::operator new(0);
  EXPECT_NE(a, b);
  EXPECT_EQ(tray_owns(a), 1);
  EXPECT_EQ(tray_owns(b), 1);
  ::operator delete(a);
  ::operator delete(b);
}

TEST(OperatorNew, NewExpressionsUseTraymalloc) {
  auto* text = new std::string(1000, 'x');
  EXPECT_EQ(tray_owns(text), 1);
  EXPECT_EQ(tray_owns(text->data()), 1);
  delete text;
  struct alignas(256) Aligned {
    unsigned char bytes[256];
  };
  auto* array = new Aligned[5];
  EXPECT_TRUE(is_aligned(array, 256));
  EXPECT_EQ(tray_owns(array), 1);
  delete[] array;
}

TEST(OperatorNew, ImpossibleSizeThrowsBadAlloc) {
  ASSERT_EQ(std::get_new_handler(), nullptr);
  EXPECT_THROW((void)::operator new(kImpossibleBytes), std::bad_alloc);
  EXPECT_THROW((void)::operator new[](kImpossibleBytes), std::bad_alloc);
  EXPECT_THROW((void)::operator new(kImpossibleBytes, kCacheLine), std::bad_alloc);
  EXPECT_THROW((void)::operator new[](kImpossibleBytes, kFourMiB), std::bad_alloc);
}

TEST(OperatorNew, NothrowImpossibleSizeReturnsNull) {
  EXPECT_EQ(::operator new(kImpossibleBytes, std::nothrow), nullptr);
  EXPECT_EQ(::operator new[](kImpossibleBytes, std::nothrow), nullptr);
  EXPECT_EQ(::operator new(kImpossibleBytes, kCacheLine, std::nothrow), nullptr);
  EXPECT_EQ(::operator new[](kImpossibleBytes, kFourMiB, std::nothrow), nullptr);
}

// A handler that lets the allocation be retried twice, then gives up by uninstalling itself:
// operator new must call it after every failure and throw once there is no handler.
int g_handler_calls = 0;
void give_up_on_third_call() {
  if (++g_handler_calls == 3) std::set_new_handler(nullptr);
}

TEST(NewHandler, IsCalledAfterEachFailureUntilUninstalled) {
  g_handler_calls = 0;
  std::set_new_handler(give_up_on_third_call);
  EXPECT_THROW((void)::operator new(kImpossibleBytes), std::bad_alloc);
  EXPECT_EQ(g_handler_calls, 3);
  EXPECT_EQ(std::get_new_handler(), nullptr);

  g_handler_calls = 0;
  std::set_new_handler(give_up_on_third_call);
  EXPECT_THROW((void)::operator new(kImpossibleBytes, kFourMiB), std::bad_alloc);
  EXPECT_EQ(g_handler_calls, 3);
}

// A handler that throws: the nothrow forms must turn that into nullptr.
void throw_bad_alloc() {
  ++g_handler_calls;
  throw std::bad_alloc();
}

TEST(NewHandler, ThrowingHandlerMakesNothrowNewReturnNull) {
  g_handler_calls = 0;
  std::set_new_handler(throw_bad_alloc);
  EXPECT_EQ(::operator new(kImpossibleBytes, std::nothrow), nullptr);
  EXPECT_EQ(::operator new[](kImpossibleBytes, kCacheLine, std::nothrow), nullptr);
  EXPECT_EQ(g_handler_calls, 2);
  std::set_new_handler(nullptr);
}

// The classic use of a new-handler: free a reserve so that the retry succeeds. The address
// space limit leaves room for one block besides what the process holds, so the second block
// fits only once the handler has freed the first (the reserve).
constexpr size_t kReserveBytes = size_t{64} << 20;
void* g_reserve = nullptr;

void release_reserve() {
  ++g_handler_calls;
  ::operator delete(g_reserve);
  g_reserve = nullptr;
  std::set_new_handler(nullptr);  // a second failure must throw, not loop
}

size_t address_space_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  return pages * size_t(sysconf(_SC_PAGESIZE));
}

// Runs in a child process (the limit must not outlive it); the exit status says what failed.
[[noreturn]] void allocate_after_the_handler_releases_the_reserve() {
  const rlimit limit{address_space_bytes() + kReserveBytes * 3 / 2, RLIM_INFINITY};
  if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(2);
  g_reserve = ::operator new(kReserveBytes, std::nothrow);
  if (g_reserve == nullptr) _exit(3);
  g_handler_calls = 0;
  std::set_new_handler(release_reserve);
  void* p = nullptr;
  try {
    p = ::operator new(kReserveBytes);
  } catch (const std::bad_alloc&) {
    _exit(4);
  }
  if (g_handler_calls != 1) _exit(5);
  if (tray_owns(p) != 1) _exit(6);
  _exit(0);
}

TEST(NewHandler, RetrySucceedsOnceTheHandlerFreesAReserve) {
  EXPECT_EXIT(allocate_after_the_handler_releases_the_reserve(), testing::ExitedWithCode(0), "");
}

}  // namespace
