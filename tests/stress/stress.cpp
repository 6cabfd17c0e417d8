// Stress test: many threads allocate, stamp, check and free blocks of every size class and
// large blocks through every entry point of the prefixed API; a share of the blocks goes to
// other threads through shared slots, and all the threads end and new ones start each round,
// so blocks outlive the thread (and heap owner) that allocated them. Half the threads keep
// what they free of others' blocks for themselves from the start (lib/heap/reuse.hpp), while
// threads end, one thread a round forks, and another hands out blocks of a program heap and
// destroys it once they are back. Any corruption, a block that is not aligned or not as usable as
// promised, or a calloc block that is not zero, stops the program with a message and exit
// status 1.
//
//   tray_stress [--threads N] [--rounds N | --seconds N | --minutes N] [--ops N] [--seed N]
//               [--forks 0|1]
//
// Defaults: 4 threads per core, 10 rounds of 20000 operations per thread. With a time limit,
// rounds go on until it has passed.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "keep_foreign.hpp"
#include "traymalloc.h"

namespace {

constexpr size_t kLocalSlots = 512;      // live blocks each thread juggles
constexpr size_t kTransferSlots = 1024;  // blocks in transit between threads, across rounds
constexpr size_t kFullCheckBytes = 64 << 10;  // blocks above this are checked at sample points
constexpr size_t kEdgeBytes = 4096;           // ...their first and last bytes in full
constexpr size_t kSampleStrideBytes = 2048;   // ...and one word per stride in between

struct Options {
  unsigned threads = 4 * std::max(1u, std::thread::hardware_concurrency());
  uint64_t rounds = 10;
  uint64_t seconds = 0;
  uint64_t ops = 20000;
  uint64_t seed = 1;
  bool forks = true;  // one thread a round forks (--forks 0: none, for qemu-user)
};

// What the checker knows of a live block. Records are allocated by the allocator under test
// too, and move between threads with their blocks.
struct Record {
  unsigned char* p;
  size_t size;       // bytes stamped
  size_t alignment;  // 0: natural
  uint64_t tag;      // seeds the stamp
};

std::atomic<Record*> g_transfer[kTransferSlots];
std::atomic<uint64_t> g_operations{0};
std::atomic<uint64_t> g_handoffs{0};
std::atomic<uint64_t> g_forks{0};

// Blocks of a round's program heap on their way to other threads, and how many are not freed.
constexpr size_t kHeapSlots = 64;
std::atomic<unsigned char*> g_heap_slots[kHeapSlots];
std::atomic<uint64_t> g_heap_blocks_out{0};
constexpr size_t kHeapBlockBytes = 200;

[[noreturn]] void fail(const char* what, const Record* r, size_t offset) {
  fprintf(stderr, "tray_stress: %s: block %p size %zu alignment %zu tag %016llx offset %zu\n",
          what, static_cast<void*>(r->p), r->size, r->alignment,
          static_cast<unsigned long long>(r->tag), offset);
  abort();
}

struct Rng {
  uint64_t state;
  uint64_t next() {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }
  bool chance(unsigned percent) { return below(100) < percent; }
};

uint64_t word_at(uint64_t tag, size_t offset) { return tag ^ (offset * 0x9E3779B97F4A7C15ULL); }
unsigned char byte_at(uint64_t tag, size_t offset) { return static_cast<unsigned char>(tag + offset * 131); }

// Calls f(offset, whole_word) for every place a block of `size` bytes is stamped: every word
// of a block up to kFullCheckBytes; of bigger ones, the edges and one word per stride, so a
// round stays fast with blocks of megabytes. Trailing bytes that do not fill a word come last.
template <typename F>
void for_each_stamp(size_t size, F&& f) {
  const size_t words_end = size & ~size_t{7};
  if (size <= kFullCheckBytes) {
    for (size_t o = 0; o < words_end; o += 8) f(o, true);
  } else {
    for (size_t o = 0; o < kEdgeBytes; o += 8) f(o, true);
    for (size_t o = kEdgeBytes; o < words_end - kEdgeBytes; o += kSampleStrideBytes) f(o, true);
    for (size_t o = words_end - kEdgeBytes; o < words_end; o += 8) f(o, true);
  }
  for (size_t o = words_end; o < size; ++o) f(o, false);
}

void stamp(Record* r) {
  for_each_stamp(r->size, [r](size_t o, bool word) {
    if (word) {
      const uint64_t w = word_at(r->tag, o);
      memcpy(r->p + o, &w, 8);
    } else {
      r->p[o] = byte_at(r->tag, o);
    }
  });
}

// Checks the stamp of the first `limit` bytes (all of them after a plain allocation; what a
// realloc kept after one).
void check(const Record* r, size_t limit) {
  for_each_stamp(r->size, [r, limit](size_t o, bool word) {
    if (word) {
      if (o + 8 > limit) return;
      uint64_t w;
      memcpy(&w, r->p + o, 8);
      if (w != word_at(r->tag, o)) fail("stamp overwritten", r, o);
    } else if (o < limit && r->p[o] != byte_at(r->tag, o)) {
      fail("stamp overwritten", r, o);
    }
  });
}

void check_zero(const Record* r) {
  for_each_stamp(r->size, [r](size_t o, bool word) {
    const size_t n = word ? 8 : 1;
    for (size_t i = 0; i < n; ++i)
      if (r->p[o + i] != 0) fail("calloc block not zero", r, o + i);
  });
}

void check_placement(const Record* r) {
  const size_t align = r->alignment != 0 ? r->alignment : 16;
  if (reinterpret_cast<uintptr_t>(r->p) % align != 0) fail("misaligned", r, 0);
  if (tray_usable_size(r->p) < r->size) fail("usable size below the request", r, tray_usable_size(r->p));
  if (!tray_owns(r->p)) fail("block not owned", r, 0);
}

// Mostly small sizes, every class up to 128 KiB often enough, large blocks now and then and a
// few of tens of megabytes.
size_t random_size(Rng& rng) {
  const uint64_t pick = rng.below(1000);
  if (pick < 600) return 1 + rng.below(256);
  if (pick < 850) return 1 + rng.below(4096);
  if (pick < 970) return 1 + rng.below(128 << 10);
  if (pick < 998) return (128 << 10) + rng.below(4 << 20);
  return (4 << 20) + rng.below(28 << 20);
}

size_t random_alignment(Rng& rng) {
  const uint64_t pick = rng.below(100);
  if (pick < 70) return size_t{16} << rng.below(8);   // up to 2 KiB: from the classes
  if (pick < 95) return size_t{4096} << rng.below(5); // pages: classes and large blocks
  return size_t{1} << (20 + rng.below(4));            // 1-8 MiB: large blocks only
}

Record* new_record(Rng& rng) {
  auto* r = static_cast<Record*>(tray_malloc(sizeof(Record)));
  if (r == nullptr) {
    fprintf(stderr, "tray_stress: out of memory for a record\n");
    abort();
  }
  r->tag = rng.next();
  r->alignment = 0;
  r->size = random_size(rng);
  const unsigned how = unsigned(rng.below(100));
  bool zeroed = false;
  if (how < 55) {
    r->p = static_cast<unsigned char*>(tray_malloc(r->size));
  } else if (how < 70) {
    const size_t count = 1 + rng.below(8);
    r->size = std::max<size_t>(1, r->size / count) * count;
    r->p = static_cast<unsigned char*>(tray_calloc(count, r->size / count));
    zeroed = true;
  } else if (how < 80) {
    r->alignment = random_alignment(rng);
    r->p = static_cast<unsigned char*>(tray_aligned_alloc(r->alignment, r->size));
  } else if (how < 90) {
    r->alignment = random_alignment(rng);
    void* p = nullptr;
    if (tray_posix_memalign(&p, r->alignment, r->size) != 0) p = nullptr;
    r->p = static_cast<unsigned char*>(p);
  } else if (how < 95) {
    r->alignment = random_alignment(rng);
    r->p = static_cast<unsigned char*>(tray_memalign(r->alignment, r->size));
  } else {
    r->p = static_cast<unsigned char*>(tray_realloc(nullptr, r->size));
  }
  if (r->p == nullptr) {
    fprintf(stderr, "tray_stress: allocation of %zu bytes failed (errno %d)\n", r->size, errno);
    abort();
  }
  check_placement(r);
  if (zeroed) check_zero(r);
  stamp(r);
  return r;
}

void free_record(Rng& rng, Record* r) {
  check(r, r->size);
  check_placement(r);
  switch (rng.below(4)) {
    case 0:
      if (r->alignment != 0) tray_free_aligned_sized(r->p, r->alignment, r->size);
      else tray_free_sized(r->p, r->size);
      break;
    case 1:
      if (tray_realloc(r->p, 0) != nullptr) fail("realloc to 0 returned a block", r, 0);
      break;
    default:
      tray_free(r->p);
  }
  tray_free(r);
}

void resize_record(Rng& rng, Record* r) {
  // Growing by up to double, but not past 64 MiB: chains of growth would exhaust memory.
  size_t new_size = rng.chance(50) ? random_size(rng) : 1 + r->size + rng.below(r->size);
  if (new_size > (size_t{64} << 20)) new_size = random_size(rng);
  auto* p = static_cast<unsigned char*>(tray_realloc(r->p, new_size));
  if (p == nullptr) {
    fprintf(stderr, "tray_stress: realloc to %zu bytes failed (errno %d)\n", new_size, errno);
    abort();
  }
  r->p = p;
  check(r, std::min(r->size, new_size));
  r->size = new_size;
  r->alignment = 0;  // realloc promises only the natural alignment
  check_placement(r);
  stamp(r);
}

// A block of the round's program heap: every byte is its address's low byte.
void stamp_heap_block(unsigned char* p) {
  for (size_t o = 0; o < kHeapBlockBytes; ++o) p[o] = static_cast<unsigned char>(reinterpret_cast<uintptr_t>(p) + o);
}

void free_heap_block(unsigned char* p) {
  for (size_t o = 0; o < kHeapBlockBytes; ++o) {
    if (p[o] != static_cast<unsigned char>(reinterpret_cast<uintptr_t>(p) + o)) {
      const Record r{p, kHeapBlockBytes, 0, 0};
      fail("program heap block overwritten", &r, o);
    }
  }
  tray_free(p);
  g_heap_blocks_out.fetch_sub(1, std::memory_order_acq_rel);
}

// Any thread: frees a block of the program heap that waits in a slot, if there is one.
void take_heap_block(Rng& rng) {
  if (unsigned char* p = g_heap_slots[rng.below(kHeapSlots)].exchange(nullptr, std::memory_order_acq_rel))
    free_heap_block(p);
}

// The round's heap thread: hands out blocks of a heap of its own now and then...
void hand_out_heap_block(Rng& rng, tray_heap_t* heap) {
  auto* p = static_cast<unsigned char*>(tray_heap_malloc(heap, kHeapBlockBytes));
  if (p == nullptr) {
    fprintf(stderr, "tray_stress: program heap allocation failed\n");
    abort();
  }
  stamp_heap_block(p);
  g_heap_blocks_out.fetch_add(1, std::memory_order_acq_rel);
  if (unsigned char* old = g_heap_slots[rng.below(kHeapSlots)].exchange(p, std::memory_order_acq_rel))
    free_heap_block(old);
}

// ...and destroys the heap once every block it handed out is freed, while the other threads go
// on with their hand-overs.
void destroy_heap_when_back(tray_heap_t* heap) {
  for (auto& slot : g_heap_slots)
    if (unsigned char* p = slot.exchange(nullptr, std::memory_order_acq_rel)) free_heap_block(p);
  while (g_heap_blocks_out.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  tray_heap_destroy(heap);
}

// The round's forking thread: a child checks and frees the blocks it holds, allocates and
// frees more, and ends; the parent goes on once it has.
void fork_and_check(Rng& rng, Record** local) {
  const pid_t child = fork();
  if (child < 0) return;  // no process to spare: nothing to check
  if (child == 0) {
    for (size_t i = 0; i < kLocalSlots; ++i)
      if (local[i] != nullptr) free_record(rng, local[i]);
    for (int i = 0; i < 200; ++i) free_record(rng, new_record(rng));
    tray_trim();
    _exit(0);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "tray_stress: a forked child failed (status %d)\n", status);
    abort();
  }
  g_forks.fetch_add(1, std::memory_order_relaxed);
}

// Roles: the first thread of a round forks once, the second owns a program heap, every odd one
// keeps others' blocks from its first free on.
void worker(uint64_t seed, uint64_t ops, unsigned index, bool forks) {
  Rng rng{seed};
  Record* local[kLocalSlots] = {};
  if (index % 2 == 1) tray_test::keep_foreign_blocks(true);
  tray_heap_t* heap = index == 1 ? tray_heap_new() : nullptr;
  const uint64_t fork_at = index == 0 && forks ? rng.below(ops) : UINT64_MAX;
  for (uint64_t i = 0; i < ops; ++i) {
    if (i == fork_at) fork_and_check(rng, local);
    if (heap != nullptr && rng.chance(10)) hand_out_heap_block(rng, heap);
    else if (rng.chance(3)) take_heap_block(rng);
    Record*& slot = local[rng.below(kLocalSlots)];
    const unsigned what = unsigned(rng.below(100));
    if (slot == nullptr) {
      slot = new_record(rng);
    } else if (what < 40) {
      free_record(rng, slot);
      slot = new_record(rng);
    } else if (what < 55) {
      resize_record(rng, slot);
    } else if (what < 80) {
      // The block goes to whichever thread next visits the slot; this thread takes over what
      // was there, allocated by a thread that may have ended since.
      check(slot, slot->size);
      slot = g_transfer[rng.below(kTransferSlots)].exchange(slot, std::memory_order_acq_rel);
      g_handoffs.fetch_add(1, std::memory_order_relaxed);
    } else if (what < 99) {
      check(slot, slot->size);
      check_placement(slot);
    } else if (rng.chance(2)) {
      tray_trim();
    }
  }
  // A thread leaves some of its blocks in transit for the next round's threads and frees the
  // rest; its heap is parked with live blocks in it.
  for (Record*& slot : local) {
    if (slot == nullptr) continue;
    if (rng.chance(25)) {
      slot = g_transfer[rng.below(kTransferSlots)].exchange(slot, std::memory_order_acq_rel);
      if (slot == nullptr) continue;
    }
    free_record(rng, slot);
  }
  if (heap != nullptr) destroy_heap_when_back(heap);
  g_operations.fetch_add(ops, std::memory_order_relaxed);
}

bool parse_number(const char* text, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return false;
  *out = value;
  return true;
}

bool parse(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const char* name = argv[i];
    uint64_t value = 0;
    if (i + 1 >= argc || !parse_number(argv[i + 1], &value)) return false;
    ++i;
    if (strcmp(name, "--threads") == 0 && value > 0) options->threads = unsigned(value);
    else if (strcmp(name, "--rounds") == 0 && value > 0) options->rounds = value;
    else if (strcmp(name, "--seconds") == 0 && value > 0) options->seconds = value;
    else if (strcmp(name, "--minutes") == 0 && value > 0) options->seconds = value * 60;
    else if (strcmp(name, "--ops") == 0 && value > 0) options->ops = value;
    else if (strcmp(name, "--seed") == 0) options->seed = value;
    else if (strcmp(name, "--forks") == 0 && value <= 1) options->forks = value == 1;
    else return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!parse(argc, argv, &options)) {
    fprintf(stderr,
            "usage: %s [--threads N] [--rounds N | --seconds N | --minutes N] [--ops N] "
            "[--seed N] [--forks 0|1]\n",
            argv[0]);
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed_s = [&] {
    return uint64_t(std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::steady_clock::now() - start).count());
  };
  uint64_t round = 0;
  while (options.seconds != 0 ? elapsed_s() < options.seconds : round < options.rounds) {
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < options.threads; ++t)
      threads.emplace_back(worker, options.seed * 1000003 + round * 65537 + t, options.ops, t,
                           options.forks);
    for (auto& thread : threads) thread.join();
    ++round;
  }
  Rng rng{options.seed};
  for (auto& slot : g_transfer)
    if (Record* r = slot.exchange(nullptr)) free_record(rng, r);
  tray_stats stats{};
  stats.version = TRAY_STATS_VERSION;
  tray_stats_get(&stats);
  printf("tray_stress: %llu rounds of %u threads, %llu operations, %llu hand-offs, %llu forks, "
         "%llu blocks reused by their freeing thread, %llu s\n",
         static_cast<unsigned long long>(round), options.threads,
         static_cast<unsigned long long>(g_operations.load()),
         static_cast<unsigned long long>(g_handoffs.load()),
         static_cast<unsigned long long>(g_forks.load()), stats.reused_blocks,
         static_cast<unsigned long long>(elapsed_s()));
  return 0;
}
