// libFuzzer harness: the input is a sequence of operations on the prefixed API (malloc,
// calloc, realloc, reallocarray, the aligned forms, free, sized frees, usable size, trim,
// hand-offs to a second thread, batches handed over and back (which the second thread may keep
// for itself: lib/heap/reuse.hpp), the second thread ending and a new one taking over, and
// injected mmap/mremap/madvise failures), each checked
// against a shadow model of the live blocks: contents kept, alignment, usable size at least
// what was asked, calloc's zeros, errno on every failure. A mismatch aborts with a message.
//
// Every operation is one opcode byte and a few argument bytes; a short input ends the
// sequence, and every live block is checked and freed at the end.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "keep_foreign.hpp"
#include "platform/os.hpp"
#include "traymalloc.h"

namespace {

namespace os = tray::os;

constexpr size_t kSlots = 16;
constexpr size_t kMaxRequestBytes = size_t{1} << 46;  // what the allocator refuses above
constexpr size_t kMaxCallocBytes = size_t{32} << 20;

struct Shadow {
  unsigned char* p = nullptr;
  size_t size = 0;
  size_t alignment = 0;  // what the block was promised
  unsigned char seed = 0;
};

Shadow g_slots[kSlots];

[[noreturn]] void mismatch(const char* what, size_t a, size_t b) {
  fprintf(stderr, "tray_fuzz: %s (%zu, %zu)\n", what, a, b);
  abort();
}

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  size_t slot() { return byte() % kSlots; }
  // Mostly sizes the allocator serves; now and then the edges of its classes and of what it
  // accepts at all.
  size_t size() {
    const uint8_t b = byte();
    const size_t low = byte();
    switch (b >> 5) {
      case 0: case 1: case 2: return (size_t(b & 31) << 8) | low;        // < 8 KiB
      case 3: case 4: return ((size_t(b & 31) << 8) | low) << 4;          // < 128 KiB
      case 5: return (((size_t(b & 31) << 8) | low) << 8) + (byte() & 255);  // < 2 MiB
      case 6: {
        static constexpr size_t kEdges[] = {
            0, 1, 15, 16, 17, 1024, 4096, 65535, 65536, 65537, (size_t{128} << 10) - 1,
            size_t{128} << 10, (size_t{128} << 10) + 1, (size_t{4} << 20) - 1, size_t{4} << 20,
            (size_t{4} << 20) + 1, kMaxRequestBytes + 1, SIZE_MAX / 2, SIZE_MAX - 4096, SIZE_MAX};
        return kEdges[low % (sizeof kEdges / sizeof kEdges[0])];
      }
      default: return (size_t(b & 31) << 18) + (low << 10);  // < 8 MiB
    }
  }
  size_t alignment() {
    const uint8_t b = byte();
    if (b >= 250) return size_t(byte()) * 3;  // not a power of two (or zero)
    if (b >= 245) return size_t{1} << (25 + b % 8);  // 32 MiB up to past the maximum
    return size_t{1} << (b % 24);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

unsigned char byte_at(const Shadow& s, size_t offset) {
  return static_cast<unsigned char>(s.seed + offset * 7 + (offset >> 12));
}

// Blocks above this are stamped and checked at their edges and every page, to keep each run
// short: the bytes in between are not where a lost page or an overlap would hide.
constexpr size_t kFullBytes = 16384;

template <typename F>
void for_each_checked(size_t size, F&& f) {
  if (size <= kFullBytes) {
    for (size_t o = 0; o < size; ++o) f(o);
    return;
  }
  for (size_t o = 0; o < 256; ++o) f(o);
  for (size_t o = 256; o < size - 256; o += 4093) f(o);
  for (size_t o = size - 256; o < size; ++o) f(o);
}

void stamp(Shadow& s) {
  for_each_checked(s.size, [&](size_t o) { s.p[o] = byte_at(s, o); });
}

void check(const Shadow& s, size_t limit) {
  for_each_checked(s.size, [&](size_t o) {
    if (o < limit && s.p[o] != byte_at(s, o)) mismatch("contents changed", s.size, o);
  });
}

void check_placement(const Shadow& s) {
  const size_t alignment = s.alignment < 16 ? 16 : s.alignment;
  if (reinterpret_cast<uintptr_t>(s.p) % alignment != 0) mismatch("misaligned", s.size, s.alignment);
  const size_t usable = tray_usable_size(s.p);
  if (usable < s.size) mismatch("usable size below the request", s.size, usable);
  if (!tray_owns(s.p)) mismatch("block not owned", s.size, 0);
}

// Allocations may fail only where the model says so: a request the allocator must refuse, or
// an injected system-call failure.
bool must_fail(size_t size) { return size > kMaxRequestBytes; }

bool may_fail(size_t size) {
  return must_fail(size) || os::faults_injected() != 0 || size > (size_t{1} << 36);
}

void expect_failure(const void* p, int error, int expected, size_t size) {
  if (p != nullptr) mismatch("allocation succeeded where it must fail", size, 0);
  if (error != expected) mismatch("wrong errno on failure", size, size_t(error));
}

void release(size_t i) {
  Shadow& s = g_slots[i];
  if (s.p == nullptr) return;
  check(s, s.size);
  check_placement(s);
  tray_free(s.p);
  s = Shadow{};
}

// Installs a new block in slot i (whose old block is freed first), or checks the failure.
void install(size_t i, void* p, int error, size_t size, size_t alignment, bool zeroed, unsigned char seed) {
  if (p == nullptr) {
    if (!may_fail(size)) mismatch("allocation failed", size, size_t(error));
    if (error != ENOMEM) mismatch("failed allocation without ENOMEM", size, size_t(error));
    return;
  }
  if (must_fail(size)) mismatch("allocation succeeded past the maximum", size, 0);
  release(i);
  Shadow& s = g_slots[i];
  s = Shadow{static_cast<unsigned char*>(p), size, alignment, seed};
  check_placement(s);
  if (zeroed) {
    for_each_checked(size, [&](size_t o) {
      if (s.p[o] != 0) mismatch("calloc block not zero", size, o);
    });
  }
  stamp(s);
}

// A block of a batch handed over: every byte is its address's low byte plus its offset.
void stamp_batch_block(unsigned char* p, size_t size) {
  for (size_t o = 0; o < size; ++o) p[o] = static_cast<unsigned char>(reinterpret_cast<uintptr_t>(p) + o);
}
void free_batch_block(unsigned char* p, size_t size) {
  for (size_t o = 0; o < size; ++o)
    if (p[o] != static_cast<unsigned char>(reinterpret_cast<uintptr_t>(p) + o)) mismatch("batch block changed", size, o);
  tray_free(p);
}

// --- the second thread: takes blocks it is handed and gives back its own ----------------
struct Helper {
  std::mutex mutex;
  std::condition_variable cv;
  // kKeep: keeping others' blocks on (size 1) or off; kBatch: frees the blocks of `batch`
  // and fills it with as many new ones of `size` bytes; kExit: the thread ends.
  enum Job { kNone, kAllocate, kFree, kRealloc, kKeep, kBatch, kExit } job = kNone;
  void* p = nullptr;
  size_t size = 0;
  std::vector<unsigned char*>* batch = nullptr;
  void* result = nullptr;
  int error = 0;
  bool done = false;
  std::thread thread;

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      cv.wait(lock, [&] { return job != kNone; });
      errno = 0;
      const Job now = job;
      if (now == kAllocate) {
        result = tray_malloc(size);
      } else if (now == kRealloc) {
        result = tray_realloc(p, size);
      } else if (now == kKeep) {
        tray_test::keep_foreign_blocks(size != 0);
      } else if (now == kBatch) {
        for (unsigned char*& block : *batch) {
          free_batch_block(block, size);
          block = static_cast<unsigned char*>(tray_malloc(size));
          if (block == nullptr) {
            // Only where a system call was made to fail; the slot stays empty.
            if (!may_fail(size)) mismatch("batch allocation failed", size, 0);
            continue;
          }
          stamp_batch_block(block, size);
        }
      } else if (now == kFree) {
        tray_free(p);
      }
      error = errno;
      job = kNone;
      done = true;
      cv.notify_all();
      if (now == kExit) return;
    }
  }

