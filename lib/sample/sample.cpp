#include "sample/sample.hpp"

#include "heap/heap.hpp"

namespace tray {

// Where both fired, a guarded slot goes first (a fault at the first stray access is worth more
// than a record); the profile takes the allocation when no slot is free.
void* sample_alloc(unsigned fired, size_t size, size_t sampled_bytes, size_t alignment, bool zero) {
  if (fired & kSamplerGuard) {
    if (void* block = guard_alloc(size, alignment, zero); block != nullptr) return block;
  }
  if (fired & kSamplerProf) return prof_alloc(size, sampled_bytes, alignment, zero);
  return nullptr;
}

void sample_release_owned(const ProgramHeap* owner) {
  guard_release_owned(owner);
  prof_release_owned(owner);
}

}  // namespace tray
