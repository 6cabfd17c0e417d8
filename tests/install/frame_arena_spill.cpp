// GCC 12 at -O2 -Wall warned here (-Wstringop-overflow, "writing 1 byte into a region of size
// 0") while it could not see the alignment of FrameArena's blocks: a create_array that spills
// into a new block, then one of a one-byte type that cannot fit after it. Alone in its file,
// since the warning needs FrameArena's slow path inlined here, and other callers in the same
// file keep GCC from inlining it. Built with -Werror by the public_headers target.
#include <tray/frame_arena.hpp>

#include <cstddef>
#include <span>

namespace {

struct Tag {
  char letter;
};

}  // namespace

// Defined nowhere: the object only compiles, and the data escapes through it.
void consume_spilled(const void* data, size_t size);

void frame_arena_spills() {
  tray::FrameArena arena(32);
  std::span<long> spilled = arena.create_array<long>(1000);
  consume_spilled(spilled.data(), spilled.size_bytes());
  std::span<Tag> after = arena.create_array<Tag>(1);
  consume_spilled(after.data(), after.size_bytes());
}
