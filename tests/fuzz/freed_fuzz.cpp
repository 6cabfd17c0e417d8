// libFuzzer harness for the release checks (heap/hardening.hpp): the input allocates and frees
// small blocks, some from a second thread (remote-free runs), and flips bytes in blocks that are
// free, the way a write after free or an overflow would. Whatever it flips, the allocator must
// never hand out an address outside its pages, a pointer that is not a block's start, or a block
// that overlaps a live one: it may stop the program (its report and SIGABRT), or a decoded
// garbage link may fault, but it must not go on with a broken heap.
//
// Each input runs in a child process (the checks end the process they stop), and the child
// checks every block it is handed; a violation is exit status 3, which the parent turns into
// the fuzzer's crash. The child's coverage does not reach libFuzzer, which sees only the
// parent's: the inputs are the seeds' mutations, not guided by coverage.
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <thread>

#include "heap/hardening.hpp"
#include "segment/segment.hpp"
#include "traymalloc.h"

namespace {

constexpr size_t kSlots = 24;
constexpr size_t kFreed = 64;
constexpr int kViolation = 3;
constexpr int kStoppedByFault = 4;

struct Block {
  unsigned char* p = nullptr;
  size_t bytes = 0;  // the block's size class, all of it usable
};

Block g_live[kSlots];
Block g_freed[kFreed];  // blocks freed and not handed out since: the ones whose bytes may flip
size_t g_freed_next = 0;

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

[[noreturn]] void violation(const char* what, const void* p) {
  fprintf(stderr, "tray_fuzz_freed: %s: %p\n", what, p);
  _exit(kViolation);
}

bool overlaps(const Block& a, const unsigned char* p, size_t bytes) {
  if (a.p == nullptr || p == nullptr) return false;
  const auto start = reinterpret_cast<uintptr_t>(p);
  const auto other = reinterpret_cast<uintptr_t>(a.p);
  return other < start + bytes && start < other + a.bytes;
}

// A block just handed out: one of ours, a block's start, overlapping nothing live.
Block checked(void* p) {
  if (p == nullptr) return {};
  auto* bytes = static_cast<unsigned char*>(p);
  if (reinterpret_cast<uintptr_t>(p) >> tray::kUnitMapAddressBits != 0) violation("an address outside the heap", p);
  const tray::Page* page = tray::unit_page_of(p);
  if (page->heap == nullptr) violation("an address outside the heap", p);
  if (!tray::is_block_start(page, p) || reinterpret_cast<uintptr_t>(p) >= page->limit)
    violation("not a block's start", p);
  const Block block{bytes, page->block_bytes};
  for (const Block& live : g_live)
    if (overlaps(live, bytes, block.bytes)) violation("a block that overlaps a live one", p);
  for (Block& freed : g_freed)
    if (freed.p == bytes) freed = {};  // live again: its bytes are the program's
  return block;
}

void remember_freed(const Block& block) {
  g_freed[g_freed_next] = block;
  g_freed_next = (g_freed_next + 1) % kFreed;
}

// A few classes, so that frees and the bursts after them meet on the same lists; now and then
// any small size.
size_t size_of(uint8_t b) {
  static constexpr size_t kSizes[] = {16, 48, 64, 100, 256, 1000};
  return b < 192 ? kSizes[b % 6] : 1 + size_t(b) * 4;
}

void run(Input& in) {
  while (!in.empty()) {
    const uint8_t op = in.byte();
    Block& slot = g_live[in.byte() % kSlots];
    switch (op % 6) {
      case 0:  // allocate
        if (slot.p == nullptr) slot = checked(tray_malloc(size_of(in.byte())));
        break;
      case 1:  // free here
        if (slot.p == nullptr) break;
        tray_free(slot.p);
        remember_freed(slot);
        slot = {};
        break;
      case 2:  // free from another thread: the block travels in a run to its owner
        if (slot.p == nullptr) break;
        std::thread([p = slot.p] { tray_free(p); }).join();
        remember_freed(slot);
        slot = {};
        break;
      case 3: {  // a write after free: one byte of one of the last blocks freed, mostly in the
                 // words the allocator keeps there (link, free key, run header)
        const Block& freed = g_freed[(g_freed_next + kFreed - 1 - in.byte() % 4) % kFreed];
        const uint8_t where = in.byte() % 40;
        const uint8_t flip = in.byte() | 1;
        // Only while its page is still one of ours: a page given back may have been unmapped.
        if (freed.p != nullptr && tray::unit_page_of(freed.p)->heap != nullptr)
          freed.p[where % (freed.bytes < 64 ? freed.bytes : 64)] ^= flip;
        break;
      }
      case 4: {  // a burst of one size: pops through whatever the lists hold
        const size_t size = size_of(in.byte());
        Block burst[32];
        const unsigned count = 1 + in.byte() % 32;
        for (unsigned i = 0; i < count; ++i) {
          burst[i] = checked(tray_malloc(size));
          for (unsigned j = 0; j < i; ++j)
            if (overlaps(burst[j], burst[i].p, burst[i].bytes)) violation("two blocks overlap", burst[i].p);
        }
        for (unsigned i = 0; i < count; ++i) tray_free(burst[i].p);
        break;
      }
      default:  // memory back to the OS: sparse passes and drains
        tray_trim();
        break;
    }
  }
}

// A fault in the child: a link that decoded to garbage below the page's limit (about one in
// 2^17) and was followed. It stops the program, as the checks do; ASan would call it a bug.
void fault_stops(int) { _exit(kStoppedByFault); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const pid_t child = fork();
  if (child < 0) abort();
  if (child == 0) {
    struct sigaction action = {};
    action.sa_handler = fault_stops;
    sigaction(SIGSEGV, &action, nullptr);
    sigaction(SIGBUS, &action, nullptr);
    // libFuzzer's handler, inherited, would turn the checks' abort into an exit of its own.
    signal(SIGABRT, SIG_DFL);
    Input in(data, size);
    run(in);
    _exit(0);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
  }
  // Ran through, stopped by the checks (their report, then SIGABRT), or stopped by a fault.
  // Anything else (a violation the child saw, a sanitizer's report of a misaligned or wild
  // access inside the allocator) fails the input.
  const bool stopped = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  const bool finished = WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == kStoppedByFault);
  if (!stopped && !finished) abort();
  return 0;
}