  void call(Job j, void* block, size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex);
    job = j;
    p = block;
    size = bytes;
    done = false;
    cv.notify_all();
    cv.wait(lock, [&] { return done; });
  }
};

Helper& helper() {
  static Helper* h = [] {
    auto* created = new Helper;
    created->thread = std::thread(&Helper::run, created);
    return created;
  }();
  return *h;
}

// The second thread ends (what it kept goes home with its heap's other blocks in transit), and
// a new one starts.
void restart_helper() {
  Helper& h = helper();
  h.call(Helper::kExit, nullptr, 0);
  h.thread.join();
  h.thread = std::thread(&Helper::run, &h);
}

// A batch of blocks of one size goes to the second thread, which frees them and hands back as
// many of its own, which this thread frees: what the second thread keeps, it hands back.
void hand_over_batch(size_t count, size_t size) {
  std::vector<unsigned char*> batch;
  for (size_t i = 0; i < count; ++i) {
    auto* p = static_cast<unsigned char*>(tray_malloc(size));
    if (p == nullptr) {
      // Only where a system call was made to fail: the batch is what was allocated.
      if (!may_fail(size)) mismatch("batch allocation failed", size, 0);
      break;
    }
    stamp_batch_block(p, size);
    batch.push_back(p);
  }
  helper().batch = &batch;
  helper().call(Helper::kBatch, nullptr, size);
  for (unsigned char* p : batch)
    if (p != nullptr) free_batch_block(p, size);
}

