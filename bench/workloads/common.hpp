// What every workload shares: its command line, a seeded RNG, a timer, RSS readings, the
// stamps that let it check its own blocks, and the one RESULT line tools/bench-compare parses:
//
//   RESULT workload=NAME malloc=LIB threads=T ops=N seconds=S peak_rss_kb=K [key=value...]
//          check=ok|fail                                                     (on one line)
//
// Command line (every workload): --scale X multiplies the amount of work (1 = the full run);
// --threads N sets the thread count of the multi-threaded ones (a single-threaded one refuses
// it); --expect-malloc LIB makes the program refuse to run unless LIB is the malloc in use, so
// a preload that silently did not happen cannot pass for the allocator it named. LIB is a
// name (traymalloc, glibc, jemalloc, mimalloc, tcmalloc) or, for any other allocator, the
// path of the library that must define malloc. --describe
// (alone) prints what the workload declares about itself and exits, one line:
//
//   DESCRIBE workload=NAME threads=yes|no default_threads=T [missing=WHAT]
//
// tools/bench-compare asks every workload this before running it, runs a threaded one once per
// thread count of its --threads list, and skips, saying so, one that names what it is missing
// (ruby_stress without ruby).
#pragma once

#include <dlfcn.h>
#include <limits.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace workload {

// What a workload declares about itself, in its main: its name, if it runs threads of its own
// that --threads sets, how many by default (0: single-threaded), and, for one that runs another
// program, what of it this machine lacks (a word, e.g. "ruby"; nullptr: nothing).
struct Declaration {
  const char* name;
  unsigned default_threads;
  const char* (*missing)() = nullptr;
};

struct Options {
  double scale = 1.0;
  unsigned threads = 1;  // --threads, or the declared default (1 for a single-threaded one)
  std::string expect_malloc;

  // `count` scaled for this run, never below `floor` so tiny scales still exercise the pattern.
  uint64_t scaled(uint64_t count, uint64_t floor = 1) const {
    return std::max<uint64_t>(floor, static_cast<uint64_t>(std::llround(count * scale)));
  }
};

// Names the malloc that is actually in use by looking for a symbol only that library exports.
inline const char* malloc_library_name() {
  struct Probe {
    const char* symbol;
    const char* name;
  };
  static constexpr Probe probes[] = {{"tray_malloc", "traymalloc"}, {"mallctl", "jemalloc"},
                                     {"mi_malloc", "mimalloc"},     {"tc_malloc", "tcmalloc"}};
  for (const Probe& probe : probes)
    if (dlsym(RTLD_DEFAULT, probe.symbol) != nullptr) return probe.name;
  return "glibc";
}

