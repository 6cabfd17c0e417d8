// Runs under LD_PRELOAD=libtraymalloc.so, in two scenarios, each a loop:
//   fork:  threads fork (the child allocates, starts a thread, frees, exits) while others
//          allocate and free;
//   oom:   RLIMIT_AS is set a little above what the process holds, and several threads run
//          out of memory at once through every allocation function, while another thread
//          forks; every failure must be NULL with ENOMEM (std::bad_alloc for operator new,
//          the result for posix_memalign), blocks must keep their contents, and once the
//          threads free their blocks, allocation must work again.
// A deadlock (in the parent or a child) trips an alarm, which kills the process.
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <new>
#include <thread>

namespace {

constexpr unsigned kAlarmSeconds = 240;
constexpr unsigned kChildAlarmSeconds = 30;
constexpr int kAllocators = 4;
constexpr int kForkers = 2;
constexpr int kForksPerThread = 25;
constexpr size_t kMaxBlocks = 2048;
constexpr size_t kHeadroomBytes = size_t{128} << 20;

std::atomic<bool> g_failed{false};
std::atomic<bool> g_stop{false};

void failure(const char* what, size_t size, int error) {
  fprintf(stderr, "oom_preload: %s (size %zu, errno %d)\n", what, size, error);
  g_failed.store(true);
}

// A block holds its tag at its start, end and every page: cheap enough for blocks of MiBs.
struct Block {
  unsigned char* p;
  size_t size;
  bool by_new;
};

unsigned char tag_of(const Block& b, size_t offset) {
  return static_cast<unsigned char>((reinterpret_cast<uintptr_t>(b.p) >> 4) + offset / 4096 + 1);
}

void stamp(const Block& b) {
  for (size_t o = 0; o < b.size; o += 4096) b.p[o] = tag_of(b, o);
  b.p[b.size - 1] = tag_of(b, b.size - 1);
}

bool intact(const Block& b) {
  for (size_t o = 0; o < b.size; o += 4096)
    if (b.p[o] != tag_of(b, o)) return false;
  return b.p[b.size - 1] == tag_of(b, b.size - 1);
}

void release(const Block& b) {
  if (!intact(b)) failure("a block changed", b.size, 0);
  if (b.by_new) operator delete(b.p);
  else free(b.p);
}

constexpr int kFunctions = 10;
const char* const kFunctionNames[kFunctions] = {
    "malloc", "calloc", "realloc", "aligned_alloc", "posix_memalign",
    "memalign", "valloc", "pvalloc", "operator new", "operator new(nothrow)"};

// One allocation through function `f`; false if it failed (as it must: checked here). For
// realloc, `blocks` has its last block grown, and left intact when that fails.
bool allocate(int f, size_t size, Block* blocks, size_t* count) {
  errno = 0;
  void* p = nullptr;
  int error = 0;
  bool by_new = false;
  switch (f) {
    case 0: p = malloc(size); error = errno; break;
    case 1: p = calloc(1, size); error = errno; break;
    case 2: {
      if (*count == 0) return true;
      Block& last = blocks[*count - 1];
      if (last.by_new) return true;
      void* q = realloc(last.p, last.size + size);
      if (q == nullptr) {
        if (errno != ENOMEM) failure("realloc failed without ENOMEM", size, errno);
        if (!intact(last)) failure("a failed realloc changed the block", size, 0);
        return false;
      }
      last.p = static_cast<unsigned char*>(q);
      last.size += size;
      stamp(last);
      return true;
    }
    case 3: p = aligned_alloc(4096, size); error = errno; break;
    case 4: {
      void* out = &error;
      const int result = posix_memalign(&out, 65536, size);
      if (result != 0) {
        if (result != ENOMEM) failure("posix_memalign failed without ENOMEM", size, result);
        if (out != &error) failure("posix_memalign changed *out on failure", size, result);
        return false;
      }
      p = out;
      break;
    }
    case 5: p = memalign(1 << 20, size); error = errno; break;
    case 6: p = valloc(size); error = errno; break;
    case 7: p = pvalloc(size); error = errno; break;
    case 8:
      try {
        p = operator new(size);
      } catch (const std::bad_alloc&) {
        return false;
      }
      by_new = true;
      break;
    default:
      p = operator new(size, std::nothrow);
      if (p == nullptr) return false;
      by_new = true;
  }
  if (p == nullptr) {
    if (error != ENOMEM) failure("allocation failed without ENOMEM", size, error);
    return false;
  }
  if (*count == kMaxBlocks) {
    release(Block{static_cast<unsigned char*>(p), 1, by_new});
    return true;
  }
  Block& b = blocks[(*count)++];
  b = Block{static_cast<unsigned char*>(p), size, by_new};
  if (f == 1 && (b.p[0] != 0 || b.p[size - 1] != 0)) failure("calloc block not zero", size, 0);
  stamp(b);
  return true;
}

// Allocates until every function has failed a few times, then frees and, once every thread
// has freed its blocks, checks that memory is back.
void run_out(int id, std::atomic<int>* failures_by_function, std::atomic<int>* released) {
  static thread_local Block blocks[kMaxBlocks];
  size_t count = 0;
  int failed[kFunctions] = {};
  uint64_t rng = 0x9E3779B97F4A7C15ULL * uint64_t(id + 1);
  for (int attempt = 0; attempt < 200000; ++attempt) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    const int f = int(rng % kFunctions);
    const size_t size = rng % 4 == 0 ? 64 + (rng >> 40) % 100000 : (size_t{256} << 10) + (rng >> 32) % (4 << 20);
    if (!allocate(f, size, blocks, &count)) ++failed[f];
    bool all = true;
    for (int k = 0; k < kFunctions; ++k) all = all && failed[k] >= 3;
    if (all) break;
  }
  for (int k = 0; k < kFunctions; ++k) failures_by_function[k].fetch_add(failed[k]);
  for (size_t i = 0; i < count; ++i) release(blocks[i]);
  count = 0;
  released->fetch_add(1);
  while (released->load() < kAllocators) std::this_thread::yield();
  for (int f = 0; f < kFunctions; ++f) {
    if (!allocate(f, 1 << 20, blocks, &count)) failure("allocation fails after memory came back", 1 << 20, errno);
  }
  for (size_t i = 0; i < count; ++i) release(blocks[i]);
}

