// What the span tests share (span_test.cpp, span_purge_test.cpp): blocks laid out from the
// start of a fresh chunk, and a fixture whose thread keeps no span blocks of its own.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "api/api.hpp"
#include "core/core.hpp"
#include "platform/os.hpp"
#include "span/config.hpp"
#include "span/span_cache.hpp"
#include "support.hpp"
#include "traymalloc.h"

namespace tray_span_test {

using tray_test::kKiB;
using tray_test::kMiB;

// A block whose run is a third of a chunk and a bit less (320 pages, a rounded length): three
// fill one, a fourth does not fit.
constexpr size_t kThirdOfAChunk = 320 * 4096 - 64;

// A span block of `size` bytes, whatever its size: malloc of a big class's size gives a block
// of a page once the thread asks for the class often (heap/tails.cpp).
inline char* span_malloc(size_t size) { return static_cast<char*>(tray::alloc_large_block(size)); }

inline char* alloc_filled(size_t size, uint8_t seed) {
  auto* p = span_malloc(size);
  if (p != nullptr) tray_test::fill_sequence(p, size, seed);
  return p;
}

inline uintptr_t chunk_of(const void* p) { return reinterpret_cast<uintptr_t>(p) & ~(tray::kSegmentBytes - 1); }

// The test's thread keeps no span blocks of its own (span_cache_test.cpp tests those): what it
// frees goes to the arenas, whose placement these tests check.
class Span : public ::testing::Test {
 protected:
  void SetUp() override {
    // Spans are cut from the OS page; where it is not 4 KiB every large block is a mapping.
    if (tray::os::page_size() != tray::kOsPageBytes) GTEST_SKIP() << "spans need 4 KiB pages";
    tray_free(tray_malloc(1));  // the thread's heap, and with it its cache
    own_cache_ = tray::tls_span_cache;
    tray::span_cache_attach(nullptr);
    tray_trim();
  }
  void TearDown() override { tray::span_cache_attach(own_cache_); }

 private:
  tray::SpanCache* own_cache_ = nullptr;
};

}  // namespace tray_span_test