// Whether malloc, as the program's calls resolve it, is defined in the library at `path`.
inline bool malloc_defined_in(const char* path) {
  Dl_info info{};
  void* symbol = dlsym(RTLD_DEFAULT, "malloc");
  if (symbol == nullptr || dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return false;
  char defining[PATH_MAX], wanted[PATH_MAX];
  return realpath(info.dli_fname, defining) != nullptr && realpath(path, wanted) != nullptr &&
         std::strcmp(defining, wanted) == 0;
}

template <typename Number>
bool parse_number(const char* text, Number& out) {
  const char* end = text + std::strlen(text);
  const auto [stop, error] = std::from_chars(text, end, out);
  return error == std::errc{} && stop == end;
}

[[noreturn]] inline void usage_error(const char* program, const Declaration& declaration) {
  std::fprintf(stderr, "usage: %s [--scale X>0]%s [--expect-malloc LIB] | --describe\n", program,
               declaration.default_threads ? " [--threads N>0]" : "");
  std::exit(2);
}

inline Options parse_options(int argc, char** argv, const Declaration& declaration) {
  if (argc == 2 && std::string_view(argv[1]) == "--describe") {
    const char* missing = declaration.missing != nullptr ? declaration.missing() : nullptr;
    std::printf("DESCRIBE workload=%s threads=%s default_threads=%u%s%s\n", declaration.name,
                declaration.default_threads ? "yes" : "no",
                std::max(1u, declaration.default_threads), missing ? " missing=" : "",
                missing ? missing : "");
    std::exit(0);
  }
  Options options;
  options.threads = std::max(1u, declaration.default_threads);
  for (int i = 1; i < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) usage_error(argv[0], declaration);
    const char* value = argv[i + 1];
    bool valid = true;
    if (flag == "--scale") {
      valid = parse_number(value, options.scale) && options.scale > 0;
    } else if (flag == "--threads" && declaration.default_threads > 0) {
      valid = parse_number(value, options.threads) && options.threads > 0;
    } else if (flag == "--expect-malloc") {
      options.expect_malloc = value;
    } else {
      valid = false;
    }
    if (!valid) usage_error(argv[0], declaration);
  }
  const std::string& expected = options.expect_malloc;
  const bool by_path = expected.find('/') != std::string::npos;
  if (!expected.empty() && (by_path ? !malloc_defined_in(expected.c_str())
                                    : expected != malloc_library_name())) {
    std::fprintf(stderr, "%s: expected malloc %s but %s is in use\n", argv[0],
                 options.expect_malloc.c_str(), malloc_library_name());
    std::exit(3);
  }
  return options;
}

// SplitMix64: seeded per thread so every allocator sees the same request sequence.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t bound) { return next() % bound; }
  uint64_t between(uint64_t low, uint64_t high) { return low + below(high - low + 1); }
  // Log-uniform in [low, high]: as many blocks per doubling of size, as real programs tend to have.
  uint64_t log_between(uint64_t low, uint64_t high) {
    const double unit = static_cast<double>(next() >> 11) / 9007199254740992.0;
    const double size = static_cast<double>(low) * std::pow(double(high) / double(low), unit);
    return std::clamp<uint64_t>(static_cast<uint64_t>(size), low, high);
  }

 private:
  uint64_t state_;
};

class Stopwatch {
 public:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The high-water mark of this process's own memory map (VmHWM). Not getrusage's ru_maxrss:
// Linux carries that over exec, so it would include the RSS of whatever forked this program.
inline long peak_rss_kb() {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, status))
    if (std::sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  std::fclose(status);
  return kb;
}

// A block a workload owns, with the tag its stamp was made from.
struct StampedBlock {
  void* ptr;
  size_t bytes;
  uint64_t tag;
};

// --- block stamps --------------------------------------------------------------------------
// A block gets its tag in its first 8 bytes, a derived word at every 4 KiB step (so each page
// of a large block is written, hence resident, and a page lost by realloc is noticed) and the
// tag's complement in its last 8 bytes. Blocks under 16 bytes get only the leading bytes.

inline constexpr size_t kStampStrideBytes = 4096;

inline uint64_t page_stamp(uint64_t tag, size_t offset) {
  return tag + (offset / kStampStrideBytes) * 0x9E3779B97F4A7C15ULL;
}

inline void stamp(void* block, size_t bytes, uint64_t tag) {
  auto* base = static_cast<unsigned char*>(block);
  if (bytes < 16) {
    std::memcpy(base, &tag, std::min<size_t>(bytes, sizeof tag));
    return;
  }
  std::memcpy(base, &tag, sizeof tag);
  for (size_t offset = kStampStrideBytes; offset + 16 <= bytes; offset += kStampStrideBytes) {
    const uint64_t word = page_stamp(tag, offset);
    std::memcpy(base + offset, &word, sizeof word);
  }
  const uint64_t tail = ~tag;
  std::memcpy(base + bytes - sizeof tail, &tail, sizeof tail);
}

