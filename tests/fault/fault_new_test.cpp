// operator new with traymalloc linked in (libtraymalloc.a) when the OS refuses memory: every
// throwing form throws std::bad_alloc, every nothrow form returns nullptr, and both work
// again once the OS does.
#include <gtest/gtest.h>

#include <cstddef>
#include <new>

#include "platform/os.hpp"
#include "traymalloc.h"

namespace {

namespace os = tray::os;
constexpr size_t kBig = size_t{16} << 20;  // a large block: needs an mmap of its own

// Arms persistent mmap failures for its scope, from an empty large-block cache (which would
// serve a block without an mmap).
struct NoMmap {
  NoMmap() {
    tray_trim();
    os::inject_faults(os::kFaultMmap, 1, UINT64_MAX / 2);
  }
  ~NoMmap() { os::inject_faults(0, 0, 0); }
};

TEST(FaultNew, ThrowingFormsThrowBadAlloc) {
  {
    NoMmap guard;
    EXPECT_THROW((void)operator new(kBig), std::bad_alloc);
    EXPECT_THROW((void)operator new[](kBig), std::bad_alloc);
    EXPECT_THROW((void)operator new(kBig, std::align_val_t{1 << 20}), std::bad_alloc);
    EXPECT_THROW((void)operator new[](kBig, std::align_val_t{1 << 20}), std::bad_alloc);
    EXPECT_GE(os::faults_injected(), 4u);
  }
  void* p = operator new(kBig);
  operator delete(p);
}

TEST(FaultNew, NothrowFormsReturnNull) {
  {
    NoMmap guard;
    EXPECT_EQ(operator new(kBig, std::nothrow), nullptr);
    EXPECT_EQ(operator new[](kBig, std::nothrow), nullptr);
    EXPECT_EQ(operator new(kBig, std::align_val_t{1 << 20}, std::nothrow), nullptr);
    EXPECT_EQ(operator new[](kBig, std::align_val_t{1 << 20}, std::nothrow), nullptr);
  }
  void* p = operator new(kBig, std::nothrow);
  EXPECT_NE(p, nullptr);
  operator delete(p);
}

// The new-handler runs on failure, and a handler that frees memory (here: the OS works
// again) lets operator new succeed.
TEST(FaultNew, NewHandlerRunsAndRetries) {
  static int calls = 0;
  std::set_new_handler([] {
    ++calls;
    os::inject_faults(0, 0, 0);
  });
  void* p;
  {
    NoMmap guard;
    p = operator new(kBig);
  }
  std::set_new_handler(nullptr);
  EXPECT_EQ(calls, 1);
  EXPECT_NE(p, nullptr);
  operator delete(p);
}

}  // namespace
