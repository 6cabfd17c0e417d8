// Misuse of tray::ObjectPool stops the process with a message naming the address and the
// object size; the checks are on in every build, so these run in release builds too.
#include "tray/object_pool.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace {

struct Particle {
  float position[3];
  float velocity[3];
  int frames_left;
  int id;
};
static_assert(sizeof(Particle) == 32);

std::string hex(const void* address) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", address);
  return text;
}

TEST(ObjectPoolDeathTest, DoubleDestroyNamesTheAddressAndSize) {
  tray::ObjectPool<Particle> pool(8);
  Particle* particle = pool.create();
  pool.destroy(particle);
  EXPECT_DEATH(pool.destroy(particle),
               "tray::ObjectPool \\(sizeof\\(T\\) = 32\\): double destroy of " + hex(particle));
}

TEST(ObjectPoolDeathTest, DestroyOfAPointerFromElsewhereIsCaught) {
  tray::ObjectPool<Particle> pool(8);
  ASSERT_NE(pool.create(), nullptr);
  Particle on_stack{};
  EXPECT_DEATH(pool.destroy(&on_stack),
               "\\(sizeof\\(T\\) = 32\\): destroy of " + hex(&on_stack) +
                   " which is not an object of this pool");
}

TEST(ObjectPoolDeathTest, DestroyOfAnObjectOfAnotherPoolIsCaught) {
  tray::ObjectPool<Particle> pool(8);
  tray::ObjectPool<Particle> other(8);
  ASSERT_NE(pool.create(), nullptr);
  Particle* theirs = other.create();
  EXPECT_DEATH(pool.destroy(theirs), "destroy of " + hex(theirs) + " which is not an object");
}

TEST(ObjectPoolDeathTest, PointerIntoTheMiddleOfAnObjectIsCaught) {
  tray::ObjectPool<Particle> pool(8);
  Particle* particle = pool.create();
  auto* inside = reinterpret_cast<Particle*>(reinterpret_cast<char*>(particle) + 8);
  EXPECT_DEATH(pool.destroy(inside), "destroy of " + hex(inside) + " which is not an object");
}

TEST(ObjectPoolDeathTest, DestroyOfASlotNeverHandedOutIsCaught) {
  tray::ObjectPool<Particle> pool(8);
  Particle* first = pool.create();
  Particle* unused = first + 1;  // the next slot of the chunk, never created
  EXPECT_DEATH(pool.destroy(unused), "destroy of " + hex(unused) + " which is not an object");
}

TEST(ObjectPoolDeathTest, DestroyAfterClearIsCaught) {
  tray::ObjectPool<Particle> pool(8);
  Particle* particle = pool.create();
  pool.clear();
  EXPECT_DEATH(pool.destroy(particle), "destroy of " + hex(particle) + " which is not an object");
}

TEST(ObjectPoolDeathTest, ZeroCapacityIsRefused) {
  EXPECT_DEATH(tray::ObjectPool<Particle>(0), "capacity must be at least 1");
}

}  // namespace
