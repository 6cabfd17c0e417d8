// Every public header, as installed, compiled with -O2 -Wall -Wextra -Werror (the
// public_headers target of tests/install/CMakeLists.txt): a program built with -Werror must be
// able to include them. The templates are instantiated, since a template's warnings appear only
// then, and the middle end's warnings (-Warray-bounds, -Wstringop-overflow) need -O2 and code
// the optimizer can follow (frame_arena_spill.cpp holds a case of those on its own, since what
// else the file calls changes what GCC inlines). tests/install/run.sh checks that every
// installed header is included.
#include <traymalloc.h>
#include <tray/frame_arena.hpp>
#include <tray/heap.hpp>
#include <tray/object_pool.hpp>
#include <tray/pool_allocator.hpp>
#include <tray/pool_common.hpp>

#include <cstddef>
#include <list>
#include <vector>
#include <span>

namespace {

struct Particle {
  float x, y, vx, vy;
  int frames_left;
};

}  // namespace

// Defined nowhere: the object only compiles, and the data escapes through it.
void consume(const void* data, size_t size);

void frame_arena_resets() {
  tray::FrameArena arena;
  consume(arena.create<Particle>(), sizeof(Particle));
  consume(arena.create_array<Particle>(10).data(), 10 * sizeof(Particle));
  arena.reset();
  consume(arena.allocate(100, 64), 100);
}

void object_pool_churns() {
  tray::ObjectPool<Particle> particles(64, tray::PoolPolicy::grow);
  Particle* p = particles.create(1.0f, 2.0f, 0.0f, 1.0f, 60);
  particles.for_each([&](Particle& each) {
    if (--each.frames_left == 0) particles.destroy(&each);
  });
  particles.destroy(p);
  particles.clear();
}

void pool_allocator_serves_a_list() {
  std::list<int, tray::PoolAllocator<int>> queue;
  for (int i = 0; i < 100; ++i) queue.push_back(i);
  consume(&queue.back(), sizeof(int));
}

void heap_holds_a_vector() {
  tray::Heap heap;
  tray::HeapScope scope(heap);
  std::vector<Particle, tray::HeapAllocator<Particle>> particles{tray::HeapAllocator<Particle>(heap)};
  particles.push_back(Particle{1.0f, 2.0f, 0.0f, 1.0f, 60});
  consume(particles.data(), sizeof(Particle));
  consume(heap.malloc(100), 100);
}

size_t traymalloc_api() {
  void* block = tray_malloc(100);
  const size_t usable = tray_usable_size(block);
  tray_free(block);
  return usable;
}
