// The particle system of the Object Pool pattern: every frame spawns a batch of particles with
// random lifetimes (in frames), moves every live particle and destroys those whose time is up.
// One benchmark iteration is one frame, measured after the system has reached its steady
// population (about spawn rate x mean lifetime particles).
//
//   HeapParticles      new/delete, live particles tracked in a vector of pointers
//   PooledParticles    the same vector of pointers, particles from tray::ObjectPool
//   IteratedParticles  tray::ObjectPool alone: for_each() walks the live set, no vector
//
// The first two differ only in where particles live, so their ratio is the pool's gain for
// code that keeps its own list; the third is the pattern as the pool is meant to be used.
// Run under another malloc with LD_PRELOAD to compare new/delete across allocators.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "tray/object_pool.hpp"

namespace {

constexpr int kMaxLifetimeFrames = 120;
constexpr float kFrameSeconds = 1.0f / 60.0f;
constexpr size_t kPoolChunkParticles = 4096;

struct Particle {
  float position[3];
  float velocity[3];
  float color[4];
  float spin;
  int frames_left;
};

// xorshift64*: cheap, and the same sequence for every variant.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint32_t next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return uint32_t((state_ * 0x2545f4914f6cdd1dULL) >> 32);
  }
  float unit() { return float(next() >> 8) * (1.0f / 16777216.0f); }  // [0, 1)

 private:
  uint64_t state_;
};

Particle spawn_particle(Random& random) {
  return Particle{{0.0f, 0.0f, 0.0f},
                  {random.unit() - 0.5f, random.unit() * 4.0f, random.unit() - 0.5f},
                  {1.0f, random.unit(), 0.2f, 1.0f},
                  random.unit(),
                  1 + int(random.next() % kMaxLifetimeFrames)};
}

// Moves the particle by one frame; false once its lifetime is over.
bool advance(Particle& p) {
  p.velocity[1] -= 9.81f * kFrameSeconds;
  for (int axis = 0; axis < 3; ++axis) p.position[axis] += p.velocity[axis] * kFrameSeconds;
  p.color[3] *= 0.99f;
  p.spin += kFrameSeconds;
  return --p.frames_left > 0;
}

class HeapParticles {
 public:
  HeapParticles() = default;
  HeapParticles(const HeapParticles&) = delete;
  HeapParticles& operator=(const HeapParticles&) = delete;
  ~HeapParticles() {
    for (Particle* p : live_) delete p;
  }

  size_t frame(int spawn_count, Random& random) {
    for (int i = 0; i < spawn_count; ++i) live_.push_back(new Particle(spawn_particle(random)));
    const size_t updated = live_.size();
    for (size_t i = 0; i < live_.size();) {
      if (advance(*live_[i])) {
        ++i;
        continue;
      }
      delete live_[i];
      live_[i] = live_.back();
      live_.pop_back();
    }
    return updated;
  }
  size_t live() const { return live_.size(); }

 private:
  std::vector<Particle*> live_;
};

class PooledParticles {
 public:
  size_t frame(int spawn_count, Random& random) {
    for (int i = 0; i < spawn_count; ++i) live_.push_back(pool_.create(spawn_particle(random)));
    const size_t updated = live_.size();
    for (size_t i = 0; i < live_.size();) {
      if (advance(*live_[i])) {
        ++i;
        continue;
      }
      pool_.destroy(live_[i]);
      live_[i] = live_.back();
      live_.pop_back();
    }
    return updated;
  }
  size_t live() const { return pool_.size(); }

 private:
  tray::ObjectPool<Particle> pool_{kPoolChunkParticles, tray::PoolPolicy::grow};
  std::vector<Particle*> live_;
};

class IteratedParticles {
 public:
  size_t frame(int spawn_count, Random& random) {
    for (int i = 0; i < spawn_count; ++i) (void)pool_.create(spawn_particle(random));
    const size_t updated = pool_.size();
    pool_.for_each([this](Particle& p) {
      if (!advance(p)) pool_.destroy(&p);
    });
    return updated;
  }
  size_t live() const { return pool_.size(); }

 private:
  tray::ObjectPool<Particle> pool_{kPoolChunkParticles, tray::PoolPolicy::grow};
};

template <class System>
void BM_Particles(benchmark::State& state) {
  const int spawn_per_frame = int(state.range(0));
  Random random(0x5eed);
  System system;
  // Two full lifetimes: every particle alive now was born during the warm-up.
  for (int frame = 0; frame < 2 * kMaxLifetimeFrames; ++frame) {
    system.frame(spawn_per_frame, random);
  }
  int64_t updated = 0;
  for (auto _ : state) updated += int64_t(system.frame(spawn_per_frame, random));
  state.SetItemsProcessed(updated);
  state.counters["live"] = double(system.live());
}

BENCHMARK_TEMPLATE(BM_Particles, HeapParticles)->Arg(300)->Arg(3000);
BENCHMARK_TEMPLATE(BM_Particles, PooledParticles)->Arg(300)->Arg(3000);
BENCHMARK_TEMPLATE(BM_Particles, IteratedParticles)->Arg(300)->Arg(3000);

}  // namespace

BENCHMARK_MAIN();
