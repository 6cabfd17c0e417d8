// The OS page size: the kernel's, or the one a build for tests plays (TRAY_TEST_PAGE_SIZE,
// which arm64 kernels of 16 and 64 KiB pages have), and the platform calls that go by it:
// mappings start on a page, and resident_pages answers per page.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/core.hpp"
#include "platform/os.hpp"

namespace {

namespace os = tray::os;

TEST(OsPageSize, IsTheKernelsOrTheTestBuilds) {
  const size_t page = os::page_size();
#if defined(TRAY_TEST_PAGE_SIZE)
  EXPECT_EQ(page, size_t{TRAY_TEST_PAGE_SIZE});
  EXPECT_EQ(page % size_t(sysconf(_SC_PAGESIZE)), 0u);
#else
  EXPECT_EQ(page, size_t(sysconf(_SC_PAGESIZE)));
#endif
  EXPECT_TRUE(tray::is_pow2(page)) << page;
}

TEST(OsPageSize, MappingsStartOnAPage) {
  const size_t page = os::page_size();
  for (size_t pages : {1, 3, 7}) {
    void* p = os::map(pages * page);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % page, 0u) << pages << " pages at " << p;
    static_cast<char*>(p)[pages * page - 1] = 1;  // all of it is mapped
    os::unmap(p, pages * page);
    void* aligned = os::map_aligned(pages * page, page);
    ASSERT_NE(aligned, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(aligned) % page, 0u) << pages << " pages at " << aligned;
    os::unmap(aligned, pages * page);
  }
}

// Only the last byte of the second page is written: that page alone is in memory, whatever
// part of it the kernel's own pages make up.
TEST(OsPageSize, ResidentPagesAnswersPerPage) {
  const size_t page = os::page_size();
  constexpr size_t kPages = 4;
  auto* p = static_cast<char*>(os::map(kPages * page));
  ASSERT_NE(p, nullptr);
  p[2 * page - 1] = 1;
  std::vector<unsigned char> resident(kPages + 1, 0xee);
  ASSERT_TRUE(os::resident_pages(p, kPages * page, resident.data()));
  for (size_t i = 0; i < kPages; ++i) EXPECT_EQ(resident[i] & 1, i == 1 ? 1 : 0) << "page " << i;
  EXPECT_EQ(resident[kPages], 0xee) << "an answer past the last page";
  os::unmap(p, kPages * page);
}

}  // namespace
