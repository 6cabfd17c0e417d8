// request_heap: what a heap per request buys. Data built for one request is dropped either block
// by block (free) or all at once, by resetting a heap kept for the purpose (reset) or by
// destroying a heap made for the request (destroy).
//
// Two flavours share this file. `request_heap` links libtraymalloc.so and uses traymalloc.h's
// tray_heap_* calls; `request_heap_mimalloc` (built where Debian's libmimalloc-dev is installed)
// links libmimalloc.so and uses mimalloc's mi_heap_* calls. Both libraries replace malloc and
// operator new in the process they are linked into, so the block-by-block release is each
// allocator's own malloc/free. mimalloc has no reset: its reset is a destroy and a new heap,
// which the result line says (reset=destroy+new) whenever it measured a reset.
//
// Modes (--mode):
//   server (default): each thread (--threads) serves requests one after the other. A request
//     allocates 300..3000 blocks of 16..2048 B (log-uniform) and some strings, a vector of
//     numbers and a small map through std containers, reads all of it back, then releases it
//     as --release says (free, reset or destroy). In the heap releases the request's heap is
//     the thread's default while the request runs, so the containers' memory goes into the
//     heap with the blocks; their destructors never run (the release takes their memory).
//     Ops: one request. Default: 20,000 requests in all.
//   bulk (one thread; --threads is ignored): allocates --blocks blocks (default 200,000; try
//     1000000 too) of 16..512 B into a heap, then releases them (timed alone) by each method
//     in turn, --rounds times (default 7, each round in a different order). Prints the median
//     release time of each method in ns, per block for free, and the ratios of free to the
//     others. --scale multiplies --blocks. Ops: one block released.
//
// The usual flags work: --scale, --threads, --expect-malloc (matched against the library that
// defines malloc in this process, so a preload shows), --describe. This program is not among
// the workloads tools/bench-compare runs (its binaries are built into bench/heap, not
// bench/workloads): it needs a heap API, and so one particular malloc. Only --release free
// runs under any malloc put in with LD_PRELOAD; the heap releases refuse to run unless malloc
// is the flavour's own library. bench/scripts/heap_compare.sh runs both flavours side by side.
//
// Check: every block is stamped when allocated and verified before it is released; the result
// line's digest sums what the requests read and is the same under every allocator and release.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common.hpp"

#if defined(REQUEST_HEAP_MIMALLOC)
#include <mimalloc.h>

namespace {
struct Backend {
  using Heap = mi_heap_t;
  static constexpr const char* kWorkload = "request_heap_mimalloc";
  static constexpr const char* kLibrary = "mimalloc";
  static constexpr bool kNativeReset = false;
  static Heap* create() { return mi_heap_new(); }
  static void destroy(Heap* heap) { mi_heap_destroy(heap); }
  // No reset in mimalloc: the nearest thing is a fresh heap in place of the old one.
  static Heap* reset(Heap* heap) {
    mi_heap_destroy(heap);
    return mi_heap_new();
  }
  static void* allocate(Heap* heap, size_t bytes) { return mi_heap_malloc(heap, bytes); }
  static void release(void* block) { mi_free(block); }
  // Returns the previous default, which is what goes back in afterwards.
  static Heap* set_default(Heap* heap) { return mi_heap_set_default(heap); }
};
}  // namespace
#else
#include "traymalloc.h"

namespace {
struct Backend {
  using Heap = tray_heap_t;
  static constexpr const char* kWorkload = "request_heap";
  static constexpr const char* kLibrary = "traymalloc";
  static constexpr bool kNativeReset = true;
  static Heap* create() { return tray_heap_new(); }
  static void destroy(Heap* heap) { tray_heap_destroy(heap); }
  static Heap* reset(Heap* heap) {
    tray_heap_reset(heap);
    return heap;
  }
  static void* allocate(Heap* heap, size_t bytes) { return tray_heap_malloc(heap, bytes); }
  static void release(void* block) { tray_free(block); }
  static Heap* set_default(Heap* heap) { return tray_heap_set_default(heap); }
};
}  // namespace
#endif

