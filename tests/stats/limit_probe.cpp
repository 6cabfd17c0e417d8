// A program with traymalloc linked in as its malloc and operator new, for the memory limit's
// tests (limit_cgroup_test.cpp): allocates blocks of 1 KiB..1 MiB, each filled with a pattern of
// its own, until malloc says no, frees every other one, allocates again, checks every
// survivor, then asks operator new for more than the limit. Prints one line,
// "live=BYTES errno=E freed=N again=N intact=0|1 bad_alloc=0|1", and exits 0; the caller
// judges. argv[1]: MiB after which it stops even if malloc never said no (default 512).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "limit_blocks.hpp"

namespace {

using limit_blocks::Block;
using limit_blocks::fill;
using limit_blocks::intact;

}  // namespace

int main(int argc, char** argv) {
  const size_t cap = (argc > 1 ? size_t(atol(argv[1])) : 512) << 20;
  // The list itself is reserved up front, so that it never meets the limit.
  std::vector<Block> blocks;
  blocks.reserve(1 << 14);
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  size_t live = 0;
  const int error = limit_blocks::allocate_until_null(
      blocks, live, [](size_t size) { return malloc(size); },
      [&seed] {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        return 1024 + size_t(seed >> 33) % ((1 << 20) - 1024 + 1);
      },
      [&](size_t bytes) { return bytes > cap || blocks.size() == blocks.capacity(); });
  size_t freed = 0;
  for (size_t i = 0; i < blocks.size(); i += 2, ++freed) {
    free(blocks[i].p);
    blocks[i].p = nullptr;
  }
  // Half freed: as many blocks as were freed, of the same sizes, fit again.
  size_t again = 0;
  for (size_t i = 0; i < blocks.size(); i += 2) {
    auto* p = static_cast<unsigned char*>(malloc(blocks[i].size));
    if (p == nullptr) break;
    blocks[i].p = p;
    fill(blocks[i], i);
    ++again;
  }
  bool all_intact = true;
  for (size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i].p != nullptr && !intact(blocks[i], i)) all_intact = false;
  bool threw = false;
  try {
    void* big = operator new(size_t{1} << 30);
    operator delete(big);
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  for (const Block& b : blocks) free(b.p);
  printf("live=%zu errno=%d freed=%zu again=%zu intact=%d bad_alloc=%d\n", live, error, freed, again,
         all_intact ? 1 : 0, threw ? 1 : 0);
  return 0;
}