void op_realloc(size_t i, size_t size, bool other_thread, bool array, size_t count) {
  Shadow& s = g_slots[i];
  errno = 0;
  void* p;
  size_t total = size;
  bool overflow = false;
  if (array) {
    overflow = __builtin_mul_overflow(count, size, &total);
    p = tray_reallocarray(s.p, count, size);
  } else if (other_thread) {
    helper().call(Helper::kRealloc, s.p, size);
    p = helper().result;
    errno = helper().error;
  } else {
    p = tray_realloc(s.p, size);
  }
  const int error = errno;
  if (overflow) {
    expect_failure(p, error, ENOMEM, size);
    if (s.p != nullptr) check(s, s.size);
    return;
  }
  if (s.p != nullptr && total == 0) {  // frees, and returns NULL
    if (p != nullptr) mismatch("realloc to 0 returned a block", s.size, 0);
    s = Shadow{};
    return;
  }
  if (p == nullptr) {
    if (!may_fail(total)) mismatch("realloc failed", total, size_t(error));
    if (error != ENOMEM) mismatch("failed realloc without ENOMEM", total, size_t(error));
    if (s.p != nullptr) check(s, s.size);  // the old block is untouched
    return;
  }
  if (must_fail(total)) mismatch("realloc succeeded past the maximum", total, 0);
  const size_t kept = s.p != nullptr ? (s.size < total ? s.size : total) : 0;
  Shadow old = s;
  old.p = static_cast<unsigned char*>(p);
  if (kept != 0) check(old, kept);
  s = Shadow{static_cast<unsigned char*>(p), total, 0, static_cast<unsigned char>(s.seed + 1)};
  check_placement(s);
  stamp(s);
}

