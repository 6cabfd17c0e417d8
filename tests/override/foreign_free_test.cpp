// Pointers traymalloc does not own, under LD_PRELOAD: blocks from glibc's own malloc (reached
// through libc.so.6 directly) given to the process-wide free, realloc and malloc_usable_size,
// which are traymalloc's. They must be recognised as foreign and handed to glibc's functions:
// glibc's byte count returns to where it was, nothing is printed, our own blocks are intact.
#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "override_support.hpp"

namespace {

using tray_test::fill_pattern;
using tray_test::has_pattern;

// Sizes glibc keeps in its per-thread cache once freed (up to 1032 bytes), and sizes it puts
// back in its bins or unmaps (from 128 KiB up).
const std::vector<size_t> kCachedSizes = {24, 200, 1000};
const std::vector<size_t> kBinnedSizes = {5000, 100000, size_t{1} << 20};

// Everything written to stderr between construction and text().
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    char path[] = "/tmp/tray-stderr.XXXXXX";
    file_ = mkstemp(path);
    unlink(path);
    dup2(file_, STDERR_FILENO);
  }
  ~StderrCapture() { restore(); }
  std::string text() {
    restore();
    std::string out;
    char buffer[256];
    lseek(file_, 0, SEEK_SET);
    for (ssize_t n; (n = read(file_, buffer, sizeof buffer)) > 0;) out.append(buffer, size_t(n));
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    saved_ = -1;
  }
  int saved_ = -1;
  int file_ = -1;
};

class ForeignPointers : public testing::Test {
 protected:
  void SetUp() override {
    tray_ = tray_test::LoadedTray::find();
    ASSERT_TRUE(tray_.present()) << "run this test with libtraymalloc.so in LD_PRELOAD";
    libc_ = tray_test::LibcMalloc::find();
    ASSERT_TRUE(libc_.present());
    for (uint32_t i = 0; i < 200; ++i) {
      ours_.push_back(malloc(64 + i * 40));
      fill_pattern(ours_.back(), 64 + i * 40, i);
    }
  }
  void TearDown() override {
    for (uint32_t i = 0; i < ours_.size(); ++i) {
      EXPECT_EQ(tray_.owns(ours_[i]), 1);
      EXPECT_TRUE(has_pattern(ours_[i], 64 + i * 40, i)) << i;
      free(ours_[i]);
    }
  }
  tray_test::LoadedTray tray_{};
  tray_test::LibcMalloc libc_{};
  std::vector<void*> ours_;
};

TEST_F(ForeignPointers, FreeHandsLibcBlocksBackToLibc) {
  const size_t libc_before = libc_.bytes_in_use();
  const size_t foreign_before = tray_.stats().foreign_frees;
  std::vector<void*> blocks;
  for (size_t size : kBinnedSizes) {
    void* p = libc_.malloc(size);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(tray_.owns(p), 0) << size;
    fill_pattern(p, size, 99);
    blocks.push_back(p);
  }
  EXPECT_GT(libc_.bytes_in_use(), libc_before);

  StderrCapture capture;
  for (void* p : blocks) free(p);
  EXPECT_EQ(capture.text(), "");
  EXPECT_EQ(libc_.bytes_in_use(), libc_before);
  EXPECT_EQ(tray_.stats().foreign_frees, foreign_before + kBinnedSizes.size());
}

// glibc's per-thread cache is LIFO: a small block that really went back to glibc is the next
// one glibc hands out for that size.
TEST_F(ForeignPointers, FreeHandsSmallLibcBlocksBackToLibcsCache) {
  const size_t foreign_before = tray_.stats().foreign_frees;
  for (size_t size : kCachedSizes) {
    void* p = libc_.malloc(size);
    EXPECT_EQ(tray_.owns(p), 0) << size;
    StderrCapture capture;
    free(p);
    EXPECT_EQ(capture.text(), "");
    void* again = libc_.malloc(size);
    EXPECT_EQ(again, p) << size;
    libc_.free(again);
  }
  EXPECT_EQ(tray_.stats().foreign_frees, foreign_before + kCachedSizes.size());
}

TEST_F(ForeignPointers, ReallocResizesLibcBlocksWithLibc) {
  const size_t libc_before = libc_.bytes_in_use();
  void* p = libc_.malloc(2000);
  fill_pattern(p, 2000, 5);
  for (size_t size : {size_t{5000}, size_t{300000}, size_t{1500}}) {
    p = realloc(p, size);
    ASSERT_NE(p, nullptr) << size;
    EXPECT_EQ(tray_.owns(p), 0) << size;
    EXPECT_GE(libc_.usable_size(p), size);
    EXPECT_TRUE(has_pattern(p, 1500, 5)) << size;
  }
  free(p);
  EXPECT_EQ(libc_.bytes_in_use(), libc_before);
}

TEST_F(ForeignPointers, MallocUsableSizeAsksLibc) {
  for (size_t size : {size_t{24}, size_t{5000}, size_t{1} << 20}) {
    void* p = libc_.malloc(size);
    EXPECT_EQ(malloc_usable_size(p), libc_.usable_size(p)) << size;
    EXPECT_GE(malloc_usable_size(p), size);
    libc_.free(p);
  }
}

}  // namespace
