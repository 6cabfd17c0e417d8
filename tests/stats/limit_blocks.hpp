// Blocks of the memory-limit tests, filled with a pattern that says which block and where, so
// that a test can tell that no block was lost or overwritten when the limit was met.
#pragma once

#include <errno.h>

#include <cstddef>
#include <vector>

namespace limit_blocks {

struct Block {
  unsigned char* p;
  size_t size;
};

inline unsigned char pattern(size_t index, size_t offset) {
  return static_cast<unsigned char>(index * 131 + offset / 4096);
}

// Every 512th byte and the last: enough to see a block replaced or overwritten.
inline void fill(const Block& b, size_t index) {
  for (size_t o = 0; o < b.size; o += 512) b.p[o] = pattern(index, o);
  b.p[b.size - 1] = pattern(index, b.size - 1);
}

inline bool intact(const Block& b, size_t index) {
  for (size_t o = 0; o < b.size; o += 512)
    if (b.p[o] != pattern(index, o)) return false;
  return b.p[b.size - 1] == pattern(index, b.size - 1);
}

// Allocates blocks of next_size() bytes with allocate(), each filled, into `blocks` until
// allocate() returns NULL (then the errno it left) or full(live bytes) says to stop (then 0).
template <class Allocate, class NextSize, class Full>
int allocate_until_null(std::vector<Block>& blocks, size_t& live, Allocate allocate,
                        NextSize next_size, Full full) {
  for (;;) {
    const size_t size = next_size();
    errno = 0;
    auto* p = static_cast<unsigned char*>(allocate(size));
    if (p == nullptr) return errno;
    blocks.push_back({p, size});
    fill(blocks.back(), blocks.size() - 1);
    live += size;
    if (full(live)) return 0;
  }
}

}  // namespace limit_blocks
