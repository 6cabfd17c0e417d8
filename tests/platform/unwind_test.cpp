// The heap profile's unwinder (platform/unwind.cpp) against glibc's backtrace(), which asks
// libgcc: the same return addresses, frame for frame and to the end of the stack, through
// frameless frames, frames that hang from rbp (alloca), deep recursion, another thread's
// stack, and the second walk that the cache answers; where the cache gives a frame to libgcc
// (a signal handler's frame, a frame too large to encode), os::capture_stack still gives
// backtrace()'s stack. Where unwind.cpp has no rules (machines other than x86-64, a glibc
// before 2.35), every walk gives up and capture_stack gives backtrace()'s stack: the same
// tests then check capture_stack's.
#include <alloca.h>
#include <execinfo.h>
#include <link.h>
#include <signal.h>

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "platform/os.hpp"
#include "platform/unwind.hpp"

namespace {

constexpr int kMaxFrames = 128;
#if defined(__x86_64__) && defined(DLFO_STRUCT_HAS_EH_DBASE)
constexpr bool kOwnWalk = true;
#else
constexpr bool kOwnWalk = false;
#endif

struct Stacks {
  void* ours[kMaxFrames];
  void* theirs[kMaxFrames];
  int ours_count = 0;
  int theirs_count = 0;
  void* caller = nullptr;  // the return address of take_both or take_capture
};

// Both stacks from one function: the first frame of each lies in it (at two call sites), and
// from its caller on they must agree.
__attribute__((noinline)) void take_both(Stacks* s) {
  s->caller = __builtin_return_address(0);
  if (!kOwnWalk) tray::os::prepare_backtrace();  // capture_stack gives nothing before it
  s->ours_count = kOwnWalk ? tray::os::unwind_stack(s->ours, kMaxFrames)
                           : tray::os::capture_stack(s->ours, kMaxFrames);
  s->theirs_count = backtrace(s->theirs, kMaxFrames);
  asm volatile("" ::: "memory");  // no tail call: this frame stays
}

// The same through capture_stack, whose first frame lies in capture_stack itself (the test
// links the allocator in, so its frames are kept).
__attribute__((noinline)) void take_capture(Stacks* s) {
  s->caller = __builtin_return_address(0);
  s->ours_count = tray::os::capture_stack(s->ours, kMaxFrames - 8);
  s->theirs_count = backtrace(s->theirs, kMaxFrames);
  asm volatile("" ::: "memory");
}

// From the caller of take_both or take_capture on. The frames before it differ: capture_stack's
// own, and the sanitizers' interceptor of backtrace().
int index_of(const void* const* frames, int count, const void* address) {
  for (int i = 0; i < count && i < 4; ++i)
    if (frames[i] == address) return i;
  return -1;
}

void expect_same(const Stacks& s) {
  const int ours_first = index_of(s.ours, s.ours_count, s.caller);
  const int theirs_first = index_of(s.theirs, s.theirs_count, s.caller);
  ASSERT_GE(ours_first, 0) << "the walk gave up or missed the caller";
  ASSERT_GE(theirs_first, 0) << "backtrace() missed the caller";
  ASSERT_GT(s.ours_count - ours_first, 3);
  const int ours_left = s.ours_count - ours_first, theirs_left = s.theirs_count - theirs_first;
  if (s.ours_count < kMaxFrames && s.theirs_count < kMaxFrames) {
    ASSERT_EQ(ours_left, theirs_left);
  }
  for (int i = 0; i < ours_left && i < theirs_left; ++i)
    EXPECT_EQ(s.ours[ours_first + i], s.theirs[theirs_first + i]) << "frame " << i;
}

__attribute__((noinline)) int recurse(int depth, Stacks* s) {
  volatile char pad[48];
  pad[0] = char(depth);
  if (depth == 0) {
    take_both(s);
    return pad[0];
  }
  return recurse(depth - 1, s) + pad[0];  // not a tail call
}

#if defined(__x86_64__)
// Calls fn(arg) with rbp saved (as the call-frame information says) and then set to 0, as a
// frameless function that uses rbp as a plain register does: the walk must take rbp back
// from its slot to find a frame above that hangs from rbp.
extern "C" void unwind_test_zero_rbp(void (*fn)(Stacks*), Stacks* arg);
asm(R"(
  .text
  .p2align 4
  .type unwind_test_zero_rbp, @function
unwind_test_zero_rbp:
  .cfi_startproc
  pushq %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset %rbp, -16
  movq %rdi, %rax
  movq %rsi, %rdi
  xorl %ebp, %ebp
  call *%rax
  popq %rbp
  .cfi_def_cfa_offset 8
  ret
  .cfi_endproc
  .size unwind_test_zero_rbp, .-unwind_test_zero_rbp
)");
#else
void unwind_test_zero_rbp(void (*fn)(Stacks*), Stacks* arg) { fn(arg); }
#endif

// alloca makes the compiler address the frame from rbp: the CFA hangs from rbp here.
__attribute__((noinline)) int with_alloca(size_t bytes, Stacks* s) {
  auto* p = static_cast<volatile char*>(alloca(bytes));
  p[0] = 1;
  p[bytes - 1] = 2;
  unwind_test_zero_rbp(take_both, s);
  return p[0] + p[bytes - 1];
}

__attribute__((noinline)) int with_big_frame(Stacks* s) {
  volatile char big[200000];
  big[0] = 1;
  big[sizeof big - 1] = 2;
  take_capture(s);
  return big[0] + big[sizeof big - 1];
}

TEST(Unwind, SameStackAsBacktraceFirstAndCachedWalks) {
  for (int walk = 0; walk < 3; ++walk) {
    Stacks s;
    take_both(&s);
    expect_same(s);
  }
}

TEST(Unwind, GivesUpWhereItHasNoRules) {
  if (kOwnWalk) GTEST_SKIP() << "this machine has the walk's rules";
  void* frames[8];
  EXPECT_EQ(tray::os::unwind_stack(frames, 8), -1);
}

TEST(Unwind, DeepRecursion) {
  for (int walk = 0; walk < 2; ++walk) {
    Stacks s;
    recurse(150, &s);
    expect_same(s);
    EXPECT_EQ(s.ours_count, kMaxFrames);  // cut at the capacity, like backtrace
  }
}

TEST(Unwind, FramesFromRbpOfDifferentSizes) {
  for (size_t bytes : {16, 1000, 5000, 16}) {
    Stacks s;
    with_alloca(bytes, &s);
    expect_same(s);
  }
}

TEST(Unwind, AnotherThreadsStackToItsEnd) {
  Stacks s;
  std::thread([&] { recurse(5, &s); }).join();
  expect_same(s);
  EXPECT_LT(s.theirs_count, kMaxFrames);  // the whole stack, down to the thread's start
}

TEST(Unwind, CaptureStackFallsBackToLibgccForABigFrame) {
  tray::os::prepare_backtrace();
  Stacks s;
  with_big_frame(&s);
  expect_same(s);
}

Stacks g_in_handler;

void on_signal(int) { take_capture(&g_in_handler); }

TEST(Unwind, CaptureStackInASignalHandler) {
  tray::os::prepare_backtrace();
  struct sigaction action, previous;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &action, &previous), 0);
  raise(SIGUSR2);
  sigaction(SIGUSR2, &previous, nullptr);
  expect_same(g_in_handler);
}

}  // namespace