inline bool stamp_intact(const void* block, size_t bytes, uint64_t tag) {
  const auto* base = static_cast<const unsigned char*>(block);
  if (bytes < 16) return std::memcmp(base, &tag, std::min<size_t>(bytes, sizeof tag)) == 0;
  uint64_t word = 0;
  std::memcpy(&word, base, sizeof word);
  if (word != tag) return false;
  for (size_t offset = kStampStrideBytes; offset + 16 <= bytes; offset += kStampStrideBytes) {
    std::memcpy(&word, base + offset, sizeof word);
    if (word != page_stamp(tag, offset)) return false;
  }
  std::memcpy(&word, base + bytes - sizeof word, sizeof word);
  return word == ~tag;
}

// A tag that differs between blocks and threads and is never zero (zeroed memory never passes).
inline uint64_t block_tag(uint64_t thread, uint64_t serial) {
  return (((thread << 48) ^ serial) * 0xD6E8FEB86659FD93ULL) | 1;
}

// --- self-check and result -----------------------------------------------------------------

// Counts failed checks from any thread; the result line turns a non-zero count into check=fail.
class CheckCounter {
 public:
  void expect(bool ok, const char* what) {
    if (ok) return;
    if (failures_.fetch_add(1, std::memory_order_relaxed) < 10)
      std::fprintf(stderr, "check failed: %s\n", what);
  }
  bool passed() const { return failures_.load(std::memory_order_relaxed) == 0; }
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> failures_{0};
};

// Prints the RESULT line with a peak RSS measured elsewhere (a workload whose work runs in a
// child process) and returns main's status; extra is appended as is: " key=value ...".
inline int report_with_rss(const char* name, unsigned threads, uint64_t ops, double seconds,
                           long rss_kb, const CheckCounter& checks, const std::string& extra = {}) {
  std::printf("RESULT workload=%s malloc=%s threads=%u ops=%llu seconds=%.6f peak_rss_kb=%ld%s "
              "check=%s\n",
              name, malloc_library_name(), threads, static_cast<unsigned long long>(ops), seconds,
              rss_kb, extra.c_str(), checks.passed() ? "ok" : "fail");
  if (!checks.passed())
    std::fprintf(stderr, "%s: %llu failed checks\n", name,
                 static_cast<unsigned long long>(checks.failures()));
  return checks.passed() ? 0 : 1;
}

// Prints the RESULT line (extra is appended as is: " key=value ...") and returns main's status.
inline int report(const char* name, unsigned threads, uint64_t ops, double seconds,
                  const CheckCounter& checks, const std::string& extra = {}) {
  return report_with_rss(name, threads, ops, seconds, peak_rss_kb(), checks, extra);
}

// Zeroes a block and adds 1 to each of its bytes `writes` times, each a real load and store to
// its cache line (volatile), as the false-sharing workloads do; whether every byte then holds
// `writes` (mod 256).
inline bool write_hard(void* block, size_t bytes, unsigned writes) {
  auto* object = static_cast<unsigned char*>(block);
  std::memset(object, 0, bytes);
  volatile unsigned char* cells = object;
  for (unsigned write = 0; write < writes; ++write)
    for (size_t b = 0; b < bytes; ++b) cells[b] = static_cast<unsigned char>(cells[b] + 1);
  bool intact = true;
  for (size_t b = 0; b < bytes; ++b) intact &= object[b] == static_cast<unsigned char>(writes);
  return intact;
}

// A block from malloc, stamped with `tag`.
inline StampedBlock allocate_stamped(size_t bytes, uint64_t tag) {
  StampedBlock block{std::malloc(bytes), bytes, tag};
  stamp(block.ptr, block.bytes, tag);
  return block;
}

// Checks a held block's stamp (`what` names the check), frees it and empties the slot.
inline void free_stamped(StampedBlock& block, CheckCounter& checks, const char* what) {
  if (block.ptr == nullptr) return;
  checks.expect(stamp_intact(block.ptr, block.bytes, block.tag), what);
  std::free(block.ptr);
  block.ptr = nullptr;
}

}  // namespace workload