namespace {

enum class Release { free, reset, destroy };
constexpr std::string_view kReleaseNames[] = {"free", "reset", "destroy"};

struct Settings {
  bool bulk = false;
  Release release = Release::free;
  uint64_t blocks = 200'000;
  unsigned rounds = 7;
};

// --- the malloc in use ----------------------------------------------------------------------
// workload::malloc_library_name() looks for a symbol each library exports, which in a program
// linked against one allocator names that allocator even when another was preloaded in front
// of it. Here the question is which library defines malloc.

std::string malloc_in_use() {
  Dl_info info{};
  void* symbol = dlsym(RTLD_DEFAULT, "malloc");
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "?";
  const std::string_view path = info.dli_fname;
  const std::string_view file = path.substr(path.rfind('/') + 1);
  for (const char* name : {"traymalloc", "mimalloc", "jemalloc", "tcmalloc"})
    if (file.find(name) != std::string_view::npos) return name;
  if (file.starts_with("libc.so") || file.starts_with("libc-")) return "glibc";
  return std::string(path);
}

[[noreturn]] void usage(const char* program) {
  std::fprintf(stderr,
               "usage: %s [--mode server|bulk] [--release free|reset|destroy] [--blocks N]\n"
               "       [--rounds R] [--scale X] [--threads N] [--expect-malloc LIB] | --describe\n",
               program);
  std::exit(2);
}

// Takes this workload's own flags and --expect-malloc out of argv; workload::parse_options
// reads the rest (--scale, --threads, --describe).
Settings take_own_flags(int& argc, char** argv) {
  Settings settings;
  std::string expect;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    const bool own = flag == "--mode" || flag == "--release" || flag == "--blocks" ||
                     flag == "--rounds" || flag == "--expect-malloc";
    if (!own) {
      argv[kept++] = argv[i];
      continue;
    }
    if (i + 1 >= argc) usage(argv[0]);
    const std::string_view value = argv[++i];
    bool valid = true;
    if (flag == "--mode") {
      valid = value == "server" || value == "bulk";
      settings.bulk = value == "bulk";
    } else if (flag == "--release") {
      const auto* found = std::find(std::begin(kReleaseNames), std::end(kReleaseNames), value);
      valid = found != std::end(kReleaseNames);
      settings.release = Release(found - std::begin(kReleaseNames));
    } else if (flag == "--blocks") {
      valid = workload::parse_number(argv[i], settings.blocks) && settings.blocks > 0;
    } else if (flag == "--rounds") {
      valid = workload::parse_number(argv[i], settings.rounds) && settings.rounds > 0;
    } else {
      expect = value;
    }
    if (!valid) usage(argv[0]);
  }
  argc = kept;
  argv[kept] = nullptr;

  const std::string in_use = malloc_in_use();
  const bool by_path = expect.find('/') != std::string::npos;
  const bool matches = by_path ? workload::malloc_defined_in(expect.c_str()) : expect == in_use;
  if (!expect.empty() && !matches) {
    std::fprintf(stderr, "%s: expected malloc %s but %s is in use\n", argv[0], expect.c_str(),
                 in_use.c_str());
    std::exit(3);
  }
  // A heap release with another malloc in front would leave the containers' memory outside
  // the heap (and never freed): refuse rather than measure that.
  if ((settings.bulk || settings.release != Release::free) && in_use != Backend::kLibrary) {
    std::fprintf(stderr, "%s: heaps need %s's malloc, but %s is in use (only --release free "
                 "runs under another malloc)\n", argv[0], Backend::kLibrary, in_use.c_str());
    std::exit(3);
  }
  return settings;
}

void print_result(unsigned threads, uint64_t ops, double seconds, bool resets,
                  const workload::CheckCounter& checks, const std::string& extra) {
  std::printf("RESULT workload=%s malloc=%s threads=%u ops=%llu seconds=%.6f peak_rss_kb=%ld%s%s "
              "check=%s\n",
              Backend::kWorkload, malloc_in_use().c_str(), threads,
              static_cast<unsigned long long>(ops), seconds, workload::peak_rss_kb(),
              extra.c_str(), resets && !Backend::kNativeReset ? " reset=destroy+new" : "",
              checks.passed() ? "ok" : "fail");
}

// --- server ---------------------------------------------------------------------------------

