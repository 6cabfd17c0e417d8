// The heaps API in a program that does not link traymalloc but runs under LD_PRELOAD: it finds
// tray_heap_* with dlsym, and a default heap takes the thread's malloc and operator new.
#include <dlfcn.h>
#include <pthread.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "traymalloc.h"

namespace {

template <typename F>
F api(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

TEST(HeapPreload, ADefaultHeapTakesMallocAndNewOfItsThread) {
  const auto heap_new = api<tray_heap_t* (*)()>("tray_heap_new");
  const auto set_default = api<tray_heap_t* (*)(tray_heap_t*)>("tray_heap_set_default");
  const auto heap_of = api<tray_heap_t* (*)(const void*)>("tray_heap_of");
  const auto reset = api<void (*)(tray_heap_t*)>("tray_heap_reset");
  const auto destroy = api<void (*)(tray_heap_t*)>("tray_heap_destroy");
  ASSERT_TRUE(heap_new && set_default && heap_of && reset && destroy) << "not run under LD_PRELOAD?";
  tray_heap_t* heap = heap_new();
  set_default(heap);
  void* block = malloc(64);
  auto* text = new std::string(200, 't');
  void* other = nullptr;
  pthread_t thread;
  pthread_create(&thread, nullptr, [](void* out) -> void* {
    *static_cast<void**>(out) = malloc(64);
    return nullptr;
  }, &other);
  pthread_join(thread, nullptr);
  set_default(nullptr);
  EXPECT_EQ(heap_of(block), heap);
  EXPECT_EQ(heap_of(text), heap);
  EXPECT_EQ(heap_of(other), nullptr);
  free(other);
  reset(heap);  // block and text go: neither is touched again
  void* again = nullptr;
  set_default(heap);
  again = malloc(64);
  set_default(nullptr);
  EXPECT_EQ(heap_of(again), heap);
  destroy(heap);
}

}  // namespace