void run(Input& in) {
  while (!in.empty()) {
    const uint8_t op = in.byte();
    const size_t i = in.slot();
    const unsigned char seed = in.byte();
    if (op >= 240) {  // hand-overs between the threads
      if (op < 244) helper().call(Helper::kKeep, nullptr, op & 1);
      else if (op < 246) restart_helper();
      else hand_over_batch(1 + size_t(seed) * 8, 1 + (size_t(in.byte()) << 2));  // up to 2 K of up to 1 KiB
      continue;
    }
    switch (op % 18) {
      case 0: {
        const size_t size = in.size();
        errno = 0;
        void* p = tray_malloc(size);
        install(i, p, errno, size, 0, false, seed);
        break;
      }
      case 1: {
        // Counts near SIZE_MAX test the overflow check; otherwise a few elements, and no more
        // than kMaxCallocBytes in all, since calloc writes every byte.
        const uint8_t mode = in.byte();
        const size_t count = mode % 8 == 0 ? SIZE_MAX / (1 + in.byte()) : 1 + mode % 16;
        const size_t size = in.size();
        size_t total;
        const bool overflow = __builtin_mul_overflow(count, size, &total);
        if (!overflow && total > kMaxCallocBytes && total <= kMaxRequestBytes) break;
        errno = 0;
        void* p = tray_calloc(count, size);
        const int error = errno;
        if (overflow) expect_failure(p, error, ENOMEM, size);
        else install(i, p, error, total, 0, true, seed);
        break;
      }
      case 2: op_realloc(i, in.size(), false, false, 0); break;
      case 3: op_realloc(i, in.size(), false, true, in.byte() % 4); break;
      case 4: {
        const size_t alignment = in.alignment();
        const size_t size = in.size();
        errno = 0;
        void* p = tray_aligned_alloc(alignment, size);
        const int error = errno;
        const bool pow2 = alignment != 0 && (alignment & (alignment - 1)) == 0;
        if (!pow2) expect_failure(p, error, EINVAL, size);
        else if (alignment > TRAY_MAX_ALIGNMENT) expect_failure(p, error, ENOMEM, size);
        else install(i, p, error, size, alignment, false, seed);
        break;
      }
      case 5: {
        const size_t alignment = in.alignment();
        const size_t size = in.size();
        void* untouched = &g_slots;
        void* out = untouched;
        const int saved = errno = 12345;
        const int result = tray_posix_memalign(&out, alignment, size);
        // As glibc: errno is ENOMEM after running out of memory, untouched otherwise.
        if (errno != (result == ENOMEM && alignment <= TRAY_MAX_ALIGNMENT ? ENOMEM : saved))
          mismatch("posix_memalign left errno wrong", size, size_t(errno));
        const bool valid = (alignment & (alignment - 1)) == 0 && alignment >= sizeof(void*);
        if (result != 0) {
          if (out != untouched) mismatch("posix_memalign set *out on failure", size, 0);
          if (!valid) {
            if (result != EINVAL) mismatch("posix_memalign: bad alignment without EINVAL", alignment, size_t(result));
          } else if (alignment > TRAY_MAX_ALIGNMENT) {
            if (result != ENOMEM) mismatch("posix_memalign: alignment beyond the limit without ENOMEM", alignment, size_t(result));
          } else {
            install(i, nullptr, result, size, alignment, false, seed);
          }
        } else {
          if (!valid || alignment > TRAY_MAX_ALIGNMENT) mismatch("posix_memalign accepted a bad alignment", alignment, size);
          install(i, out, 0, size, alignment, false, seed);
        }
        break;
      }
      case 6: {
        size_t alignment = in.alignment();
        const size_t size = in.size();
        errno = 0;
        void* p = tray_memalign(alignment, size);
        const int error = errno;
        if (alignment > SIZE_MAX / 2 + 1) {
          expect_failure(p, error, EINVAL, size);
          break;
        }
        // glibc's memalign rounds an alignment that is not a power of two up to one
        size_t promised = 1;
        while (promised < alignment) promised <<= 1;
        if (promised > TRAY_MAX_ALIGNMENT) {
          expect_failure(p, error, ENOMEM, size);
          break;
        }
        install(i, p, error, size, promised, false, seed);
        break;
      }
      case 7: case 8: release(i); break;
      case 9: {
        Shadow& s = g_slots[i];
        if (s.p == nullptr) break;
        check(s, s.size);
        if (s.alignment > 16) tray_free_aligned_sized(s.p, s.alignment, s.size);
        else tray_free_sized(s.p, s.size);
        s = Shadow{};
        break;
      }
      case 10: {
        const Shadow& s = g_slots[i];
        if (s.p != nullptr) check_placement(s);
        else if (tray_usable_size(nullptr) != 0) mismatch("usable size of NULL", 0, 0);
        break;
      }
      case 11: tray_trim(); break;
      case 12: {  // the second thread frees the block (a remote free) ...
        Shadow& s = g_slots[i];
        if (s.p == nullptr) break;
        check(s, s.size);
        helper().call(Helper::kFree, s.p, 0);
        s = Shadow{};
        break;
      }
      case 13: {  // ... or allocates one this thread will free
        const size_t size = in.size();
        helper().call(Helper::kAllocate, nullptr, size);
        install(i, helper().result, helper().error, size, 0, false, seed);
        break;
      }
      case 14: op_realloc(i, in.size(), true, false, 0); break;
      case 15: {  // the next few calls to the OS fail
        const unsigned kinds = 1 + in.byte() % 7;
        const uint64_t first = 1 + in.byte() % 8;
        os::inject_faults(kinds, first, 1 + in.byte() % 4);
        break;
      }
      case 16: os::inject_faults(0, 0, 0); break;
      default: {  // a block that moves between slots
        const size_t j = in.slot();
        Shadow tmp = g_slots[i];
        g_slots[i] = g_slots[j];
        g_slots[j] = tmp;
        break;
      }
    }
  }
  os::inject_faults(0, 0, 0);
  for (size_t i = 0; i < kSlots; ++i) release(i);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  run(in);
  return 0;
}
