// particles: the particle system of the Object Pool pattern, with new/delete as the pool.
//
// Models the example of the Object Pool chapter of Robert Nystrom's "Game Programming
// Patterns": every frame an effect spawns hundreds of particles, each lives a random number
// of frames and dies. The book pools them because general-purpose malloc was too slow or
// fragmented for it; this workload measures how close a malloc comes to a pool when it is
// simply asked for `new Particle` and `delete particle` at that rate. Particles are moved every
// frame, so allocation cost is weighed against real work on the objects, as in a game.
//
// Check: particles move in integer steps, so a dying particle must sit exactly at
// start + velocity * age; its identity word must also be intact.
// Ops: one particle (its new and its delete). Default: 4000 frames, 400 spawns per frame,
// lifetimes of 10..90 frames (about 20k particles alive).
#include <cstdint>
#include <vector>

#include "common.hpp"

namespace {

constexpr unsigned kSpawnsPerFrame = 400;
constexpr unsigned kMinLifetimeFrames = 10;
constexpr unsigned kMaxLifetimeFrames = 90;

struct Particle {
  int32_t x, y, z;
  int32_t start_x, start_y, start_z;
  int32_t velocity_x, velocity_y, velocity_z;
  uint32_t age_frames = 0;
  uint32_t lifetime_frames;
  uint64_t identity;
  uint64_t serial;

  void advance() {
    x += velocity_x;
    y += velocity_y;
    z += velocity_z;
    ++age_frames;
  }
  bool alive() const { return age_frames < lifetime_frames; }
  bool consistent() const {
    const auto age = static_cast<int32_t>(age_frames);
    return x == start_x + velocity_x * age && y == start_y + velocity_y * age &&
           z == start_z + velocity_z * age && identity == workload::block_tag(0, serial);
  }
};

Particle* spawn(workload::Rng& rng, uint64_t serial) {
  auto* particle = new Particle;
  particle->start_x = particle->x = static_cast<int32_t>(rng.below(1 << 16));
  particle->start_y = particle->y = static_cast<int32_t>(rng.below(1 << 16));
  particle->start_z = particle->z = static_cast<int32_t>(rng.below(1 << 16));
  particle->velocity_x = static_cast<int32_t>(rng.below(64)) - 32;
  particle->velocity_y = static_cast<int32_t>(rng.below(64)) - 32;
  particle->velocity_z = static_cast<int32_t>(rng.below(64)) - 32;
  particle->lifetime_frames = static_cast<uint32_t>(rng.between(kMinLifetimeFrames, kMaxLifetimeFrames));
  particle->serial = serial;
  particle->identity = workload::block_tag(0, serial);
  return particle;
}

}  // namespace

int main(int argc, char** argv) {
  const workload::Options options = workload::parse_options(argc, argv, {"particles", 0});
  const uint64_t frames = options.scaled(4000, 100);

  workload::CheckCounter checks;
  workload::Rng rng(4000);
  std::vector<Particle*> alive;
  alive.reserve(kSpawnsPerFrame * kMaxLifetimeFrames);
  uint64_t spawned = 0;
  const workload::Stopwatch stopwatch;
  for (uint64_t frame = 0; frame < frames; ++frame) {
    for (unsigned s = 0; s < kSpawnsPerFrame; ++s) alive.push_back(spawn(rng, ++spawned));
    // Swap-remove keeps the update loop over a dense array, as a game's particle list would.
    for (size_t i = 0; i < alive.size();) {
      Particle* particle = alive[i];
      particle->advance();
      if (particle->alive()) {
        ++i;
        continue;
      }
      checks.expect(particle->consistent(), "particles: position or identity corrupted");
      delete particle;
      alive[i] = alive.back();
      alive.pop_back();
    }
  }
  for (Particle* particle : alive) {
    checks.expect(particle->consistent(), "particles: survivor corrupted");
    delete particle;
  }
  const double seconds = stopwatch.seconds();

  return workload::report("particles", 1, spawned, seconds, checks);
}