constexpr uint64_t kRequests = 20'000;
constexpr uint64_t kMinBlocks = 300;
constexpr uint64_t kMaxBlocks = 3000;
constexpr size_t kMinBytes = 16;
constexpr size_t kMaxBytes = 2048;
constexpr size_t kIndexEntries = 32;
constexpr unsigned kLookups = 64;

// Everything one request builds. In the heap releases it is made with new while the request's
// heap is the default, so it and all its containers' memory are in that heap.
struct RequestData {
  std::vector<workload::StampedBlock> blocks;
  std::vector<std::string> words;
  std::vector<uint32_t> numbers;
  std::map<uint32_t, std::string> index;
};

// Builds a request's data, reads it back and returns what it read (the digest's share).
uint64_t handle(RequestData& data, Backend::Heap* heap, workload::Rng& rng, uint64_t thread,
                uint64_t& serial, workload::CheckCounter& checks) {
  const uint64_t count = rng.between(kMinBlocks, kMaxBlocks);
  data.blocks.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const size_t bytes = rng.log_between(kMinBytes, kMaxBytes);
    void* block = heap ? Backend::allocate(heap, bytes) : std::malloc(bytes);
    if (block == nullptr) std::abort();
    const uint64_t tag = workload::block_tag(thread, ++serial);
    workload::stamp(block, bytes, tag);
    data.blocks.push_back({block, bytes, tag});
  }
  // Strings past any small-string buffer, and a vector that grows by pushes (so reallocates).
  for (uint64_t i = 0; i < count / 16; ++i) {
    std::string word(rng.between(24, 160), char('a' + i % 26));
    word += std::to_string(rng.next());
    data.words.push_back(std::move(word));
  }
  for (uint64_t i = 0; i < count; ++i) data.numbers.push_back(uint32_t(rng.next()));
  for (size_t i = 0; i < kIndexEntries && !data.words.empty(); ++i)
    data.index.emplace(uint32_t(rng.below(4 * kIndexEntries)),
                       data.words[rng.below(data.words.size())]);

  uint64_t digest = 0;
  for (const workload::StampedBlock& block : data.blocks) {
    checks.expect(workload::stamp_intact(block.ptr, block.bytes, block.tag), "request_heap stamp");
    digest += block.bytes;
  }
  for (const std::string& word : data.words) digest += word.size() + uint8_t(word.back());
  for (uint32_t number : data.numbers) digest += number & 0xff;
  for (unsigned i = 0; i < kLookups; ++i) {
    const auto found = data.index.find(uint32_t(rng.below(4 * kIndexEntries)));
    if (found != data.index.end()) digest += found->second.size();
  }
  return digest;
}

struct ThreadTotals {
  uint64_t digest = 0;
  uint64_t blocks = 0;
};

void serve(Release release, uint64_t requests, unsigned thread, ThreadTotals& totals,
           workload::CheckCounter& checks) {
  workload::Rng rng(0x5eed0000 + thread);
  uint64_t serial = 0;
  Backend::Heap* kept = release == Release::reset ? Backend::create() : nullptr;
  if (release == Release::reset && kept == nullptr) std::abort();
  for (uint64_t r = 0; r < requests; ++r) {
    if (release == Release::free) {
      auto* data = new RequestData;
      totals.digest += handle(*data, nullptr, rng, thread, serial, checks);
      totals.blocks += data->blocks.size();
      for (const workload::StampedBlock& block : data->blocks) std::free(block.ptr);
      delete data;
      continue;
    }
    Backend::Heap* heap = release == Release::reset ? kept : Backend::create();
    if (heap == nullptr) std::abort();
    Backend::Heap* previous = Backend::set_default(heap);
    auto* data = new RequestData;  // in the heap, and never deleted: the release takes it
    totals.digest += handle(*data, heap, rng, thread, serial, checks);
    totals.blocks += data->blocks.size();
    Backend::set_default(previous);
    if (release == Release::reset) {
      kept = Backend::reset(kept);
      if (kept == nullptr) std::abort();
    } else {
      Backend::destroy(heap);
    }
  }
  if (kept != nullptr) Backend::destroy(kept);
}

