#include "platform/os.hpp"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "core/bits.hpp"

namespace tray::os {

namespace {

void* map_with(size_t bytes, int prot) {
  void* p = mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Over-map by `alignment` and cut the excess off both ends: three system calls, but segments
// and large blocks are mapped rarely, and the result never depends on address hints (which
// sanitizer runtimes reserve for themselves).
void* map_aligned_with(size_t bytes, size_t alignment, int prot) {
  if (alignment <= page_size()) return map_with(bytes, prot);
  const size_t padded = bytes + alignment;
  if (padded < bytes) return nullptr;
  auto* raw = static_cast<char*>(map_with(padded, prot));
  if (raw == nullptr) return nullptr;
  const uintptr_t start = align_up(reinterpret_cast<uintptr_t>(raw), alignment);
  auto* aligned = reinterpret_cast<char*>(start);
  const size_t head = size_t(aligned - raw);
  const size_t tail = padded - head - bytes;
  if (head != 0) munmap(raw, head);
  if (tail != 0) munmap(aligned + bytes, tail);
  return aligned;
}

}  // namespace

void* map(size_t bytes) { return map_with(bytes, PROT_READ | PROT_WRITE); }

void* map_aligned(size_t bytes, size_t alignment) {
  return map_aligned_with(bytes, alignment, PROT_READ | PROT_WRITE);
}

void* reserve_aligned(size_t bytes, size_t alignment) {
  return map_aligned_with(bytes, alignment, PROT_NONE);
}

void unmap(void* p, size_t bytes) {
  const int saved = errno;  // free() must leave errno alone
  munmap(p, bytes);
  errno = saved;
}

void purge(void* p, size_t bytes) {
  // MADV_DONTNEED rather than MADV_FREE: the resident size drops at once, which is what
  // people watching RSS (and our tests) expect; reuse then faults in zero pages.
  const int saved = errno;
  madvise(p, bytes, MADV_DONTNEED);
  errno = saved;
}

bool remap_in_place(void* p, size_t old_bytes, size_t new_bytes) {
  return mremap(p, old_bytes, new_bytes, 0) != MAP_FAILED;
}

bool remap_to(void* p, size_t old_bytes, size_t new_bytes, void* target) {
  return mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, target) != MAP_FAILED;
}

size_t page_size() {
  static std::atomic<size_t> cached{0};  // threads may race to fill it, with the same value
  size_t size = cached.load(std::memory_order_relaxed);
  if (TRAY_UNLIKELY(size == 0)) {
    size = size_t(sysconf(_SC_PAGESIZE));
    cached.store(size, std::memory_order_relaxed);
  }
  return size;
}

uint64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

int process_id() { return int(getpid()); }

const char* env(const char* name) { return getenv(name); }

void* next_symbol(const char* name) { return dlsym(RTLD_NEXT, name); }

void write_fd(int fd, const char* text, size_t length) {
  const int saved = errno;
  while (length > 0) {
    const ssize_t n = write(fd, text, length);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    text += n;
    length -= size_t(n);
  }
  errno = saved;
}

int duplicate_fd(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 3); }

void abort_process() { abort(); }

int thread_key_create(pthread_key_t* key, void (*destructor)(void*)) {
  return pthread_key_create(key, destructor);
}

void thread_key_set(pthread_key_t key, const void* value) { pthread_setspecific(key, value); }

int register_atfork(void (*prepare)(), void (*parent)(), void (*child)()) {
  return pthread_atfork(prepare, parent, child);
}

}  // namespace tray::os