// The child of a fork from a busy process: allocator state as the other threads left it.
[[noreturn]] void child_body() {
  alarm(kChildAlarmSeconds);
  Block blocks[32];
  size_t count = 0;
  for (int f = 0; f < kFunctions; ++f) allocate(f, f % 2 == 0 ? 100 : (size_t{3} << 20), blocks, &count);
  std::atomic<bool> ok{false};
  pthread_t thread;
  auto body = [](void* arg) -> void* {
    void* p = malloc(5000);
    void* q = malloc(size_t{2} << 20);
    free(p);
    free(q);
    static_cast<std::atomic<bool>*>(arg)->store(true);
    return nullptr;
  };
  // Under the address-space limit the child may lack memory for a thread: that is no failure.
  if (pthread_create(&thread, nullptr, body, &ok) == 0) {
    pthread_join(thread, nullptr);
    if (!ok.load()) _exit(3);
  }
  for (size_t i = 0; i < count; ++i) {
    if (!intact(blocks[i])) _exit(2);
    if (blocks[i].by_new) operator delete(blocks[i].p);
    else free(blocks[i].p);
  }
  _exit(g_failed.load() ? 4 : 0);
}

void fork_loop() {
  for (int i = 0; i < kForksPerThread && !g_failed.load(); ++i) {
    const pid_t pid = fork();
    if (pid < 0) continue;  // out of memory for the child: try again
    if (pid == 0) child_body();
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) failure("waitpid", 0, errno);
    else if (WIFSIGNALED(status)) failure("a child was killed (a deadlock trips its alarm)", 0, WTERMSIG(status));
    else if (WEXITSTATUS(status) != 0) failure("a child failed", 0, WEXITSTATUS(status));
  }
}

void churn(int id) {
  void* held[64] = {};
  uint64_t rng = uint64_t(id) * 7919 + 1;
  while (!g_stop.load(std::memory_order_relaxed)) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    void*& slot = held[rng % 64];
    free(slot);
    slot = malloc(rng % 8 == 0 ? (rng >> 20) % (2 << 20) : (rng >> 20) % 2000);
  }
  for (void* p : held) free(p);
}

size_t address_space_bytes() {
  FILE* f = fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  if (f == nullptr || fscanf(f, "%lu", &pages) != 1) pages = 0;
  if (f != nullptr) fclose(f);
  return pages * size_t(sysconf(_SC_PAGESIZE));
}

int scenario_fork() {
  std::thread churners[kAllocators];
  for (int i = 0; i < kAllocators; ++i) churners[i] = std::thread(churn, i);
  std::thread forkers[kForkers];
  for (auto& t : forkers) t = std::thread(fork_loop);
  for (auto& t : forkers) t.join();
  g_stop.store(true);
  for (auto& t : churners) t.join();
  g_stop.store(false);
  return g_failed.load() ? 1 : 0;
}

int scenario_oom() {
  std::atomic<int> failures[kFunctions] = {};
  std::atomic<bool> go{false};
  std::atomic<int> released{0};
  std::thread threads[kAllocators];
  for (int i = 0; i < kAllocators; ++i) {
    threads[i] = std::thread([i, &go, &failures, &released] {
      while (!go.load()) std::this_thread::yield();
      run_out(i, failures, &released);
    });
  }
  std::thread forker([&go] {
    while (!go.load()) std::this_thread::yield();
    fork_loop();
  });
  rlimit old_limit;
  getrlimit(RLIMIT_AS, &old_limit);
  rlimit low = old_limit;
  low.rlim_cur = address_space_bytes() + kHeadroomBytes;
  if (setrlimit(RLIMIT_AS, &low) != 0) {
    perror("setrlimit");
    return 1;
  }
  go.store(true);
  for (auto& t : threads) t.join();
  forker.join();
  setrlimit(RLIMIT_AS, &old_limit);
  for (int f = 0; f < kFunctions; ++f) {
    printf("  %-22s failed %d times\n", kFunctionNames[f], failures[f].load());
    if (failures[f].load() == 0) failure("a function never ran out of memory", 0, f);
  }
  return g_failed.load() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 3;
  for (int round = 0; round < rounds; ++round) {
    alarm(kAlarmSeconds);  // per round, so that long runs (many rounds) are bounded the same
    if (scenario_fork() != 0 || scenario_oom() != 0) {
      fprintf(stderr, "oom_preload: round %d failed\n", round);
      return 1;
    }
    printf("oom_preload: round %d passed\n", round);
  }
  return 0;
}