int run_server(const workload::Options& options, const Settings& settings) {
  const unsigned threads = options.threads;
  const uint64_t per_thread = std::max<uint64_t>(1, options.scaled(kRequests) / threads);
  std::vector<ThreadTotals> totals(threads);
  workload::CheckCounter checks;
  const workload::Stopwatch stopwatch;
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back(serve, settings.release, per_thread, t, std::ref(totals[t]),
                         std::ref(checks));
  for (std::thread& worker : workers) worker.join();
  const double seconds = stopwatch.seconds();

  uint64_t digest = 0, blocks = 0;
  for (const ThreadTotals& total : totals) digest += total.digest, blocks += total.blocks;
  const uint64_t requests = per_thread * threads;
  char extra[256];
  std::snprintf(extra, sizeof extra,
                " mode=server release=%s requests_per_s=%.0f blocks=%llu digest=%016llx",
                kReleaseNames[size_t(settings.release)].data(), double(requests) / seconds,
                static_cast<unsigned long long>(blocks), static_cast<unsigned long long>(digest));
  print_result(threads, requests, seconds, settings.release == Release::reset, checks, extra);
  return checks.passed() ? 0 : 1;
}

// --- bulk -----------------------------------------------------------------------------------

constexpr size_t kBulkMinBytes = 16;
constexpr size_t kBulkMaxBytes = 512;

// Allocates the blocks (sizes fixed by the seed) into a new heap and stamps each one.
Backend::Heap* fill(std::vector<workload::StampedBlock>& blocks) {
  Backend::Heap* heap = Backend::create();
  if (heap == nullptr) std::abort();
  workload::Rng rng(0xb01c);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const size_t bytes = rng.between(kBulkMinBytes, kBulkMaxBytes);
    void* block = Backend::allocate(heap, bytes);
    if (block == nullptr) std::abort();
    blocks[i] = {block, bytes, workload::block_tag(0, i + 1)};
    workload::stamp(block, bytes, blocks[i].tag);
  }
  return heap;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

int run_bulk(const workload::Options& options, const Settings& settings) {
  const uint64_t count = options.scaled(settings.blocks, 1000);
  std::vector<workload::StampedBlock> blocks(count);
  std::vector<double> ns[3];
  workload::CheckCounter checks;
  const workload::Stopwatch stopwatch;
  for (unsigned round = 0; round < settings.rounds; ++round) {
    for (unsigned step = 0; step < 3; ++step) {
      // Each round starts with another method, so none always follows the same one.
      const auto method = Release((round + step) % 3);
      Backend::Heap* heap = fill(blocks);
      for (const workload::StampedBlock& block : blocks)
        checks.expect(workload::stamp_intact(block.ptr, block.bytes, block.tag), "bulk stamp");
      const auto start = std::chrono::steady_clock::now();
      if (method == Release::free) {
        for (const workload::StampedBlock& block : blocks) Backend::release(block.ptr);
      } else if (method == Release::reset) {
        heap = Backend::reset(heap);
      } else {
        Backend::destroy(heap);
        heap = nullptr;
      }
      const auto stop = std::chrono::steady_clock::now();
      ns[size_t(method)].push_back(std::chrono::duration<double, std::nano>(stop - start).count());
      if (heap != nullptr) Backend::destroy(heap);  // empty by now; not timed
    }
  }
  const double seconds = stopwatch.seconds();
  const double free_ns = median(ns[0]), reset_ns = median(ns[1]), destroy_ns = median(ns[2]);
  char extra[384];
  std::snprintf(extra, sizeof extra,
                " mode=bulk blocks=%llu rounds=%u free_ns=%.0f reset_ns=%.0f destroy_ns=%.0f "
                "free_per_block_ns=%.2f free_over_reset=%.1f free_over_destroy=%.1f",
                static_cast<unsigned long long>(count), settings.rounds, free_ns, reset_ns,
                destroy_ns, free_ns / double(count), free_ns / std::max(reset_ns, 1.0),
                free_ns / std::max(destroy_ns, 1.0));
  print_result(1, count * 3 * settings.rounds, seconds, true, checks, extra);
  return checks.passed() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool describe = argc == 2 && std::string_view(argv[1]) == "--describe";
  const Settings settings = describe ? Settings{} : take_own_flags(argc, argv);
  const workload::Options options = workload::parse_options(argc, argv, {Backend::kWorkload, 2});
  return settings.bulk ? run_bulk(options, settings) : run_server(options, settings);
}
